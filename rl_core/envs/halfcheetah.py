"""HalfCheetah, exactly as gymnasium's `HalfCheetah-v5` defines it (same MJCF, observation, reward, reset noise).

Observation: qpos[1:] (8) then qvel (9), 17 values; the root x position is excluded so the policy cannot
read absolute progress. Reward: forward velocity of the root minus 0.1 * |action|^2. No termination;
episodes are truncated at 1000 steps. Reset: qpos + U(-0.1, 0.1), qvel + 0.1 * N(0, 1).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs.reset_noise import uniform_normal_reset
from rl_core.envs.task import BatchState, Task

FORWARD_REWARD_WEIGHT = 1.0
CTRL_COST_WEIGHT = 0.1
RESET_NOISE_SCALE = 0.1


def observation(state: BatchState) -> np.ndarray:
    """(N, 17) float64: joint positions without root x, then all velocities."""
    return np.concatenate([state.qpos[:, 1:], state.qvel], axis=1)


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """Forward velocity of the root (finite difference over one env step) minus the control cost."""
    x_velocity = (state.qpos[:, 0] - x_before) / dt
    ctrl_cost = CTRL_COST_WEIGHT * np.sum(np.square(action), axis=1)
    return FORWARD_REWARD_WEIGHT * x_velocity - ctrl_cost


def terminated(state: BatchState) -> np.ndarray:
    """HalfCheetah never terminates: it cannot fall."""
    return np.zeros(state.qpos.shape[0], dtype=bool)


HALF_CHEETAH_V5 = Task(
    name="HalfCheetah-v5",
    model_path=str(Path(__file__).parent / "assets" / "half_cheetah.xml"),
    frame_skip=5,
    max_episode_steps=1000,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=uniform_normal_reset(RESET_NOISE_SCALE),
    total_mass=14.0,
    arena_bytes=1 << 16,  # 1.5x its worst pose's 42,376 bytes (tests/envs/test_task_arena.py), not the MJCF's 6 MB
)
