"""checkpoint_diff: commit the iteration's state as a delta version (and version 0 at a run's start)."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from rl_core.config import RunConfig
from rl_core.runtime.actors import RunActors
from rl_core.runtime.commits import commit_initial, commit_iteration
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="checkpoint_init", cache_policy=NO_CACHE, **STEP_OPTIONS)
def checkpoint_init(cfg: RunConfig, actors: RunActors, incarnation: str) -> dict:
    """Newest committed version of the run, committing the seeded version 0 for a new run.

    Never cached: it answers "where does this run stand now", which changes as the run goes on.
    """
    return commit_initial(cfg, actors.trainer_group.initial_state())


@task(name="checkpoint_diff", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def checkpoint_diff(
    cfg: RunConfig, incarnation: str, iteration: int, version: int, staged: str, experience: list[str]
) -> dict:
    """Commit version+1 (learner + env states) as a lossless delta against `version`."""
    return commit_iteration(cfg, iteration, version, staged, experience)
