"""train_shard: rank `shard`'s part of the PPO update; all K shards run at once as one process group."""
from __future__ import annotations

from prefect import task

from rl_core.config import RunConfig
from rl_core.data import RunLayout
from tasks.caching import STEP_OPTIONS, step_cache_key
from tasks.runtime import trainer_group


@task(name="train_shard", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def train_shard(cfg: RunConfig, incarnation: str, iteration: int, version: int, shard: int, scored: str) -> dict:
    """Train rank `shard` on `scored` from checkpoint `version`; rank 0 stages the new learner state."""
    metrics = trainer_group(cfg).train(shard, iteration, version)
    return {"shard": shard, "staged": RunLayout(cfg.run_url).staged_learner(iteration), **metrics}
