"""An env worker: a batch of envs plus the policy that acts in them; one per Ray actor.

The worker remembers which checkpoint version its envs and policy correspond to. When asked to
simulate from another version (a retry, a resume in a new process, a replaced actor) it restores
both from the store first, so the result never depends on what happened to the process before.
"""
from __future__ import annotations

import numpy as np
import ray
import torch

from rl_core.algos.evaluation import evaluate_learner
from rl_core.algos.learner import PPOLearner, policy_sha256
from rl_core.algos.rollout import collect_rollout
from rl_core.checkpoint import CheckpointStore
from rl_core.config import RunConfig
from rl_core.data import RunLayout, write_tensors
from rl_core.envs import make_batch
from rl_core.seeding import torch_generator

ENV_PREFIX = "env."


class EnvWorker:
    """Envs [env_offset, env_offset + num_envs) of a run, stepped with the policy of a version.

    By default worker w holds envs [w * envs_per_worker, (w + 1) * envs_per_worker); a resized pool
    passes its own split (`env_split`) and can move a live worker to another one with `assign`.
    """

    def __init__(self, config_json: str, worker_index: int, envs: tuple[int, int] | None = None) -> None:
        torch.set_num_threads(1)
        self.cfg = RunConfig.model_validate_json(config_json)
        self.worker_index = worker_index
        self.env_offset, self.num_envs = envs or (worker_index * self.cfg.envs_per_worker, self.cfg.envs_per_worker)
        self.layout = RunLayout(self.cfg.run_url)
        self.store = CheckpointStore(self.layout.checkpoints, full_every=self.cfg.full_every)
        self._new_envs()
        self.learner = PPOLearner(self.env.obs_dim, self.env.action_dim, self.cfg.ppo, self.cfg.seed)
        self.policy_version: int | None = None

    def assign(self, envs: tuple[int, int]) -> None:
        """Hold envs [offset, offset + count) from now on; they are restored from the store at the next step."""
        self.env_offset, self.num_envs = envs
        self._new_envs()
        self.env_version = None

    def ping(self) -> dict:
        """Liveness, where the worker runs and what it holds: for the pool's health check."""
        return {"worker": self.worker_index, "node": ray.get_runtime_context().get_node_id(),
                "envs": [self.env_offset, self.num_envs], "env_version": self.env_version}

    def _new_envs(self) -> None:
        """Fresh envs: by definition the env state of version 0."""
        self.env = make_batch(self.cfg.env, self.num_envs, self.cfg.seed, self.env_offset, self.cfg.randomization)
        self.discounted_return = np.zeros(self.num_envs)
        self.env_version: int | None = 0

    def _sync(self, version: int) -> None:
        """Bring policy and envs to checkpoint `version`, reading the store only if they are elsewhere."""
        if self.policy_version == version and self.env_version == version:
            return
        snapshot = self.store.load(version)
        self.learner.load_policy(snapshot.tensors)
        self.policy_version = version
        if self.env_version != version:
            rows = slice(self.env_offset, self.env_offset + self.num_envs)
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
        return {**evaluate_learner(self.cfg, self.learner, episodes), "policy_sha256": policy_sha256(snapshot.tensors)}
