"""Humanoid, exactly as gymnasium's `Humanoid-v5` defines it (same MJCF and defaults).

Observation, 348 values: qpos[2:] (22), qvel (23), then for bodies 1..: `cinert` (13 x 10), `cvel` (13 x 6),
`qfrc_actuator` of the non-root dofs (17), and the external contact forces `cfrc_ext` (13 x 6). The derived
fields are those MjData holds after the step (one substep behind qpos), as gymnasium reads them.
Reward: 1.25 * x velocity of the centre of mass (from `xipos`) + 5 while healthy - 0.1 * |ctrl|^2
- min(5e-7 * |cfrc_ext|^2, 10). Terminates when the torso height qpos[2] leaves (1, 2).
Reset: qpos and qvel each + U(-0.01, 0.01). Actions are torques in [-0.4, 0.4]. frame_skip 5, 1000 steps.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs.reset_noise import uniform_reset
from rl_core.envs.task import BatchState, Task

FORWARD_REWARD_WEIGHT = 1.25
CTRL_COST_WEIGHT = 0.1
CONTACT_COST_WEIGHT = 5e-7
CONTACT_COST_RANGE = (-np.inf, 10.0)
HEALTHY_REWARD = 5.0
HEALTHY_Z_RANGE = (1.0, 2.0)
RESET_NOISE_SCALE = 1e-2
ROOT_DOFS = 6  # the free joint's velocities: no actuator acts on them


def observation(state: BatchState) -> np.ndarray:
    """(N, 348) float64: positions without root x and y, velocities, then per-body dynamics and contact forces."""
    n = state.qpos.shape[0]
    derived = state.derived
    return np.concatenate(
        [
            state.qpos[:, 2:],
            state.qvel,
            derived["cinert"][:, 1:].reshape(n, -1),
            derived["cvel"][:, 1:].reshape(n, -1),
            derived["qfrc_actuator"][:, ROOT_DOFS:],
            derived["cfrc_ext"][:, 1:].reshape(n, -1),
        ],
        axis=1,
    )


def x_position(state: BatchState) -> np.ndarray:
    """x of the centre of mass: each env's body masses times `xipos` (one substep behind qpos after a step)."""
    mass = state.body_mass
    return np.einsum("nb,nb->n", mass, state.derived["xipos"][:, :, 0]) / mass.sum(axis=1)


def is_healthy(state: BatchState) -> np.ndarray:
    """(N,) bool: torso height strictly within (1, 2)."""
    z = state.qpos[:, 2]
    return (HEALTHY_Z_RANGE[0] < z) & (z < HEALTHY_Z_RANGE[1])


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """Forward velocity of the centre of mass plus the healthy bonus, minus control and contact costs.

    The control cost reads the applied controls, as gymnasium reads `data.ctrl`: equal to `action` here.
    """
    forward_reward = FORWARD_REWARD_WEIGHT * (x_position(state) - x_before) / dt
    healthy_reward = is_healthy(state) * HEALTHY_REWARD
    ctrl_cost = CTRL_COST_WEIGHT * np.sum(np.square(action), axis=1)
    contact_cost = np.clip(
        CONTACT_COST_WEIGHT * np.sum(np.square(state.derived["cfrc_ext"]), axis=(1, 2)), *CONTACT_COST_RANGE
    )
    return forward_reward + healthy_reward - (ctrl_cost + contact_cost)


def terminated(state: BatchState) -> np.ndarray:
    """The humanoid has fallen (or been thrown up)."""
    return ~is_healthy(state)


HUMANOID_V5 = Task(
    name="Humanoid-v5",
    model_path=str(Path(__file__).parent / "assets" / "humanoid.xml"),
    frame_skip=5,
    max_episode_steps=1000,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=uniform_reset(RESET_NOISE_SCALE),
    action_low=-0.4,
    action_high=0.4,
    x_position=x_position,
    derived_fields=("xipos", "cinert", "cvel", "qfrc_actuator", "cfrc_ext"),
)
