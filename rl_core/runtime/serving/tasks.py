"""Which tasks the env service can serve, and of which kind: a MuJoCo task steps numeric actions in a batch
(`rl_core.envs.make_batch`), an agent env steps text (`rl_core.envs.agent`, one object per env)."""
from __future__ import annotations

from typing import Literal

from rl_core.envs import task_names
from rl_core.envs.agent import agent_env_names

TaskKind = Literal["mujoco", "agent"]


def task_kind(name: str) -> TaskKind:
    """"mujoco" or "agent", or a ValueError listing what is servable."""
    if name in task_names():
        return "mujoco"
    if name in agent_env_names():
        return "agent"
    raise ValueError(f"unknown task {name!r}; servable: MuJoCo tasks {', '.join(task_names())}; agent envs "
                     f"{', '.join(agent_env_names())}")
