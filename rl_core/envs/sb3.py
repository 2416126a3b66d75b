"""gymflow's batch as a stable-baselines3 `VecEnv`: a drop-in for `DummyVecEnv`/`SubprocVecEnv` over gymnasium's envs.

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor
    from rl_core.envs.sb3 import GymflowVecEnv

    venv = VecMonitor(GymflowVecEnv("HalfCheetah-v5", num_envs=16))
    PPO("MlpPolicy", venv, seed=0).learn(100_000)

Only SB3 users import this module: it needs stable-baselines3, which gymflow itself does not (it is in the `dev`
extra); nothing in gymflow imports it.

The contract is the one `DummyVecEnv` keeps over `gymnasium.make("<Task>-v5")` (a TimeLimit inside):
- auto-reset within the step: `dones = terminated | truncated`, and an env that is done already returns its next
  episode's first observation, the last one of the ended episode being in `infos[i]["terminal_observation"]`;
- `infos[i]["TimeLimit.truncated"]`: the time limit cut the episode short (truncated and not terminated), so the
  learner bootstraps from the terminal observation;
- float32 rewards, bool dones, `reset()` returning the observations only.
Like a `DummyVecEnv` of bare envs it reports no episode statistics: wrap it in `VecMonitor` (what `make_vec_env`'s
per-env `Monitor` does for the stock envs).

Seeding: `seed(s)` takes effect at the next `reset()`, which starts episode 0 of seed s in every env. SB3 hands env i
the seed s + i; here env i's episode e draws its reset noise from `default_rng([s, i, e])`, the batch's counter-based
scheme, so the envs differ as SB3's do and `seed(s); reset()` twice gives the same trajectories. `reset()` with no
seed pending starts each env's next episode.

The envs are rows of one batch, not env objects: `get_attr` reads this object's attributes (all envs share them),
`env_is_wrapped` is False (no gymnasium wrappers), and `set_attr`, `env_method` and reset options raise
NotImplementedError.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import gymnasium
import numpy as np

from rl_core.envs.batched import BatchedMujocoEnv
from rl_core.envs.registry import get_task
from rl_core.envs.single import task_spaces
from rl_core.envs.task import Task

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn
except ImportError as err:
    raise ImportError(f"rl_core.envs.sb3 needs stable-baselines3 ({err}): pip install 'stable-baselines3>=2.3', or "
                      "gymflow's dev extra") from err


class GymflowVecEnv(VecEnv):
    """`num_envs` envs of `task` (a registered name or a `Task`) on one `BatchedMujocoEnv`, behind SB3's VecEnv API."""

    render_mode = None  # no rendering; VecEnv.__init__ reads it through get_attr
    _actions: np.ndarray  # (num_envs, action_dim), from step_async for step_wait

    def __init__(
        self,
        task: str | Task,
        num_envs: int,
        seed: int = 0,
        nthread: int = 1,
        max_episode_steps: int | None = None,
    ) -> None:
        task = get_task(task) if isinstance(task, str) else task
        if max_episode_steps is not None and max_episode_steps != task.max_episode_steps:
            task = replace(task, max_episode_steps=max_episode_steps)
        self._nthread = nthread
        self.batch = BatchedMujocoEnv(task, num_envs, seed, nthread=nthread)
        super().__init__(num_envs, *task_spaces(self.batch))
        self._episodes_handed_out = False  # the first reset() returns the episodes the batch was built with

    def reset(self) -> np.ndarray:
        """(num_envs, obs_dim) first observations: of episode 0 of the seed `seed()` gave, or of each env's next."""
        seed = self._seeds[0]
        if seed is not None:
            self.batch = BatchedMujocoEnv(self.batch.task, self.num_envs, seed, nthread=self._nthread)
        elif self._episodes_handed_out:
            self.batch.start_new_episodes()
        self._episodes_handed_out = True
        self._reset_seeds()
        return self.batch.observe()

    def step_async(self, actions: np.ndarray) -> None:
        """Keep `actions` ((num_envs, action_dim), clipped to the action range by the step) for `step_wait`."""
        actions = np.asarray(actions, dtype=np.float64)
        expected = (self.num_envs, *self.action_space.shape)
        if actions.shape != expected:
            raise ValueError(f"{self.batch.task.name}: expected actions of shape {expected} "
                             f"(num_envs, action_dim), found {actions.shape}")
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """One batch step; done envs are reset within it (their last observation in `terminal_observation`)."""
        result = self.batch.step(self._actions)
        dones = result.terminated | result.truncated
        infos: list[dict[str, Any]] = [{"TimeLimit.truncated": bool(cut)} for cut in result.truncated]
        for i in np.flatnonzero(dones):
            infos[i]["terminal_observation"] = result.final_obs[i]
        return result.obs, result.reward.astype(np.float32), dones, infos

    def close(self) -> None:
        """Nothing to release: the batch holds no process or file, and its native threads end with it."""

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        """Refuse reset options: gymflow's tasks take none."""
        given = options if isinstance(options, list) else [options]
        if any(given):
            raise NotImplementedError(f"{self.batch.task.name}: reset options are not supported; gymflow's tasks "
                                      "take none")

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Each env's `attr_name`: this object's, since the envs are rows of one batch (AttributeError if none)."""
        value = getattr(self, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise NotImplementedError(f"set_attr({attr_name!r}): GymflowVecEnv's envs are rows of one batch and share "
                                  "its attributes; set it on the GymflowVecEnv itself (venv.unwrapped)")

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        raise NotImplementedError(f"env_method({method_name!r}): GymflowVecEnv's envs are rows of one batch, not env "
                                  "objects; call the method on the GymflowVecEnv (venv.unwrapped) or its `batch`")

    def env_is_wrapped(self, wrapper_class: type[gymnasium.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """False for every env: no env is in a gymnasium wrapper (episode statistics come from VecMonitor)."""
        return [False for _ in self._get_indices(indices)]
