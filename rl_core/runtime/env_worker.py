"""An env worker: a batch of envs plus the policy that acts in them; one per Ray actor.

The worker remembers which checkpoint version its envs and policy correspond to. When asked to
simulate from another version (a retry, a resume in a new process, a replaced actor) it restores
both from the store first, so the result never depends on what happened to the process before.
"""
from __future__ import annotations

import numpy as np
import torch

from rl_core.algos.learner import PPOLearner, policy_sha256
from rl_core.algos.rollout import collect_rollout
from rl_core.checkpoint import CheckpointStore
from rl_core.config import RunConfig
from rl_core.data import RunLayout, write_tensors
from rl_core.envs import BatchedMujocoEnv, get_task
from rl_core.seeding import derive_seed, torch_generator

ENV_PREFIX = "env."
EVAL_SEED_OFFSET = 1_000_003  # evaluation envs never share reset noise with training envs


class EnvWorker:
    """Envs [env_offset, env_offset + envs_per_worker) of a run, stepped with the policy of a version."""

    def __init__(self, config_json: str, worker_index: int) -> None:
        torch.set_num_threads(1)
        self.cfg = RunConfig.model_validate_json(config_json)
        self.worker_index = worker_index
        self.env_offset = worker_index * self.cfg.envs_per_worker
        self.layout = RunLayout(self.cfg.run_url)
        self.store = CheckpointStore(self.layout.checkpoints, full_every=self.cfg.full_every)
        self._new_envs()
        self.learner = PPOLearner(self.env.obs_dim, self.env.action_dim, self.cfg.ppo, self.cfg.seed)
        self.policy_version: int | None = None

    def _new_envs(self) -> None:
        """Fresh envs: by definition the env state of version 0."""
        self.env = BatchedMujocoEnv(get_task(self.cfg.env), self.cfg.envs_per_worker, self.cfg.seed, self.env_offset)
        self.discounted_return = np.zeros(self.cfg.envs_per_worker)
        self.env_version: int | None = 0

    def _sync(self, version: int) -> None:
        """Bring policy and envs to checkpoint `version`, reading the store only if they are elsewhere."""
        if self.policy_version == version and self.env_version == version:
            return
        snapshot = self.store.load(version)
        self.learner.load_policy(snapshot.tensors)
        self.policy_version = version
        if self.env_version != version:
            rows = slice(self.env_offset, self.env_offset + self.cfg.envs_per_worker)
            env_state = {k[len(ENV_PREFIX):]: v[rows] for k, v in snapshot.tensors.items() if k.startswith(ENV_PREFIX)}
            if env_state:
                self.discounted_return = env_state.pop("discounted_return").copy()
                self.env.set_state(env_state)
                self.env_version = version
            elif version == 0:
                self._new_envs()
            else:
                raise RuntimeError(f"checkpoint version {version} of {self.cfg.run_url} holds no env state")

    def simulate(self, iteration: int, version: int) -> dict:
        """Collect one rollout from `version`; write experience and end env state; return a summary."""
        self._sync(version)
        self.env_version = None  # the envs are mid-change until the shard is written
        generator = torch_generator(self.cfg.seed, iteration, self.env_offset)
        arrays, info = collect_rollout(
            self.env, self.learner, self.cfg.rollout_steps, self.cfg.ppo.gamma, self.discounted_return, generator
        )
        env_state = self.env.get_state()
        env_state["discounted_return"] = self.discounted_return.copy()
        arrays.update({ENV_PREFIX + k: v for k, v in env_state.items()})
        uri = self.layout.experience(iteration, self.worker_index)
        meta = {"iteration": iteration, "version": version, "reward_scale": self.learner.reward_scale(), **info}
        size = write_tensors(uri, arrays, meta)
        self.env_version = version + 1
        return {"uri": uri, "bytes": size, **info}

    def evaluate(self, version: int, episodes: int) -> dict:
        """Mean undiscounted return of `episodes` full episodes: the deterministic policy and a uniform-random one."""
        snapshot = self.store.load(version)
        self.learner.load_policy(snapshot.tensors)
        self.policy_version = version
        task = get_task(self.cfg.env)
        eval_seed = derive_seed(self.cfg.seed, EVAL_SEED_OFFSET)

        def policy(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                x = torch.from_numpy(self.learner.obs_norm.normalize(obs))
                return self.learner.model.deterministic_action(x).numpy().astype(np.float64)

        rng = np.random.default_rng(eval_seed)
        env = BatchedMujocoEnv(task, episodes, eval_seed)
        learned = _run_episodes(env, policy)
        env = BatchedMujocoEnv(task, episodes, eval_seed)
        random = _run_episodes(env, lambda obs: rng.uniform(task.action_low, task.action_high, (episodes, env.action_dim)))
        return {"final_return": float(np.mean(learned)), "final_return_std": float(np.std(learned)),
                "random_return": float(np.mean(random)), "episodes": episodes,
                "policy_sha256": policy_sha256(snapshot.tensors)}


def _run_episodes(env: BatchedMujocoEnv, policy) -> np.ndarray:
    """Step until every env finished its first episode; returns the per-env episode returns."""
    returns = np.full(env.num_envs, np.nan)
    while np.isnan(returns).any():
        done_before = ~np.isnan(returns)
        result = env.step(policy(env.observe()))
        ended = (result.terminated | result.truncated) & ~done_before
        returns[ended] = _episode_returns(result, ended)
    return returns


def _episode_returns(result, ended: np.ndarray) -> np.ndarray:
    """Returns of the episodes that ended, in env order (StepResult lists finished returns in env order)."""
    done = result.terminated | result.truncated
    by_env = np.full(done.shape, np.nan)
    by_env[done] = result.finished_returns
    return by_env[ended]
