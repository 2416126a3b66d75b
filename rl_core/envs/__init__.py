"""Batched MuJoCo environments (gymnasium v5 task definitions on `mujoco.batch`).

Importing this package registers every task in gymnasium as `gymflow/<name>` (see `rl_core.envs.vector`).
"""
from rl_core.config.randomization import DynamicsRandomization
from rl_core.envs.batched import BatchedMujocoEnv, StepResult
from rl_core.envs.gym_backend import GymnasiumBatch
from rl_core.envs.registry import get_task, import_env_module, make_batch, register_task, task_names, validate_env_name
from rl_core.envs.task import Task
from rl_core.envs.vector import GymflowVectorEnv

__all__ = [
    "BatchedMujocoEnv", "DynamicsRandomization", "GymflowVectorEnv", "GymnasiumBatch", "StepResult", "Task",
    "get_task", "import_env_module", "make_batch", "register_task", "task_names", "validate_env_name",
]
