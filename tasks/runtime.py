"""The process's Ray pools, one per run, shared by the step tasks (which run in the flow's threads)."""
from __future__ import annotations

import threading

from rl_core.config import RunConfig
from rl_core.runtime.env_pool import EnvWorkerPool
from rl_core.runtime.trainer_group import TrainerGroup

_lock = threading.Lock()
_env_pools: dict[str, EnvWorkerPool] = {}
_trainer_groups: dict[str, TrainerGroup] = {}


def env_pool(cfg: RunConfig) -> EnvWorkerPool:
    """The run's env-worker pool, created on first use."""
    with _lock:
        if cfg.run_url not in _env_pools:
            _env_pools[cfg.run_url] = EnvWorkerPool(cfg)
        return _env_pools[cfg.run_url]


def start_actors(cfg: RunConfig) -> None:
    """Create the run's env workers and trainer ranks without waiting for them (not a task: it only saves
    start-up time, each actor importing torch and building its envs while the caller goes on)."""
    env_pool(cfg).start()
    trainer_group(cfg).start()


def trainer_group(cfg: RunConfig) -> TrainerGroup:
    """The run's trainer group, created on first use and kept across iterations."""
    with _lock:
        if cfg.run_url not in _trainer_groups:
            _trainer_groups[cfg.run_url] = TrainerGroup(cfg)
        return _trainer_groups[cfg.run_url]


def release(cfg: RunConfig) -> None:
    """Stop the run's actors (end of a flow run)."""
    with _lock:
        pool = _env_pools.pop(cfg.run_url, None)
        group = _trainer_groups.pop(cfg.run_url, None)
    if pool:
        pool.shutdown()
    if group:
        group.shutdown()
