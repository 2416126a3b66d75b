"""Score a rollout: scaled rewards, time-limit bootstrap, then GAE through the tuned kernel.

Experience from several workers is joined along the env axis; the result is flattened to the
(steps * envs) samples the PPO update draws minibatches from.
"""
from __future__ import annotations

import numpy as np
import torch

import kernels
from rl_core.policies.normalizer import Moments

SCORED_KEYS = ("obs", "actions", "logprobs", "values", "advantages", "returns")
MOMENT_KEYS = ("obs_moments", "ret_moments")
_gae = kernels.dispatch("gae")  # the tuned winner for each call's shape, or the reference


def score_experience(parts: list[dict[str, np.ndarray]], reward_scale: float, gamma: float, lam: float) -> dict[str, np.ndarray]:
    """GAE advantages and returns for the joined rollouts `parts` (each (T, N_w, ...)), flattened to (T*N, ...)."""
    joined = {k: np.concatenate([p[k] for p in parts], axis=1) for k in
              ("obs", "actions", "logprobs", "values", "rewards", "dones", "trunc_values")}
    next_value = np.concatenate([p["next_value"] for p in parts])
    # A truncated episode did not end: fold the critic's value of its final state into the last reward.
    rewards = joined["rewards"] * np.float32(reward_scale) + np.float32(gamma) * joined["trunc_values"]
    advantages, returns = _gae(
        torch.from_numpy(rewards), torch.from_numpy(joined["values"]), torch.from_numpy(joined["dones"]),
        torch.from_numpy(next_value), gamma, lam,
    )
    flat = lambda x: np.ascontiguousarray(x.reshape(-1, *x.shape[2:]))  # noqa: E731
    out = {k: flat(joined[k]) for k in ("obs", "actions", "logprobs", "values")}
    out["advantages"] = flat(advantages.numpy())
    out["returns"] = flat(returns.numpy())
    out.update(_merged_moments(parts))
    return out


def _merged_moments(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-worker moments of raw observations and discounted returns, merged (order-independent math)."""
    out: dict[str, np.ndarray] = {}
    for name in MOMENT_KEYS:
        total = Moments(0.0, np.zeros_like(parts[0][f"{name}.mean"]), np.zeros_like(parts[0][f"{name}.m2"]))
        for p in parts:
            total = total.merge(Moments(float(p[f"{name}.count"]), p[f"{name}.mean"], p[f"{name}.m2"]))
        out.update({f"{name}.count": np.array(total.count), f"{name}.mean": total.mean, f"{name}.m2": total.m2})
    return out
