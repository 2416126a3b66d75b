"""One env of a task behind gymnasium's `Env` API: what `gymnasium.make("gymflow/<Task>-v5")` returns.

    env = gymnasium.make("gymflow/HalfCheetah-v5")   # importing rl_core.envs registers it
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

It is a one-env `BatchedMujocoEnv`, so it steps the batch's physics, rewards and terminations, which
tests/envs/test_gymnasium_equivalence.py holds to gymnasium's own `<Task>-v5`; its spaces are that env's.

Time limit: as with gymnasium's own MuJoCo envs, the env never truncates by itself; `gymnasium.make` wraps it in
gymnasium's `TimeLimit` (the registered `max_episode_steps`, or make's `max_episode_steps=`), so `truncated` means
what it means for `gymnasium.make("<Task>-v5")`, including truncated=True together with terminated=True when an
episode terminates on its last allowed step (`GymflowVectorEnv` and the batch report only a cut-short episode).

Seeding: `reset(seed=s)` starts episode 0 of seed s, `reset()` the next episode; episode e draws its reset noise from
`default_rng([s, 0, e])`, the batch's counter-based scheme for env 0, so `reset(seed=s)` twice gives the same
trajectories. Before any seeded reset the seed is 0, as for `GymflowVectorEnv`.

`info` is empty: the batched tasks compute the reward as a whole, not the terms gymnasium's envs report there.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import gymnasium
import numpy as np

from rl_core.envs.batched import BatchedMujocoEnv
from rl_core.envs.task import Task

# the batch's time limit for this env: none, since gymnasium's TimeLimit wrapper is the one that ends episodes
NO_TIME_LIMIT = int(np.iinfo(np.int64).max)


def task_spaces(batch: BatchedMujocoEnv) -> tuple[gymnasium.spaces.Box, gymnasium.spaces.Box]:
    """One env's observation and action spaces, as gymnasium's own `<Task>-v5` declares them: unbounded float64
    observations, float32 actions in the actuators' range."""
    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (batch.obs_dim,), np.float64)
    action_space = gymnasium.spaces.Box(batch.task.action_low, batch.task.action_high, (batch.action_dim,), np.float32)
    return observation_space, action_space


class GymflowEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """One env of `task` on a one-env `BatchedMujocoEnv`, behind gymnasium's `Env` API."""

    metadata = {"render_modes": []}

    def __init__(self, task: Task) -> None:
        self.task = task
        self.batch = BatchedMujocoEnv(replace(task, max_episode_steps=NO_TIME_LIMIT), 1, seed=0)
        self.observation_space, self.action_space = task_spaces(self.batch)
        # True until reset() hands out the episode the batch holds: after construction, and after an episode
        # terminated (the batch has then already started the next one, which reset() must not skip)
        self._needs_reset = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start episode 0 of seed `seed`, or the next episode; gymflow's tasks take no `options`."""
        super().reset(seed=seed)  # seeds `np_random` for code that reads it; the reset noise is the batch's own
        if options:
            raise ValueError(f"{self.task.name}: reset options {sorted(options)} are not supported; "
                             "gymflow's tasks take none")
        if seed is not None:
            self.batch = BatchedMujocoEnv(self.batch.task, 1, seed)
        elif not self._needs_reset:
            self.batch.start_new_episodes()
        self._needs_reset = False
        return self.batch.observe()[0], {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """One env step with `action` (clipped to the action range, as the batch does)."""
        if self._needs_reset:
            raise gymnasium.error.ResetNeeded(f"{self.task.name}: call reset() before step(), at the start and after "
                                              "an episode terminated")
        action = np.asarray(action, dtype=np.float64)
        if action.shape != self.action_space.shape:
            raise ValueError(f"{self.task.name}: expected an action of shape {self.action_space.shape}, "
                             f"found {action.shape}")
        result = self.batch.step(action[None])
        terminated = bool(result.terminated[0])
        self._needs_reset = terminated
        obs = result.final_obs[0] if terminated else result.obs[0]
        return obs, float(result.reward[0]), terminated, False, {}
