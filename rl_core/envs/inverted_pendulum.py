"""InvertedPendulum, exactly as gymnasium's `InvertedPendulum-v5` defines it (same MJCF and defaults).

Observation: qpos (cart position, pole angle) then qvel, 4 values. Reward: 1 for every step the pole stays
up, 0 on the step it falls. Terminates when the pole angle leaves [-0.2, 0.2] or the state is not finite.
Reset: qpos and qvel each + U(-0.01, 0.01). Actions are cart forces in [-3, 3]. frame_skip 2, 1000 steps.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs.reset_noise import uniform_reset
from rl_core.envs.task import BatchState, Task

MAX_POLE_ANGLE = 0.2
RESET_NOISE_SCALE = 0.01


def observation(state: BatchState) -> np.ndarray:
    """(N, 4) float64: cart position, pole angle, then their velocities."""
    return np.concatenate([state.qpos, state.qvel], axis=1)


def terminated(state: BatchState) -> np.ndarray:
    """The pole has fallen past 0.2 rad, or the simulation produced a non-finite state."""
    finite = np.all(np.isfinite(state.qpos), axis=1) & np.all(np.isfinite(state.qvel), axis=1)
    return ~finite | (np.abs(state.qpos[:, 1]) > MAX_POLE_ANGLE)


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """1 while the pole is up; gymnasium gives no reward on the step that terminates."""
    return (~terminated(state)).astype(np.float64)


INVERTED_PENDULUM_V5 = Task(
    name="InvertedPendulum-v5",
    model_path=str(Path(__file__).parent / "assets" / "inverted_pendulum.xml"),
    frame_skip=2,
    max_episode_steps=1000,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=uniform_reset(RESET_NOISE_SCALE),
    action_low=-3.0,
    action_high=3.0,
)
