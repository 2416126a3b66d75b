"""evaluate: deterministic-policy episodes of a committed version, next to a uniform-random policy."""
from __future__ import annotations

from prefect import task

from rl_core.config import RunConfig
from rl_core.runtime.actors import RunActors
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="evaluate", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def evaluate(cfg: RunConfig, actors: RunActors, incarnation: str, version: int) -> dict:
    """Mean returns of `cfg.eval_episodes` full episodes, and the policy's sha256."""
    return actors.env_pool.evaluate(version, cfg.eval_episodes)
