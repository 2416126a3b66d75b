"""The fields of the control batches, defined once: what collection writes, scoring reads and writes, and the
update reads. Producers and consumers exchange these dataclasses; `to_arrays` / `from_arrays` are their only
translation to the named arrays that travel through the store (safetensors), so no field name is spelled twice.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from rl_core.algos.base import Tensors
from rl_core.policies.normalizer import Moments

ENV_STATE_PREFIX = "env."
"""Checkpoint keys of per-env state (physics, episode counters, the algorithm's carry) start with this."""

_B = TypeVar("_B", bound="_Arrays")


class _Arrays:
    """Dataclass fields as named arrays; a `Moments` field becomes `<field>.count`, `.mean`, `.m2`."""

    def to_arrays(self) -> Tensors:
        out: Tensors = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Moments):
                out.update({f"{f.name}.count": np.array(value.count), f"{f.name}.mean": value.mean,
                            f"{f.name}.m2": value.m2})
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_arrays(cls: type[_B], arrays: Tensors) -> _B:
        """The batch from named arrays (keys it does not know, e.g. env state, are ignored)."""
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.type in ("Moments", Moments):
                values[f.name] = Moments(float(arrays[f"{f.name}.count"]), arrays[f"{f.name}.mean"],
                                         arrays[f"{f.name}.m2"])
            else:
                values[f.name] = arrays[f.name]
        return cls(**values)


@dataclass
class Experience(_Arrays):
    """One worker's rollout: T steps of its N envs (float32 unless noted)."""

    obs: np.ndarray  # (T, N, obs_dim) normalized observations the policy saw
    actions: np.ndarray  # (T, N, act_dim) sampled (unclipped) actions
    logprobs: np.ndarray  # (T, N) behaviour log-probs
    values: np.ndarray  # (T, N) behaviour value estimates
    rewards: np.ndarray  # (T, N) raw rewards
    dones: np.ndarray  # (T, N) 1 where an episode ended at this step (terminated or truncated)
    trunc_values: np.ndarray  # (T, N) the critic's value of a truncated episode's final state, else 0
    next_value: np.ndarray  # (N,) the critic's value of the state after the last step
    obs_moments: Moments  # of the raw observations seen (float64)
    ret_moments: Moments  # of the running discounted returns (float64), for reward scaling


@dataclass
class ScoredBatch(_Arrays):
    """All workers' rollouts joined along the env axis and flattened to B = T * N samples."""

    obs: np.ndarray  # (B, obs_dim)
    actions: np.ndarray  # (B, act_dim)
    logprobs: np.ndarray  # (B,)
    values: np.ndarray  # (B,)
    advantages: np.ndarray  # (B,) GAE
    returns: np.ndarray  # (B,) GAE returns, the value targets
    obs_moments: Moments  # merged over workers, folded into the normalizer after the update
    ret_moments: Moments
