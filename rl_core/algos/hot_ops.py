"""The ops a run dispatches through `kernels`, with the shapes and thread counts it calls them at: what to tune."""
from __future__ import annotations

import gymflow_kernels as kernels
from rl_core.algos.base import Calls, algorithm_of, spaces_for
from rl_core.config.control import ControlRunConfig


def hot_ops(cfg: ControlRunConfig, num_ranks: int = 1, trainer_threads: int | None = None,
            env_worker_threads: int | None = None) -> Calls:
    """Each op the run's algorithm dispatches, with the thread count of the process that calls it (winners are
    looked up by it), for `num_ranks` trainer ranks. The defaults describe `train_in_process`: one process calls
    everything."""
    return algorithm_of(cfg).hot_ops(cfg, spaces_for(cfg), num_ranks, trainer_threads, env_worker_threads)


def tune_hot_ops(calls: Calls) -> list[kernels.TuneReport]:
    """Tune each op at its shape and thread count: a cache hit (milliseconds) once this machine has tuned it."""
    return [kernels.autotune(op, [shape], num_threads=threads) for op, (shape, threads) in calls.items()]
