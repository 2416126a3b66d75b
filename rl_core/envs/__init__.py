"""Batched MuJoCo environments (gymnasium v5 task definitions on `mujoco.batch`)."""
from rl_core.envs.batched import BatchedMujocoEnv, StepResult
from rl_core.envs.registry import get_task, register_task, task_names
from rl_core.envs.task import Task

__all__ = ["BatchedMujocoEnv", "StepResult", "Task", "get_task", "register_task", "task_names"]
