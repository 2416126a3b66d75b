"""An env worker: a batch of envs plus the policy that acts in them (no learner); one per Ray actor.

The worker remembers which checkpoint version its envs and policy correspond to. When asked to
simulate from another version (a retry, a resume in a new process, a replaced actor) it restores
both from the store first, so the result never depends on what happened to the process before.
With `overlap` the policy is one version behind the envs (`acting_version`). The flow commits version v after
simulate(v) (see `version_state`): a worker that restores v before its commit lands reads it from the step outputs.
"""
from __future__ import annotations

import functools

import torch

from rl_core.algos.base import Spaces, algorithm_of, build_policy, policy_sha256
from rl_core.algos.ppo.batches import ENV_STATE_PREFIX
from rl_core.algos.ppo.evaluation import evaluate_control_policy
from rl_core.checkpoint import CheckpointStore
from rl_core.config.control import ControlRunConfig
from rl_core.config.threads import ENV_WORKER_THREADS
from rl_core.data import RunLayout, write_tensors
from rl_core.envs import make_batch
from rl_core.envs.registry import import_env_module
from rl_core.runtime.faults import maybe_fail
from rl_core.runtime.version_state import env_states, learner_state


class EnvWorker:
    """Envs [env_offset, env_offset + num_envs) of a run, stepped with the policy of a version.

    By default worker w holds envs [w * envs_per_worker, (w + 1) * envs_per_worker); a resized pool
    passes its own split (`env_split`) and can move a live worker to another one with `assign`.
    """

    def __init__(self, config_json: str, worker_index: int, envs: tuple[int, int] | None = None) -> None:
        torch.set_num_threads(ENV_WORKER_THREADS)
        self.cfg = ControlRunConfig.model_validate_json(config_json)
        import_env_module(self.cfg.env.module)  # the run's own envs, registered in this process too
        self.algorithm = algorithm_of(self.cfg)
        self.worker_index = worker_index
        per_worker = self.cfg.env.envs_per_worker
        self.env_offset, self.num_envs = envs or (worker_index * per_worker, per_worker)
        self.layout = RunLayout(self.cfg.run_url)
        self.store = CheckpointStore(self.layout.checkpoints, full_every=self.cfg.storage.full_every)
        self._new_envs()
        self.policy = build_policy(self.cfg, Spaces(self.env.obs_dim, self.env.action_dim))
        self.policy_version: int | None = None

    def reuse(self, config_json: str, worker_index: int, envs: tuple[int, int] | None = None) -> None:
        """Become another run's worker (a sweep's next member: `rl_core.runtime.warm_actors`): everything the
        constructor builds is built again from that run's config."""
        self.__init__(config_json, worker_index, envs)

    def assign(self, envs: tuple[int, int]) -> None:
        """Hold envs [offset, offset + count) from now on; they are restored from the store at the next step."""
        self.env_offset, self.num_envs = envs
        self._new_envs()
        self.env_version = None

    def ping(self) -> dict:
        """Liveness, where the worker runs and what it holds: for the pool's health check."""
        import ray

        return {"worker": self.worker_index, "node": ray.get_runtime_context().get_node_id(),
                "envs": [self.env_offset, self.num_envs], "env_version": self.env_version}

    def _new_envs(self) -> None:
        """Fresh envs: by definition the env state of version 0."""
        self.env = make_batch(self.cfg.env.name, self.num_envs, self.cfg.seed, self.env_offset,
                              self.cfg.env.randomization)
        self.carry = self.algorithm.initial_carry(self.num_envs)
        self.env_version: int | None = 0

    def _sync(self, version: int, policy_version: int) -> None:
        """Bring the envs to checkpoint `version` and the policy to `policy_version`, reading the store (or, for a
        version still being committed, the step outputs that hold it) only for what the worker does not hold."""
        load = functools.lru_cache(maxsize=1)(self.store.load)  # a resume needs version v's policy and envs: one read
        if self.policy_version != policy_version:
            self.policy.load_state(learner_state(self.store, self.layout, policy_version, load))
            self.policy_version = policy_version
        if self.env_version == version:
            return
        if version == 0:
            self._new_envs()
            return
        rows = slice(self.env_offset, self.env_offset + self.num_envs)
        env_state = {k: v[rows] for k, v in env_states(self.store, self.layout, version, load).items()}
        if not env_state:
            raise RuntimeError(f"checkpoint version {version} of {self.cfg.run_url} holds no env state")
        self.carry = {name: env_state.pop(name).copy() for name in self.carry}
        self.env.set_state(env_state)
        self.env_version = version

    def simulate(self, iteration: int, version: int) -> dict:
        """Collect one rollout from the envs of `version`, acting with the policy of `acting_version`;
        write experience and end env state; return a summary."""
        self._sync(version, self.algorithm.behaviour_version(self.cfg, version))
        self.env_version = None  # the envs are mid-change until the shard is written
        arrays, meta = self.algorithm.collect(self.cfg, self.policy, self.env, self.carry, iteration,
                                              self.env_offset)
        maybe_fail("simulate.rollout_end", iteration=iteration, worker=self.worker_index)
        env_state = {**self.env.get_state(), **{k: v.copy() for k, v in self.carry.items()}}
        arrays.update({ENV_STATE_PREFIX + k: v for k, v in env_state.items()})
        uri = self.layout.experience(iteration, self.worker_index)
        size = write_tensors(uri, arrays, {"iteration": iteration, "version": version, **meta})
        self.env_version = version + 1
        return {"uri": uri, "bytes": size, **meta}

    def evaluate(self, version: int, episodes: int) -> dict:
        """Mean undiscounted return of `episodes` full episodes: the deterministic policy and a uniform-random one."""
        snapshot = self.store.load(version)
        self.policy.load_state(snapshot.tensors)
        self.policy_version = version
        return {**evaluate_control_policy(self.cfg, self.policy, episodes),
                "policy_sha256": policy_sha256(snapshot.tensors)}
