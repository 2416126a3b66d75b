"""ReachingArm-v0: a task of your own from an MJCF file and batched numpy functions, no MuJoCo code.

A two-link planar arm (links of 0.12 m) should bring its fingertip to a target drawn anew each episode.
Importing this module registers the task, so the control flow trains it by name:

    python -m flows.tooling.cli train --env-module examples.reaching_arm --env ReachingArm-v0 --preset quick

qpos = [shoulder, elbow, target_x, target_y]; every function below sees the whole batch at once
(leading axis = env) and never touches MuJoCo: the env steps the model and hands over qpos and qvel.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_core.envs import Task, register_task
from rl_core.envs.task import BatchState

LINK_LENGTH = 0.12  # both links, as in reaching_arm.xml
TARGET_RADIUS = 0.2  # targets are drawn uniformly in this disc, within the arm's reach of 0.24
CTRL_COST_WEIGHT = 0.1
ARM_NOISE = 0.1


def fingertip(state: BatchState) -> np.ndarray:
    """(N, 2) fingertip position, by forward kinematics from the two joint angles."""
    shoulder, elbow = state.qpos[:, 0], state.qpos[:, 1]
    x = LINK_LENGTH * (np.cos(shoulder) + np.cos(shoulder + elbow))
    y = LINK_LENGTH * (np.sin(shoulder) + np.sin(shoulder + elbow))
    return np.stack([x, y], axis=1)


def observation(state: BatchState) -> np.ndarray:
    """(N, 10): cos and sin of the joint angles, target position, joint velocities, fingertip - target."""
    angles = state.qpos[:, :2]
    target = state.qpos[:, 2:4]
    return np.concatenate(
        [np.cos(angles), np.sin(angles), target, state.qvel[:, :2], fingertip(state) - target], axis=1
    )


def reward(state: BatchState, action: np.ndarray, x_before: np.ndarray, dt: float) -> np.ndarray:
    """Minus the fingertip's distance to the target, minus a small control cost."""
    distance = np.linalg.norm(fingertip(state) - state.qpos[:, 2:4], axis=1)
    return -distance - CTRL_COST_WEIGHT * np.sum(np.square(action), axis=1)


def terminated(state: BatchState) -> np.ndarray:
    """Episodes run to the time limit: touching the target is rewarded, not ended."""
    return np.zeros(state.qpos.shape[0], dtype=bool)


def reset(init_qpos: np.ndarray, init_qvel: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Arm near straight with a little noise; target uniform in a disc of radius TARGET_RADIUS, at rest."""
    qpos = init_qpos.copy()
    qpos[:2] += rng.uniform(-ARM_NOISE, ARM_NOISE, size=2)
    radius, angle = TARGET_RADIUS * np.sqrt(rng.uniform()), rng.uniform(-np.pi, np.pi)
    qpos[2:4] = radius * np.cos(angle), radius * np.sin(angle)
    qvel = init_qvel.copy()
    qvel[:2] += rng.uniform(-ARM_NOISE, ARM_NOISE, size=2)
    return qpos, qvel


REACHING_ARM_V0 = Task(
    name="ReachingArm-v0",
    model_path=str(Path(__file__).with_name("reaching_arm.xml")),
    frame_skip=2,
    max_episode_steps=100,
    observation=observation,
    reward=reward,
    terminated=terminated,
    reset=reset,
)

register_task(REACHING_ARM_V0)
