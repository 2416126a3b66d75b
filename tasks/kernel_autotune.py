"""kernel_autotune: verify and time the candidates of the run's hot ops; winners cached per machine.

The tuner keeps its own on-disk cache keyed by op, shape bucket, dtype, device and library versions,
so a second run on the same machine is a cache hit; the task is not cached by Prefect on top of that
(a deleted tuning cache must trigger tuning again, not a stale "done"). The per-candidate report is
shown as a table artifact (re-made on every run, cache hits included).
"""
from __future__ import annotations

import json

import fsspec
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

import gymflow_kernels as kernels
from rl_core.algos.hot_ops import hot_ops, tune_hot_ops
from rl_core.config.control import ControlRunConfig
from rl_core.config.threads import ENV_WORKER_THREADS, learner_threads
from rl_core.data import RunLayout
from tasks.artifact_keys import artifact_key
from tasks.caching import STEP_OPTIONS


@task(name="kernel_autotune", cache_policy=NO_CACHE, **STEP_OPTIONS)
def kernel_autotune(cfg: ControlRunConfig) -> dict:
    """Tune the run's hot ops for its shapes; returns winners and whether each was a cache hit. The report
    is also written into the run's folder, so the run records which implementations computed it."""
    reports = tune_hot_ops(hot_ops(cfg, cfg.num_ranks, learner_threads(cfg), ENV_WORKER_THREADS))
    fast = {p: kernels.fast_p(reports, p) for p in (1.0, 1.5)}
    create_table_artifact(
        key=artifact_key(cfg.run_name, "kernel-autotune"), table=[row for report in reports for row in report.rows()],
        description=f"Kernel candidates per shape bucket; fast_1.0 = {fast[1.0]:.0%}, fast_1.5 = {fast[1.5]:.0%}.",
    )
    result = {"ops": [report.to_dict() for report in reports], "fast_1.0": fast[1.0], "fast_1.5": fast[1.5]}
    fs, path = fsspec.core.url_to_fs(RunLayout(cfg.run_url).kernel_report)
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.pipe_file(path, json.dumps(result, indent=2).encode())
    return result
