"""Tasks by name, so configuration can name an environment and get a clear error for an unknown one."""
from __future__ import annotations

from rl_core.envs.ant import ANT_V5
from rl_core.envs.halfcheetah import HALF_CHEETAH_V5
from rl_core.envs.hopper import HOPPER_V5
from rl_core.envs.humanoid import HUMANOID_V5
from rl_core.envs.inverted_pendulum import INVERTED_PENDULUM_V5
from rl_core.envs.swimmer import SWIMMER_V5
from rl_core.envs.task import Task
from rl_core.envs.walker2d import WALKER2D_V5

_TASKS: dict[str, Task] = {
    task.name: task
    for task in (HALF_CHEETAH_V5, HOPPER_V5, WALKER2D_V5, ANT_V5, HUMANOID_V5, SWIMMER_V5, INVERTED_PENDULUM_V5)
}


def register_task(task: Task) -> None:
    """Make `task` selectable by its name; refuses to silently replace an existing task."""
    if task.name in _TASKS and _TASKS[task.name] is not task:
        raise ValueError(f"task {task.name!r} is already registered; pick another name")
    _TASKS[task.name] = task


def task_names() -> list[str]:
    """Registered task names, sorted."""
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    """The task called `name`, or a KeyError listing the known ones."""
    try:
        return _TASKS[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(task_names())}") from None
