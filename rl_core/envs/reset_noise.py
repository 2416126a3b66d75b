"""The two reset distributions gymnasium's v5 MuJoCo tasks use, as `ResetFn`s (same draw order, same numbers)."""
from __future__ import annotations

import numpy as np

from rl_core.envs.task import ResetFn


def uniform_reset(scale: float) -> ResetFn:
    """qpos + U(-scale, scale), then qvel + U(-scale, scale): Hopper, Walker2d, Humanoid, Swimmer, InvertedPendulum."""

    def reset(init_qpos: np.ndarray, init_qvel: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        qpos = init_qpos + rng.uniform(low=-scale, high=scale, size=init_qpos.shape)
        qvel = init_qvel + rng.uniform(low=-scale, high=scale, size=init_qvel.shape)
        return qpos, qvel

    return reset


def uniform_normal_reset(scale: float) -> ResetFn:
    """qpos + U(-scale, scale), then qvel + scale * N(0, 1): HalfCheetah, Ant."""

    def reset(init_qpos: np.ndarray, init_qvel: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        qpos = init_qpos + rng.uniform(low=-scale, high=scale, size=init_qpos.shape)
        qvel = init_qvel + scale * rng.standard_normal(init_qvel.shape)
        return qpos, qvel

    return reset
