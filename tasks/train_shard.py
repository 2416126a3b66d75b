"""train_shard: rank `rank`'s part of the update; all K ranks run at once as one process group."""
from __future__ import annotations

from prefect import get_run_logger, task

from rl_core.config.control import ControlRunConfig
from rl_core.data import RunLayout
from rl_core.runtime.control.actors import ControlActors
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="train_shard", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def train_shard(cfg: ControlRunConfig, actors: ControlActors, incarnation: str, iteration: int, version: int, rank: int,
                scored: str) -> dict:
    """Train rank `rank` on `scored` from checkpoint `version`; rank 0 stages the new learner state."""
    metrics = actors.trainer_group.train(rank, iteration, version)
    if metrics.get("rolled_back") and rank == 0:
        get_run_logger().warning(
            "iteration %d: %d minibatch updates in a row had a NaN/inf loss or gradient (algorithm.nonfinite_limit); "
            "the update was discarded and the learner rolled back to version %d, whose weights the next version "
            "repeats", iteration, cfg.algorithm.nonfinite_limit, version)
    return {"rank": rank, "staged": RunLayout(cfg.run_url).staged_learner(iteration), **metrics}
