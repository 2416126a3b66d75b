"""Tasks by name, so configuration can name an environment and get a clear error for an unknown one."""
from __future__ import annotations

from rl_core.envs.halfcheetah import HALF_CHEETAH_V5
from rl_core.envs.task import Task

_TASKS: dict[str, Task] = {HALF_CHEETAH_V5.name: HALF_CHEETAH_V5}


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
