"""A control task: an MJCF model plus batched observation, reward, termination and reset functions.

Tasks are plain data so a user can add one without touching MuJoCo; `BatchedMujocoEnv` does the stepping.
All functions work on whole batches (leading axis = env) so no Python runs per env per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Protocol

import mujoco
import numpy as np


class BatchState(Protocol):
    """What a task function reads: live (num_envs, ·) float64 arrays over the batch's MjData rows.

    `derived` holds the MjData fields named in `Task.derived_fields`, (num_envs, *MjData shape), with the values
    gymnasium would read from its MjData at the same moment: after a step they describe the state before the last
    substep (as after `mj_step`), and `cacc`/`cfrc_int`/`cfrc_ext` are those of `mj_rnePostConstraint` after the step.
    """

    qpos: np.ndarray
    qvel: np.ndarray
    derived: Mapping[str, np.ndarray]
    model: mujoco.MjModel  # the task's model as compiled; under randomization envs differ from it (see below)
    body_mass: np.ndarray  # (num_envs, nbody): each env's own body masses


ObservationFn = Callable[[BatchState], np.ndarray]
# x_position(state) -> (num_envs,): the coordinate whose change over a step, / dt, is the forward velocity
PositionFn = Callable[[BatchState], np.ndarray]
# reward(state, action, x_before, dt) -> (num_envs,) rewards; x_before is x_position read before the step
RewardFn = Callable[[BatchState, np.ndarray, np.ndarray, float], np.ndarray]
TerminationFn = Callable[[BatchState], np.ndarray]
# reset(init_qpos, init_qvel, rng) -> (qpos, qvel) for one env
ResetFn = Callable[[np.ndarray, np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray]]


def root_x_position(state: BatchState) -> np.ndarray:
    """qpos[:, 0]: the root's x slide joint (or free joint x) for planar and free-floating models."""
    return state.qpos[:, 0]


@dataclass(frozen=True)
class Task:
    """Everything that defines an episodic control task on top of one MuJoCo model."""

    name: str
    model_path: str
    frame_skip: int
    max_episode_steps: int
    observation: ObservationFn
    reward: RewardFn
    terminated: TerminationFn
    reset: ResetFn
    action_low: float = -1.0
    action_high: float = 1.0
    total_mass: Optional[float] = None  # rescale body masses to this sum after compiling (MJCF settotalmass)
    x_position: PositionFn = root_x_position
    derived_fields: tuple[str, ...] = ()  # MjData fields beyond qpos/qvel the functions read, via state.derived
    # bytes of each MjData's arena (MJCF <size memory>): contacts, constraint rows and solver scratch; None keeps the
    # MJCF's. MuJoCo touches only the part a step uses, so this sizes address space, not resident memory; set it only
    # above the most the model can use (an arena that overflows drops contacts or stops the step).
    arena_bytes: Optional[int] = None


def load_model(task: Task) -> mujoco.MjModel:
    """Compile the task's MJCF with `arena_bytes` as its `<size memory>`, then apply `total_mass` as MJCF's
    deprecated `settotalmass` would."""
    if task.arena_bytes is None:
        model = mujoco.MjModel.from_xml_path(task.model_path)
    else:
        spec = mujoco.MjSpec.from_file(task.model_path)
        spec.memory = task.arena_bytes
        model = spec.compile()
    if task.total_mass is not None:
        mujoco.mj_setTotalmass(model, task.total_mass)
        mujoco.mj_setConst(model, mujoco.MjData(model))
    return model
