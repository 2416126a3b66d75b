"""PPO's minibatch gradient: actor-critic forward, Gaussian log-prob and entropy, clipped loss, and the backward pass
to every parameter, as one tunable op.

Every implementation has the signature
    ppo_grad(obs[B, D], actions[B, A], old_logprob[B], advantages[B], old_value[B], returns[B],
             aw1, ab1, aw2, ab2, aw3, ab3, cw1, cb1, cw2, cb2, cw3, cb3, log_std[A],
             clip_coef, vf_coef, ent_coef, clip_vloss)
        -> (stats[6]: loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction;  grad[P])
with the parameters in `ActorCritic.ordered_parameters` order (two tanh MLPs of two hidden layers in nn.Linear's layout,
then the state-independent log-std) and `grad` their gradients flattened in that order, which is the vector the
ranks all-reduce. Why an op of its own: at PPO's minibatch sizes a gradient step through eager autograd is some sixty
small ops, and on a CPU their dispatch and torch's slow tanh (several times sigmoid's cost on the builds measured)
outweigh the arithmetic; one pass in C++ does the same sums.
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch
from torch import Tensor

from gymflow_kernels.compiled import compiled
from gymflow_kernels.inputs import next_pow2, place
from gymflow_kernels.native import F64, I64, PTR, cpp_source, float32_cpu, load_function, parallel_cores
from gymflow_kernels.policy_mlp import make_inputs as mlp_inputs
from gymflow_kernels.policy_mlp import mlp_layout, policy_mlp_reference
from gymflow_kernels.ppo_loss import loss_and_grads, ppo_loss_reference
from gymflow_kernels.registry import Op, candidate, register

NUM_PARAMS = 13
"""Tensors of the actor-critic: 6 per MLP, then log_std."""


def ppo_grad_reference(
    obs: Tensor, actions: Tensor, old_logprob: Tensor, advantages: Tensor, old_value: Tensor, returns: Tensor,
    *params_and_coefs,
) -> tuple[Tensor, Tensor]:
    """Eager autograd, op for op what `ActorCritic.distribution` / `.value` and the reference PPO loss compute."""
    params, (clip_coef, vf_coef, ent_coef, clip_vloss) = params_and_coefs[:NUM_PARAMS], params_and_coefs[NUM_PARAMS:]
    with torch.enable_grad():
        leaves = [p.detach().requires_grad_(True) for p in params]
        mean, value = policy_mlp_reference(obs, *leaves[:12])
        dist = torch.distributions.Normal(mean, leaves[12].exp().expand_as(mean), validate_args=False)
        logprob = dist.log_prob(actions).sum(-1)
        entropy = dist.entropy().sum(-1)
        loss, *stats = ppo_loss_reference(logprob, old_logprob, advantages, value, old_value, returns, entropy,
                                          clip_coef, vf_coef, ent_coef, clip_vloss)
        grads = torch.autograd.grad(loss, leaves)
    return torch.stack([loss.detach(), *stats]), torch.cat([g.reshape(-1) for g in grads])


def ppo_grad_manual(
    obs: Tensor, actions: Tensor, old_logprob: Tensor, advantages: Tensor, old_value: Tensor, returns: Tensor,
    *params_and_coefs,
) -> tuple[Tensor, Tensor]:
    """The backward pass written out in torch (no graph recorded): fused addmm forward, the loss's closed-form
    gradients, then one matmul per weight gradient. Half the ops of autograd's replay, on any device."""
    params, (clip_coef, vf_coef, ent_coef, clip_vloss) = params_and_coefs[:NUM_PARAMS], params_and_coefs[NUM_PARAMS:]
    with torch.no_grad():
        nets = [_mlp_forward(obs, *params[6 * k : 6 * k + 6]) for k in (0, 1)]
        mean, value = nets[0][-1], nets[1][-1][:, 0]
        scale = params[12].exp()
        log_scale, var = scale.log(), scale**2  # as Normal computes them from the scale
        diff = actions - mean
        logprob = (-(diff * diff) / (2 * var) - log_scale - math.log(math.sqrt(2 * math.pi))).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_scale).expand_as(mean).sum(-1)
        stats, (g_lp, g_v, g_ent) = loss_and_grads(torch, logprob, old_logprob, advantages, value, old_value,
                                                   returns, entropy, clip_coef, vf_coef, ent_coef, clip_vloss)
        g_log_std = (g_lp[:, None] * (diff * diff / var - 1)).sum(0) + g_ent.sum()
        grads = [*_mlp_backward(obs, g_lp[:, None] * diff / var, params[0:6], nets[0]),
                 *_mlp_backward(obs, g_v[:, None], params[6:12], nets[1]), g_log_std]
    return torch.stack([s.float() for s in stats]), torch.cat([g.reshape(-1) for g in grads])  # as the reference's


def _mlp_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, w3: Tensor, b3: Tensor) -> list[Tensor]:
    """Both hidden activations and the output of linear-tanh-linear-tanh-linear."""
    a1 = torch.addmm(b1, x, w1.t()).tanh_()
    a2 = torch.addmm(b2, a1, w2.t()).tanh_()
    return [a1, a2, torch.addmm(b3, a2, w3.t())]


def _mlp_backward(x: Tensor, d_out: Tensor, params: tuple[Tensor, ...], acts: list[Tensor]) -> list[Tensor]:
    """Gradients of w1, b1, w2, b2, w3, b3 from d loss / d output, given `_mlp_forward`'s activations."""
    a1, a2, _ = acts
    d2 = (d_out @ params[4]).mul_(1 - a2 * a2)
    d1 = (d2 @ params[2]).mul_(1 - a1 * a1)
    return [d1.t() @ x, d1.sum(0), d2.t() @ a1, d2.sum(0), d_out.t() @ a2, d_out.sum(0)]


_CPP_SOURCE = cpp_source("ppo_grad.cpp")  # includes mlp_layers.h, ppo_loss.cpp and two_halves.h


@candidate(source=_CPP_SOURCE)
def ppo_grad_cpp(
    obs: Tensor, actions: Tensor, old_logprob: Tensor, advantages: Tensor, old_value: Tensor, returns: Tensor,
    *params_and_coefs,
) -> tuple[Tensor, Tensor]:
    """Forward, loss and backward of both MLPs in one C++ call (built on first use, cached on disk); tanh is the
    rational approximation of the policy forward kernel, whose derivative is taken as 1 - tanh^2 like autograd's.
    Inside `using_cores(2)` the critic runs on a helper thread beside the actor: the same bits, in little more than
    half the time where the second core is free (the two halves are of similar size)."""
    kernel = load_function("ppo_grad", _CPP_SOURCE, "gymflow_ppo_grad",
                           (PTR,) * 8 + (I64,) * 3 + (F64,) * 3 + (I64,) * 2 + (PTR,) * 2)
    params, (clip_coef, vf_coef, ent_coef, clip_vloss) = params_and_coefs[:NUM_PARAMS], params_and_coefs[NUM_PARAMS:]
    x, act, old_lp, adv, old_v, ret, *p = float32_cpu("ppo_grad", obs, actions, old_logprob, advantages, old_value,
                                                      returns, *params)
    B, D = x.shape
    widths, A, size = _layout(B, D, tuple(t.shape for t in (act, old_lp, adv, old_v, ret, *p)))
    stats, grad = torch.empty(6), torch.empty(size)
    kernel(x.data_ptr(), act.data_ptr(), old_lp.data_ptr(), adv.data_ptr(), old_v.data_ptr(), ret.data_ptr(),
           (ctypes.c_void_p * NUM_PARAMS)(*[t.data_ptr() for t in p]), widths, B, D, A, clip_coef, vf_coef,
           ent_coef, int(clip_vloss), parallel_cores(), stats.data_ptr(), grad.data_ptr())
    return stats, grad


@functools.lru_cache(maxsize=64)
def _layout(B: int, D: int, shapes: tuple[torch.Size, ...]) -> tuple[ctypes.Array, int, int]:
    """Hidden widths (as the C array the kernel reads), action count and parameter count, after checking that every
    shape agrees with obs [B, D]: C++ would read out of bounds, not raise."""
    data, params = shapes[:5], shapes[5:]
    if len(params) != NUM_PARAMS:
        raise ValueError(f"ppo_grad takes {NUM_PARAMS} parameters (actor, critic, log_std), found {len(params)}")
    widths, A = mlp_layout(D, params[:12])
    expected = [(B, A), (B,), (B,), (B,), (B,)]
    if [tuple(s) for s in data] != expected or tuple(params[12]) != (A,):
        raise ValueError(f"ppo_grad: data shapes {[tuple(s) for s in data]} and log_std {tuple(params[12])} do not "
                         f"match obs [{B}, {D}] and {A} actions")
    return widths, A, sum(torch.Size(s).numel() for s in params)


def make_inputs(shape: dict, seed: int) -> tuple:
    """A minibatch of B samples for an actor-critic of hidden width H on D observations and A actions. Old
    log-probs are the policy's own minus noise of std "spread" (0: every ratio exactly 1, large: most clipped);
    "scale" multiplies the observations (large: saturated tanh); loss coefficients as in ppo_loss's inputs."""
    B, A = shape["B"], shape["A"]
    obs, *params = mlp_inputs(shape, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    log_std = 0.5 * torch.randn(A, generator=gen) - 0.5
    mean, value = policy_mlp_reference(obs, *params)
    actions = mean + log_std.exp() * torch.randn(B, A, generator=gen)
    logprob = torch.distributions.Normal(mean, log_std.exp()).log_prob(actions).sum(-1)
    old_logprob = logprob - shape.get("spread", 0.2) * torch.randn(B, generator=gen)
    advantages = torch.randn(B, generator=gen)
    returns = value + torch.randn(B, generator=gen)
    old_value = value + 0.3 * torch.randn(B, generator=gen)
    tensors = place(shape, obs, actions, old_logprob, advantages, old_value, returns, *params, log_std)
    return (*tensors, shape.get("clip_coef", 0.2), shape.get("vf_coef", 0.5), shape.get("ent_coef", 0.0),
            shape.get("clip_vloss", False))


def bucket(inputs: tuple) -> dict:
    """Minibatch size rounded up to a power of two; the model's widths exactly."""
    obs, actions, aw1, aw2 = inputs[0], inputs[1], inputs[6], inputs[8]
    if obs.dim() != 2 or actions.dim() != 2:
        raise ValueError(f"ppo_grad expects obs [B, D] and actions [B, A], found {tuple(obs.shape)} and "
                         f"{tuple(actions.shape)}")
    return {"B": next_pow2(obs.shape[0]), "D": obs.shape[1], "H": aw1.shape[0], "H2": aw2.shape[0],
            "A": actions.shape[1]}


EDGE_CASES: tuple[dict, ...] = (
    {"B": 1, "D": 1, "H": 1, "A": 1},
    {"B": 7, "D": 17, "H": 5, "A": 6, "spread": 0.0},  # every ratio exactly 1: each max() of the surrogate a tie
    {"B": 33, "D": 3, "H": 64, "A": 2, "scale": 30.0, "spread": 1.0, "ent_coef": 0.01},  # saturated, much clipped
    {"B": 65, "D": 11, "H": 20, "A": 3, "clip_vloss": True, "clip_coef": 0.1, "vf_coef": 1.0},
    {"B": 257, "D": 376, "H": 64, "A": 17, "ent_coef": 0.001},  # Humanoid's widths
)

PPO_GRAD = register(
    Op(
        name="ppo_grad",
        reference=ppo_grad_reference,
        candidates={"manual": ppo_grad_manual, "cpp": ppo_grad_cpp, "compile": compiled(ppo_grad_manual)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("B", "D", "H", "A"),
        edge_cases=EDGE_CASES,
        default_shapes=({"B": 256, "D": 17, "H": 64, "A": 6},),  # HalfCheetah, minibatch 512 over 2 ranks
        calls_per_run=16_000,  # 16 minibatches x 10 epochs x 100 iterations
    )
)
