"""Hopper, exactly as gymnasium's `Hopper-v5` defines it (same MJCF and defaults).

Observation: qpos[1:] (5) then qvel clipped to [-10, 10] (6), 11 values. Reward: forward velocity of the
root + 1 while healthy - 1e-3 * |action|^2. Terminates when unhealthy: any of qpos[2:], qvel outside
(-100, 100), torso height qpos[1] <= 0.7, or torso angle qpos[2] outside (-0.2, 0.2). Reset: qpos and qvel
each + U(-5e-3, 5e-3). frame_skip 4, 1000 steps.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs.reset_noise import uniform_reset
from rl_core.envs.task import BatchState, Task

FORWARD_REWARD_WEIGHT = 1.0
CTRL_COST_WEIGHT = 1e-3
HEALTHY_REWARD = 1.0
HEALTHY_STATE_RANGE = (-100.0, 100.0)
HEALTHY_Z_RANGE = (0.7, float("inf"))
HEALTHY_ANGLE_RANGE = (-0.2, 0.2)
RESET_NOISE_SCALE = 5e-3
VELOCITY_CLIP = 10.0


def observation(state: BatchState) -> np.ndarray:
    """(N, 11) float64: positions without root x, then velocities clipped as gymnasium clips them."""
    return np.concatenate([state.qpos[:, 1:], np.clip(state.qvel, -VELOCITY_CLIP, VELOCITY_CLIP)], axis=1)


def is_healthy(state: BatchState) -> np.ndarray:
    """(N,) bool: state bounded, torso high enough and upright enough (strict bounds, as gymnasium)."""
    rest = np.concatenate([state.qpos[:, 2:], state.qvel], axis=1)  # gymnasium's state_vector()[2:]
    healthy_state = np.all((HEALTHY_STATE_RANGE[0] < rest) & (rest < HEALTHY_STATE_RANGE[1]), axis=1)
    z, angle = state.qpos[:, 1], state.qpos[:, 2]
    healthy_z = (HEALTHY_Z_RANGE[0] < z) & (z < HEALTHY_Z_RANGE[1])
    healthy_angle = (HEALTHY_ANGLE_RANGE[0] < angle) & (angle < HEALTHY_ANGLE_RANGE[1])
    return healthy_state & healthy_z & healthy_angle


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """Forward velocity plus the healthy bonus, minus the control cost."""
    forward_reward = FORWARD_REWARD_WEIGHT * (state.qpos[:, 0] - x_before) / dt
    healthy_reward = is_healthy(state) * HEALTHY_REWARD
    ctrl_cost = CTRL_COST_WEIGHT * np.sum(np.square(action), axis=1)
    return forward_reward + healthy_reward - ctrl_cost


def terminated(state: BatchState) -> np.ndarray:
    """The hopper has fallen or left the healthy state range."""
    return ~is_healthy(state)


HOPPER_V5 = Task(
    name="Hopper-v5",
    model_path=str(Path(__file__).parent / "assets" / "hopper.xml"),
    frame_skip=4,
    max_episode_steps=1000,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=uniform_reset(RESET_NOISE_SCALE),
)
