"""The Ray actors of one run, owned by whoever runs it (a flow run, a test): its env-worker pool and trainer group.

Steps get this object from the flow instead of finding actors in module state, so two runs in one process never
share actors by accident, and what a flow started is released by the same flow.
"""
from __future__ import annotations

import threading

from rl_core.config.control import ControlRunConfig
from rl_core.runtime.control.env_pool import EnvWorkerPool
from rl_core.runtime.trainer_group import TrainerGroup


class ControlActors:
    """The run's env workers and trainer ranks, each created on first use and kept across iterations."""

    def __init__(self, cfg: ControlRunConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()  # steps run on the flow's threads
        self._env_pool: EnvWorkerPool | None = None
        self._trainer_group: TrainerGroup | None = None

    @property
    def env_pool(self) -> EnvWorkerPool:
        with self._lock:
            if self._env_pool is None:
                self._env_pool = EnvWorkerPool(self.cfg)
            return self._env_pool

    @property
    def trainer_group(self) -> TrainerGroup:
        with self._lock:
            if self._trainer_group is None:
                self._trainer_group = TrainerGroup(self.cfg)
            return self._trainer_group

    def evaluate(self, version: int) -> dict:
        """Mean returns of `cfg.eval_episodes` deterministic-policy episodes of `version` (and a random policy's),
        and the policy's sha256."""
        return self.env_pool.evaluate(version, self.cfg.eval_episodes)

    def start(self) -> None:
        """Create every actor without waiting for it (each imports torch and builds its envs meanwhile)."""
        self.env_pool.start()
        self.trainer_group.start()

    def release(self) -> None:
        """Stop the actors, or park them for the next run inside `warm_actors.reusing_actors()` (idempotent); the
        next use starts or takes others."""
        with self._lock:
            pool, group = self._env_pool, self._trainer_group
            self._env_pool = self._trainer_group = None
        if pool:
            pool.release()
        if group:
            group.release()
