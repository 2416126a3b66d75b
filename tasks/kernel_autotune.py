"""kernel_autotune: verify and time the candidates of the run's hot ops; winners cached per machine.

The tuner keeps its own on-disk cache keyed by op, shape bucket, dtype, device and library versions,
so a second run on the same machine is a cache hit; the task is not cached by Prefect on top of that
(a deleted tuning cache must trigger tuning again, not a stale "done").
"""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

import kernels
from rl_core.config import RunConfig
from tasks.caching import STEP_OPTIONS


@task(name="kernel_autotune", cache_policy=NO_CACHE, **STEP_OPTIONS)
def kernel_autotune(cfg: RunConfig) -> dict:
    """Tune GAE for this run's rollout shape; returns winners and whether each was a cache hit."""
    shape = {"T": cfg.rollout_steps, "N": cfg.num_workers * cfg.envs_per_worker}
    report = kernels.autotune("gae", [shape])
    return report.to_dict()
