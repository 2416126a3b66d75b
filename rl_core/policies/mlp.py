"""MLP actor-critic with a state-independent log-std (the PPO paper's continuous-control policy)."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

import gymflow_kernels as kernels

_POLICY_FORWARD = kernels.dispatch("policy_mlp_forward")


def _layer(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    """Orthogonal weights and zero bias: keeps early activations well scaled (Engstrom et al., 2020)."""
    layer = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_layer(in_dim, width, math.sqrt(2)), nn.Tanh()]
        in_dim = width
    layers.append(_layer(in_dim, out_dim, out_gain))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs; the actor's last layer starts tiny so initial actions are near 0."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...] = (64, 64), log_std_init: float = 0.0):
        super().__init__()
        self.actor = _mlp(obs_dim, hidden, act_dim, out_gain=0.01)
        self.critic = _mlp(obs_dim, hidden, 1, out_gain=1.0)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
        # Gathered once (loading a state copies into these same tensors): the actor's linear layers' weights and
        # biases, the critic's, then log_std. The order of the flat gradient and of the fused kernels' arguments.
        linears = [layer for mlp in (self.actor, self.critic) for layer in mlp if isinstance(layer, nn.Linear)]
        self.ordered_parameters = (*(p for layer in linears for p in (layer.weight, layer.bias)), self.log_std)
        self._forward_params = self.ordered_parameters[:-1]

    @property
    def fused_gradient_shape(self) -> bool:
        """Whether both MLPs have two hidden layers: the shape `policy_mlp_forward` and `ppo_grad` take."""
        return len(self._forward_params) == 12

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """(B,) state values."""
        return self.critic(obs).squeeze(-1)

    def mean_and_value_fn(self, example: torch.Tensor) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """A function of obs giving (B, A) action means and (B,) values in one call, for calls shaped like
        `example` (a rollout's steps): the tuned `policy_mlp_forward` kernel when both MLPs have its shape (two hidden
        layers), which saves most of the per-layer dispatch cost at rollout batch sizes, looked up once
        (`kernels.Dispatcher.resolve`), not at every call; layer by layer otherwise."""
        if not self.fused_gradient_shape:
            return lambda obs: (self.actor(obs), self.value(obs))
        forward, params = _POLICY_FORWARD.resolve(example, *self._forward_params), self._forward_params
        return lambda obs: forward(obs, *params)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Normal:
        """Diagonal Gaussian over actions."""
        mean = self.actor(obs)
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean), validate_args=False)

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action, used for evaluation."""
        return self.actor(obs)
