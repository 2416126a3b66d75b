"""gymnasium interop: our batch as a gymnasium `VectorEnv`, and each task under `gymflow/` in gymnasium's registry.

    envs = gymnasium.make_vec("gymflow/HalfCheetah-v5", num_envs=64)   # importing rl_core.envs registers them
    obs, info = envs.reset(seed=0)
    obs, rewards, terminations, truncations, infos = envs.step(actions)

`gymnasium.make("gymflow/HalfCheetah-v5")` gives one env (`rl_core.envs.single.GymflowEnv`) in gymnasium's usual
wrappers, its `TimeLimit` included.

Auto-reset is `AutoresetMode.SAME_STEP` (in `metadata["autoreset_mode"]`): the step that ends an episode
already returns the next episode's first observation, and the last observation of the ended one is in
`infos["final_obs"]` (an object array, set where `infos["_final_obs"]` is True), as gymnasium's own
SyncVectorEnv does in that mode. Episode returns and lengths of ended episodes are in `infos["episode"]`
(`r`, `l`, masked by `_episode`), as `RecordEpisodeStatistics` reports them.

Seeding: `reset(seed=s)` starts every env's episode 0 with reset noise from `(s, env index, episode)`, the
same counter-based scheme the batch uses, so `reset(seed=s)` twice gives the same trajectories.
`reset()` without a seed starts the next episode in every env.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from rl_core.config.randomization import DynamicsRandomization
from rl_core.envs.batched import BatchedMujocoEnv
from rl_core.envs.single import GymflowEnv, task_spaces
from rl_core.envs.task import Task

NAMESPACE = "gymflow"


class GymflowVectorEnv(VectorEnv):
    """`num_envs` envs of `task` on one `BatchedMujocoEnv`, behind gymnasium's vector API."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        task: Task,
        num_envs: int,
        seed: int = 0,
        nthread: int = 1,
        max_episode_steps: int | None = None,
        randomization: DynamicsRandomization | None = None,
    ) -> None:
        if max_episode_steps is not None and max_episode_steps != task.max_episode_steps:
            task = replace(task, max_episode_steps=max_episode_steps)
        self._nthread, self._randomization = nthread, randomization
        self.batch = BatchedMujocoEnv(task, num_envs, seed, nthread=nthread, randomization=randomization)
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = task_spaces(self.batch)
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start a new episode in every env: episode 0 of seed `seed`, or each env's next episode."""
        if seed is not None:
            self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random(seed)
            self.batch = BatchedMujocoEnv(
                self.batch.task, self.num_envs, seed, nthread=self._nthread, randomization=self._randomization
            )
        else:
            self.batch.start_new_episodes()
        return self.batch.observe(), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """One batch step; ended envs are reset within it (their last observation in `infos['final_obs']`)."""
        episode_steps = self.batch.episode_step + 1
        result = self.batch.step(np.asarray(actions, dtype=np.float64))
        infos: dict[str, Any] = {}
        done = result.terminated | result.truncated
        if done.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = result.final_obs[i]
            returns = np.zeros(self.num_envs)
            returns[done] = result.finished_returns
            infos = {
                "final_obs": final_obs, "_final_obs": done.copy(),
                "episode": {"r": returns, "l": np.where(done, episode_steps, 0), "_r": done.copy(), "_l": done.copy()},
                "_episode": done.copy(),
            }
        return result.obs, result.reward, result.terminated, result.truncated, infos


def register_in_gymnasium(task: Task) -> str:
    """Register `task` as `gymflow/<name>` with an entry point (one env, for `gymnasium.make`) and a vector entry
    point (the batch, for `gymnasium.make_vec`); returns the id. Idempotent per task."""
    env_id = f"{NAMESPACE}/{task.name}"
    existing = gymnasium.envs.registration.registry.get(env_id)
    if existing is None:
        gymnasium.register(
            id=env_id, entry_point=partial(GymflowEnv, task), vector_entry_point=partial(GymflowVectorEnv, task),
            max_episode_steps=task.max_episode_steps,
        )
    return env_id
