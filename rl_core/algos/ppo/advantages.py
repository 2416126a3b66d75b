"""Score a rollout: scaled rewards, time-limit bootstrap, then GAE through the tuned kernel.

Experience from several workers is joined along the env axis; the result is flattened to the
(steps * envs) samples the PPO update draws minibatches from.
"""
from __future__ import annotations

import numpy as np
import torch

import gymflow_kernels as kernels
from rl_core.algos.ppo.batches import Experience, ScoredBatch
from rl_core.policies.normalizer import Moments

_gae = kernels.dispatch("gae")  # the tuned winner for each call's shape, or the reference


def score_experience(parts: list[Experience], reward_scale: float, gamma: float, lam: float) -> ScoredBatch:
    """GAE advantages and returns for the joined rollouts `parts` (each (T, N_w, ...)), flattened to (T*N, ...)."""
    def joined(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts], axis=1)

    next_value = np.concatenate([p.next_value for p in parts])
    # A truncated episode did not end: fold the critic's value of its final state into the last reward.
    rewards = joined("rewards") * np.float32(reward_scale) + np.float32(gamma) * joined("trunc_values")
    values = joined("values")
    advantages, returns = _gae(
        torch.from_numpy(rewards), torch.from_numpy(values), torch.from_numpy(joined("dones")),
        torch.from_numpy(next_value), gamma, lam,
    )

    def flat(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.reshape(-1, *x.shape[2:]))

    return ScoredBatch(
        obs=flat(joined("obs")), actions=flat(joined("actions")), logprobs=flat(joined("logprobs")),
        values=flat(values), advantages=flat(advantages.numpy()), returns=flat(returns.numpy()),
        obs_moments=_merged([p.obs_moments for p in parts]), ret_moments=_merged([p.ret_moments for p in parts]),
    )


def _merged(moments: list[Moments]) -> Moments:
    """Per-worker moments merged in worker order (order-independent math)."""
    total = Moments(0.0, np.zeros_like(moments[0].mean), np.zeros_like(moments[0].m2))
    for m in moments:
        total = total.merge(m)
    return total
