"""Any gymnasium env as a (slower) backend of the simulate step: env name `gym:<gymnasium id>`.

`GymnasiumBatch` steps `num_envs` copies of a gymnasium env in a `SyncVectorEnv` (same-step auto-reset)
and presents the interface the env worker uses on `BatchedMujocoEnv`: `observe`, `step -> StepResult`,
`get_state`/`set_state`, sizes and action bounds. Only continuous control fits our Gaussian policy: the
env needs a 1-D `Box` observation space and a 1-D `Box` action space; anything else is refused with the
spaces it has.

Seeding: env g (global index) starts with `reset(seed=...)` from `(seed, g)`; later episodes continue
that env's generator, as gymnasium's auto-reset does.

Checkpoints: a gymnasium env's internal state cannot be captured in general, so `get_state` holds only
the episode counters and `set_state` starts a new episode in every env (seeded from the restored counters).
A gym-backed run therefore resumes where its learner left off, but not bit-exactly mid-episode as the
native MuJoCo tasks do; a warning says so when it happens.
"""
from __future__ import annotations

import warnings
from functools import partial

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rl_core.config.control import GYM_PREFIX
from rl_core.envs.batched import COUNTER_FIELDS, StepResult


def gym_id(env_name: str) -> str:
    """`gym:Pendulum-v1` -> `Pendulum-v1`."""
    if not env_name.startswith(GYM_PREFIX):
        raise ValueError(f"{env_name!r} is not a gymnasium backend name; those look like '{GYM_PREFIX}Pendulum-v1'")
    return env_name[len(GYM_PREFIX):]


def check_spaces(env_id: str, observation_space: gymnasium.Space, action_space: gymnasium.Space) -> None:
    """Raise a ValueError unless both spaces are 1-D Boxes (what a Gaussian MLP policy can act in)."""
    for kind, space in (("observation", observation_space), ("action", action_space)):
        if not (isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1):
            raise ValueError(f"gymnasium env {env_id!r}: the {kind} space is {space}; the simulate step needs a 1-D "
                             "Box (continuous control), e.g. gym:Pendulum-v1 or gym:HalfCheetah-v5")


def validate_gym_env(env_name: str) -> None:
    """Check that `gym:<id>` names a registered gymnasium env with continuous spaces (builds one env to see)."""
    env_id = gym_id(env_name)
    if env_id not in gymnasium.envs.registration.registry:
        raise ValueError(f"gymnasium has no env {env_id!r} registered (import the module that registers it, "
                         "e.g. with env_module)")
    env = gymnasium.make(env_id)
    try:
        check_spaces(env_id, env.observation_space, env.action_space)
    finally:
        env.close()


class GymnasiumBatch:
    """`num_envs` gymnasium envs (global indices from `env_offset`) with `BatchedMujocoEnv`'s worker interface."""

    def __init__(self, env_name: str, num_envs: int, seed: int, env_offset: int = 0) -> None:
        self.env_id = gym_id(env_name)
        self.num_envs, self.seed, self.env_offset = num_envs, seed, env_offset
        self._vec = SyncVectorEnv([partial(gymnasium.make, self.env_id)] * num_envs,
                                  autoreset_mode=AutoresetMode.SAME_STEP)
        space = self._vec.single_action_space
        check_spaces(self.env_id, self._vec.single_observation_space, space)
        self.obs_dim = self._vec.single_observation_space.shape[0]
        self.action_dim = space.shape[0]
        self.action_low = np.asarray(space.low, dtype=np.float64)
        self.action_high = np.asarray(space.high, dtype=np.float64)
        self._action_dtype = space.dtype
        self.episode_step = np.zeros(num_envs, dtype=np.int64)
        self.episode_return = np.zeros(num_envs, dtype=np.float64)
        self.episode_index = np.zeros(num_envs, dtype=np.int64)
        self._obs = self._reset_all()

    def _reset_all(self) -> np.ndarray:
        """Reset every env, seeded from (seed, global env index, episode index)."""
        seeds = [int(np.random.SeedSequence([self.seed, self.env_offset + i, int(e)]).generate_state(1)[0])
                 for i, e in enumerate(self.episode_index)]
        obs, _ = self._vec.reset(seed=seeds)
        self.episode_step[:] = 0
        self.episode_return[:] = 0.0
        return np.asarray(obs, dtype=np.float64)

    def observe(self) -> np.ndarray:
        """(N, obs_dim) float64 observation of the current state."""
        return self._obs.copy()

    def step(self, actions: np.ndarray) -> StepResult:
        """Apply `actions` clipped to the action space; ended envs restart within the step (same-step reset)."""
        action = np.clip(actions, self.action_low, self.action_high).astype(self._action_dtype)
        obs, reward, terminated, truncated, infos = self._vec.step(action)
        obs = np.asarray(obs, dtype=np.float64)
        reward = np.asarray(reward, dtype=np.float64)
        truncated = truncated & ~terminated  # cut short by the limit only if it did not end on its own
        done = terminated | truncated
        self.episode_step += 1
        self.episode_return += reward
        final_obs = obs
        if done.any():
            final_obs = obs.copy()
            for i in np.flatnonzero(done):
                final_obs[i] = infos["final_obs"][i]
        finished = self.episode_return[done].copy()
        self.episode_index[done] += 1
        self.episode_step[done] = 0
        self.episode_return[done] = 0.0
        self._obs = obs
        return StepResult(obs, reward, terminated, truncated, final_obs, finished)

    def get_state(self) -> dict[str, np.ndarray]:
        """The episode counters: all of a gymnasium env's state that can be captured in general."""
        return {name: getattr(self, name).copy() for name in COUNTER_FIELDS}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore the counters and start a new episode in every env (not bit-exact, see the module docstring)."""
        for name in COUNTER_FIELDS:
            if name not in state or state[name].shape != (self.num_envs,):
                found = state[name].shape if name in state else "missing"
                raise ValueError(f"env state {name}: expected shape ({self.num_envs},), found {found}")
        warnings.warn(f"gym:{self.env_id}: gymnasium env state cannot be restored; every env starts a new "
                      "episode (a gym-backed run does not resume bit-exactly)", stacklevel=2)
        self.episode_index[:] = state["episode_index"] + 1
        self._obs = self._reset_all()
