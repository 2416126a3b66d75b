"""Environments by name, so configuration can name one and get a clear error for an unknown one.

Names are either registered tasks (`HalfCheetah-v5`, or a user's task added with `register_task`) or
`gym:<id>` for any gymnasium env as a slower backend. `make_batch` turns a name into a batch the env
worker steps. Every registered task is also registered in gymnasium as `gymflow/<name>`.
"""
from __future__ import annotations

import importlib

from rl_core.config.control import GYM_PREFIX
from rl_core.config.randomization import DynamicsRandomization
from rl_core.envs.ant import ANT_V5
from rl_core.envs.batched import BatchedMujocoEnv
from rl_core.envs.gym_backend import GymnasiumBatch, validate_gym_env
from rl_core.envs.halfcheetah import HALF_CHEETAH_V5
from rl_core.envs.hopper import HOPPER_V5
from rl_core.envs.humanoid import HUMANOID_V5
from rl_core.envs.inverted_pendulum import INVERTED_PENDULUM_V5
from rl_core.envs.swimmer import SWIMMER_V5
from rl_core.envs.task import Task
from rl_core.envs.vector import register_in_gymnasium
from rl_core.envs.walker2d import WALKER2D_V5

_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> None:
    """Make `task` selectable by its name (and as `gymflow/<name>` in gymnasium); never silently replaces one."""
    if task.name.startswith(GYM_PREFIX):
        raise ValueError(f"task name {task.name!r}: the prefix {GYM_PREFIX!r} is reserved for gymnasium backends")
    if task.name in _TASKS and _TASKS[task.name] is not task:
        raise ValueError(f"task {task.name!r} is already registered; pick another name")
    _TASKS[task.name] = task
    register_in_gymnasium(task)


def task_names() -> list[str]:
    """Registered task names, sorted."""
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    """The task called `name`, or a KeyError listing the known ones."""
    try:
        return _TASKS[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(task_names())}, "
                       f"or {GYM_PREFIX}<gymnasium id>") from None


def validate_env_name(name: str) -> None:
    """Raise a ValueError saying what is allowed unless `name` is a registered task or a usable `gym:` env."""
    if name.startswith(GYM_PREFIX):
        validate_gym_env(name)
    elif name not in _TASKS:
        raise ValueError(f"unknown environment {name!r}; allowed: {', '.join(task_names())}, or "
                         f"{GYM_PREFIX}<gymnasium id> for a gymnasium env with Box spaces; a task of your own "
                         "needs its module imported first (env_module / --env-module)")


def import_env_module(module: str | None) -> None:
    """Import `module` so the tasks it registers (with `register_task`) become selectable by name; None: none.
    The preflight imports it where a run starts, and every actor that makes envs imports it again in its process."""
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"env module {module!r} could not be imported ({err}); it must be importable from "
                         "the working directory or an installed package") from err


def make_batch(
    name: str,
    num_envs: int,
    seed: int,
    env_offset: int = 0,
    randomization: DynamicsRandomization | None = None,
    nthread: int = 1,
) -> BatchedMujocoEnv | GymnasiumBatch:
    """The batch of envs called `name`: a native task on `mujoco.batch`, or a `gym:` env in a SyncVectorEnv."""
    if name.startswith(GYM_PREFIX):
        if randomization is not None and not randomization.is_identity:
            raise ValueError(f"{name}: dynamics randomization needs a native task, not a gymnasium backend")
        return GymnasiumBatch(name, num_envs, seed, env_offset)
    return BatchedMujocoEnv(get_task(name), num_envs, seed, env_offset, nthread, randomization)


for _task in (HALF_CHEETAH_V5, HOPPER_V5, WALKER2D_V5, ANT_V5, HUMANOID_V5, SWIMMER_V5, INVERTED_PENDULUM_V5):
    register_task(_task)
