"""The PPO learner's whole state — policy, Adam, observation and return statistics — as flat arrays.

`state()` / `load_state()` give exactly the tensors a checkpoint needs to continue bit-exactly;
the policy subset (`policy_keys`) is what an env worker needs to act.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from rl_core.config import PPOConfig
from rl_core.policies.mlp import ActorCritic
from rl_core.policies.normalizer import Moments, ObservationNormalizer

POLICY_PREFIXES = ("model.", "obs_norm.", "return_norm.")
TRAINER_THREADS = 1
"""torch threads of a process that trains a learner (a trainer rank, the in-process loop): ranks share the
machine's cores, and the tiny MLP gains nothing from more. Kernels for the ranks' hot ops (the PPO loss) are tuned
at this thread count, since winners are looked up by it; eager autograd's sums depend on it too."""


class PPOLearner:
    """Actor-critic, Adam and running statistics, seeded so equal seeds give equal initial weights."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: PPOConfig, seed: int) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.model = ActorCritic(obs_dim, act_dim, cfg.hidden, cfg.log_std_init)
        self._optimizer: torch.optim.Adam | None = None
        self.obs_norm = ObservationNormalizer(obs_dim)
        self.return_norm = ObservationNormalizer(1)  # variance of discounted returns, for reward scaling

    @property
    def optimizer(self) -> torch.optim.Adam:
        """Adam over the model's parameters, created on first use: creating a torch optimizer imports
        `torch._dynamo` (~2 s of CPU and ~70 MB per process here), which acting-only processes such as env
        workers and evaluation never need. Its state holds nothing before the first step, so when it is
        created does not change any result."""
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam(self.model.parameters(), lr=self.cfg.learning_rate, eps=1e-5,
                                               fused=True)
        return self._optimizer

    def reward_scale(self) -> float:
        """1/std of discounted returns (gymnasium's NormalizeReward), 1 before data or when disabled."""
        m = self.return_norm.moments
        if not self.cfg.scale_rewards or m.count < 2:
            return 1.0
        return float(1.0 / np.sqrt(m.m2[0] / m.count + 1e-8))

    def update_statistics(self, obs: Moments, returns: Moments) -> None:
        """Fold a rollout's raw-observation and discounted-return moments in (after its update)."""
        self.obs_norm.update(obs)
        self.return_norm.update(returns)

    def state(self) -> dict[str, np.ndarray]:
        """Every tensor of the learner, keyed by a stable dotted name, as owned numpy copies."""
        out = {f"model.{k}": v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        optimizer_slots = self._optimizer.state_dict()["state"] if self._optimizer is not None else {}
        for idx, slots in optimizer_slots.items():
            for key, value in slots.items():
                out[f"optim.{idx}.{key}"] = value.detach().numpy().copy()
        out.update({f"obs_norm.{k}": v for k, v in self.obs_norm.state().items()})
        out.update({f"return_norm.{k}": v for k, v in self.return_norm.state().items()})
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore from `state()` (extra keys, e.g. env state, are ignored)."""
        self.load_policy(state)
        slots: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in state.items():
            if key.startswith("optim."):
                _, idx, name = key.split(".", 2)
                slots.setdefault(int(idx), {})[name] = torch.from_numpy(value.copy())
        optim_state = self.optimizer.state_dict()
        optim_state["state"] = slots
        self.optimizer.load_state_dict(optim_state)

    def load_policy(self, state: dict[str, np.ndarray]) -> None:
        """Restore only what acting needs: weights and statistics."""
        self.model.load_state_dict({k[6:]: torch.from_numpy(v.copy()) for k, v in state.items() if k.startswith("model.")})
        self.obs_norm.load_state({k[9:]: v for k, v in state.items() if k.startswith("obs_norm.")})
        self.return_norm.load_state({k[12:]: v for k, v in state.items() if k.startswith("return_norm.")})


def policy_subset(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The entries of a learner state an env worker needs."""
    return {k: v for k, v in state.items() if k.startswith(POLICY_PREFIXES)}


def policy_sha256(state: dict[str, np.ndarray]) -> str:
    """Hash of the policy parameters' bytes in name order: equal hashes mean bit-identical weights."""
    digest = hashlib.sha256()
    for name in sorted(k for k in state if k.startswith("model.")):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(state[name]).tobytes())
    return digest.hexdigest()
