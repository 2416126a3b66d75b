"""Ant, exactly as gymnasium's `Ant-v5` defines it (same MJCF and defaults, contact forces included).

Observation: qpos[2:] (13), qvel (14), then the external contact forces `cfrc_ext` of bodies 1.. clipped to
[-1, 1] (13 x 6), 105 values. Reward: x velocity of the torso (finite difference of its `xpos`, which after a
step is one substep behind qpos, as gymnasium reads it) + 1 while healthy - 0.5 * |action|^2
- 5e-4 * |clipped cfrc_ext|^2. Terminates when unhealthy: torso height qpos[2] outside [0.2, 1] or a
non-finite state. Reset: qpos + U(-0.1, 0.1), qvel + 0.1 * N(0, 1). frame_skip 5, 1000 steps.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs.reset_noise import uniform_normal_reset
from rl_core.envs.task import BatchState, Task

FORWARD_REWARD_WEIGHT = 1.0
CTRL_COST_WEIGHT = 0.5
CONTACT_COST_WEIGHT = 5e-4
HEALTHY_REWARD = 1.0
HEALTHY_Z_RANGE = (0.2, 1.0)
CONTACT_FORCE_RANGE = (-1.0, 1.0)
RESET_NOISE_SCALE = 0.1
MAIN_BODY = 1  # the torso


def contact_forces(state: BatchState) -> np.ndarray:
    """(N, nbody, 6) external contact forces clipped to the contact force range."""
    return np.clip(state.derived["cfrc_ext"], *CONTACT_FORCE_RANGE)


def observation(state: BatchState) -> np.ndarray:
    """(N, 105) float64: positions without torso x and y, velocities, clipped contact forces of bodies 1..."""
    forces = contact_forces(state)[:, 1:].reshape(state.qpos.shape[0], -1)
    return np.concatenate([state.qpos[:, 2:], state.qvel, forces], axis=1)


def x_position(state: BatchState) -> np.ndarray:
    """x of the torso's frame as MjData.xpos holds it (one substep behind qpos after a step)."""
    return state.derived["xpos"][:, MAIN_BODY, 0]


def is_healthy(state: BatchState) -> np.ndarray:
    """(N,) bool: finite state and torso height within [0.2, 1] (inclusive bounds, as gymnasium)."""
    finite = np.all(np.isfinite(state.qpos), axis=1) & np.all(np.isfinite(state.qvel), axis=1)
    z = state.qpos[:, 2]
    return finite & (HEALTHY_Z_RANGE[0] <= z) & (z <= HEALTHY_Z_RANGE[1])


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """Forward velocity plus the healthy bonus, minus control and contact costs."""
    forward_reward = (x_position(state) - x_before) / dt * FORWARD_REWARD_WEIGHT
    healthy_reward = is_healthy(state) * HEALTHY_REWARD
    ctrl_cost = CTRL_COST_WEIGHT * np.sum(np.square(action), axis=1)
    contact_cost = CONTACT_COST_WEIGHT * np.sum(np.square(contact_forces(state)), axis=(1, 2))
    return forward_reward + healthy_reward - (ctrl_cost + contact_cost)


def terminated(state: BatchState) -> np.ndarray:
    """The ant has flipped, jumped too high or diverged."""
    return ~is_healthy(state)


ANT_V5 = Task(
    name="Ant-v5",
    model_path=str(Path(__file__).parent / "assets" / "ant.xml"),
    frame_skip=5,
    max_episode_steps=1000,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=uniform_normal_reset(RESET_NOISE_SCALE),
    x_position=x_position,
    derived_fields=("xpos", "cfrc_ext"),
)
