"""kernel_autotune: verify and time the candidates of the run's hot ops; winners cached per machine.

The tuner keeps its own on-disk cache keyed by op, shape bucket, dtype, device and library versions,
so a second run on the same machine is a cache hit; the task is not cached by Prefect on top of that
(a deleted tuning cache must trigger tuning again, not a stale "done"). The per-candidate report is
shown as a table artifact (re-made on every run, cache hits included).
"""
from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

import kernels
from rl_core.config import RunConfig
from tasks.caching import STEP_OPTIONS


@task(name="kernel_autotune", cache_policy=NO_CACHE, **STEP_OPTIONS)
def kernel_autotune(cfg: RunConfig) -> dict:
    """Tune GAE for this run's rollout shape; returns winners and whether each was a cache hit."""
    shape = {"T": cfg.rollout_steps, "N": cfg.num_workers * cfg.envs_per_worker}
    report = kernels.autotune("gae", [shape])
    fast = {p: kernels.fast_p([report], p) for p in (1.0, 1.5)}
    create_table_artifact(
        key="kernel-autotune", table=report.rows(),
        description=f"Kernel candidates per shape bucket; fast_1.0 = {fast[1.0]:.0%}, fast_1.5 = {fast[1.5]:.0%}.",
    )
    return report.to_dict()
