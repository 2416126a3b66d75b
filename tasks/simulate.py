"""simulate: one rollout per env worker (Ray actors stepping batched MuJoCo) from a checkpoint version."""
from __future__ import annotations

import time

from prefect import get_run_logger, task

from rl_core.config.control import ControlRunConfig
from rl_core.runtime.control.actors import ControlActors
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="simulate", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def simulate(cfg: ControlRunConfig, actors: ControlActors, incarnation: str, iteration: int, version: int) -> dict:
    """Experience shard URIs and rollout metrics of `iteration`, acting with checkpoint `version`."""
    start = time.perf_counter()
    pool = actors.env_pool
    replaced = pool.health_check()  # a worker lost since the last step is replaced before, not during, this one
    if replaced:
        get_run_logger().warning("env workers %s were dead and have been replaced; they restore version %d",
                                 replaced, version)
    parts = pool.simulate(iteration, version)
    seconds = time.perf_counter() - start
    steps = sum(p["env_steps"] for p in parts)
    return {
        "experience": [p["uri"] for p in parts],
        "env_steps": steps,
        "seconds": seconds,
        "finished_returns": [r for p in parts for r in p["finished_returns"]],
    }
