"""Swimmer, exactly as gymnasium's `Swimmer-v5` defines it (same MJCF and defaults).

Observation: qpos[2:] (3) then qvel (5), 8 values; the root x and y are excluded. Reward: x velocity of the
root (finite difference of qpos[0]) - 1e-4 * |action|^2. No termination; episodes are truncated at 1000
steps. Reset: qpos and qvel each + U(-0.1, 0.1). frame_skip 4.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs.reset_noise import uniform_reset
from rl_core.envs.task import BatchState, Task

FORWARD_REWARD_WEIGHT = 1.0
CTRL_COST_WEIGHT = 1e-4
RESET_NOISE_SCALE = 0.1


def observation(state: BatchState) -> np.ndarray:
    """(N, 8) float64: positions without root x and y, then all velocities."""
    return np.concatenate([state.qpos[:, 2:], state.qvel], axis=1)


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """Forward velocity of the root minus the control cost."""
    forward_reward = FORWARD_REWARD_WEIGHT * (state.qpos[:, 0] - x_before) / dt
    ctrl_cost = CTRL_COST_WEIGHT * np.sum(np.square(action), axis=1)
    return forward_reward - ctrl_cost


def terminated(state: BatchState) -> np.ndarray:
    """The swimmer never terminates: it has no unhealthy state."""
    return np.zeros(state.qpos.shape[0], dtype=bool)


SWIMMER_V5 = Task(
    name="Swimmer-v5",
    model_path=str(Path(__file__).parent / "assets" / "swimmer.xml"),
    frame_skip=4,
    max_episode_steps=1000,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=uniform_reset(RESET_NOISE_SCALE),
)
