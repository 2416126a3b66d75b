"""evaluate: deterministic-policy episodes of a committed version, next to a uniform-random policy."""
from __future__ import annotations

from prefect import task

from rl_core.config import RunConfig
from tasks.caching import STEP_OPTIONS, step_cache_key
from tasks.runtime import env_pool


@task(name="evaluate", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def evaluate(cfg: RunConfig, incarnation: str, version: int) -> dict:
    """Mean returns of `cfg.eval_episodes` full episodes, and the policy's sha256."""
    return env_pool(cfg).evaluate(version, cfg.eval_episodes)
