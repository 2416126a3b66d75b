"""Walker2d, exactly as gymnasium's `Walker2d-v5` defines it (its `walker2d_v5.xml`, where both feet have the
same friction, and its defaults).

Observation: qpos[1:] (8) then qvel clipped to [-10, 10] (9), 17 values. Reward: forward velocity of the
root + 1 while healthy - 1e-3 * |action|^2. Terminates when unhealthy: torso height qpos[1] outside (0.8, 2)
or torso angle qpos[2] outside (-1, 1). Reset: qpos and qvel each + U(-5e-3, 5e-3). frame_skip 4, 1000 steps.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs.reset_noise import uniform_reset
from rl_core.envs.task import BatchState, Task

FORWARD_REWARD_WEIGHT = 1.0
CTRL_COST_WEIGHT = 1e-3
HEALTHY_REWARD = 1.0
HEALTHY_Z_RANGE = (0.8, 2.0)
HEALTHY_ANGLE_RANGE = (-1.0, 1.0)
RESET_NOISE_SCALE = 5e-3
VELOCITY_CLIP = 10.0


def observation(state: BatchState) -> np.ndarray:
    """(N, 17) float64: positions without root x, then velocities clipped as gymnasium clips them."""
    return np.concatenate([state.qpos[:, 1:], np.clip(state.qvel, -VELOCITY_CLIP, VELOCITY_CLIP)], axis=1)


def is_healthy(state: BatchState) -> np.ndarray:
    """(N,) bool: torso high enough, low enough and upright enough (strict bounds, as gymnasium)."""
    z, angle = state.qpos[:, 1], state.qpos[:, 2]
    healthy_z = (HEALTHY_Z_RANGE[0] < z) & (z < HEALTHY_Z_RANGE[1])
    healthy_angle = (HEALTHY_ANGLE_RANGE[0] < angle) & (angle < HEALTHY_ANGLE_RANGE[1])
    return healthy_z & healthy_angle


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """Forward velocity plus the healthy bonus, minus the control cost."""
    forward_reward = FORWARD_REWARD_WEIGHT * (state.qpos[:, 0] - x_before) / dt
    healthy_reward = is_healthy(state) * HEALTHY_REWARD
    ctrl_cost = CTRL_COST_WEIGHT * np.sum(np.square(action), axis=1)
    return forward_reward + healthy_reward - ctrl_cost


def terminated(state: BatchState) -> np.ndarray:
    """The walker has fallen, jumped too high or tilted too far."""
    return ~is_healthy(state)


WALKER2D_V5 = Task(
    name="Walker2d-v5",
    model_path=str(Path(__file__).parent / "assets" / "walker2d_v5.xml"),
    frame_skip=4,
    max_episode_steps=1000,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=uniform_reset(RESET_NOISE_SCALE),
)
