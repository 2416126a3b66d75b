"""Running mean/variance of observations (float64), merged from per-batch moments.

The policy acts with the statistics frozen for a whole rollout; the statistics are updated from the
rollout's raw observations after training, so the stored normalized observations, the behaviour
log-probs and the PPO update all see the same inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Moments:
    """count, mean and sum of squared deviations (M2) of a set of vectors."""

    count: float
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray) -> "Moments":
        """Moments of the rows of `x` (float64)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1])
        mean = x.mean(axis=0)
        return cls(float(x.shape[0]), mean, ((x - mean) ** 2).sum(axis=0))

    def merge(self, other: "Moments") -> "Moments":
        """Chan et al.'s parallel combination: exact for any split of the data."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / count)
        return Moments(count, mean, m2)


class ObservationNormalizer:
    """(obs - mean) / sqrt(var + eps), clipped, with statistics that only change via `update`."""

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.moments = Moments(0.0, np.zeros(dim), np.zeros(dim))
        self.clip = clip
        self.eps = eps

    def update(self, batch: Moments) -> None:
        """Fold in the moments of newly seen raw observations."""
        self.moments = self.moments.merge(batch)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """float32 normalized observation; identity scale before any data was seen."""
        m = self.moments
        var = m.m2 / m.count if m.count > 1 else np.ones_like(m.mean)
        out = (np.asarray(obs, dtype=np.float64) - m.mean) / np.sqrt(var + self.eps)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        """Tensors to checkpoint."""
        m = self.moments
        return {"count": np.array(m.count), "mean": m.mean.copy(), "m2": m.m2.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore from `state()`."""
        self.moments = Moments(float(state["count"]), state["mean"].copy(), state["m2"].copy())
