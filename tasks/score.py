"""score: the algorithm's scoring (GAE for PPO, through `kernels.dispatch`) of one iteration's experience."""
from __future__ import annotations

from prefect import task

from rl_core.algos.base import algorithm_of
from rl_core.config.control import ControlRunConfig
from rl_core.data import RunLayout, read_tensors, write_tensors
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="score", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def score(cfg: ControlRunConfig, incarnation: str, iteration: int, version: int, experience: list[str]) -> dict:
    """Read the experience shards, score them, write the batch every train shard reads."""
    parts, metas = zip(*(read_tensors(uri) for uri in experience))
    scored = algorithm_of(cfg).score(cfg, list(parts), list(metas))
    uri = RunLayout(cfg.run_url).scored(iteration)
    size = write_tensors(uri, scored, {"iteration": iteration, "version": version})
    return {"scored": uri, "bytes": size}
