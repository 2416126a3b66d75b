"""checkpoint_diff: commit the iteration's state as a delta version (and version 0 at a run's start)."""
from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rl_core.algos.base import algorithm_of
from rl_core.checkpoint import CheckpointStore
from rl_core.config.agent import AnyRunConfig
from rl_core.data import read_tensors
from rl_core.runtime.agent.actors import AgentActors
from rl_core.runtime.commits import commit_initial, commit_iteration, remove_staged
from rl_core.runtime.control.actors import ControlActors
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="checkpoint_init", cache_policy=NO_CACHE, **STEP_OPTIONS)
def checkpoint_init(cfg: AnyRunConfig, actors: ControlActors | AgentActors, warm_start: str | None = None) -> dict:
    """Where the run stands: its newest committed version. A new run commits version 0 first: the seeded learner,
    or for an algorithm that starts from a warm start (GRPO) the learner its `sft_warm_start` step staged
    (`warm_start`); without that, such a run answers version None, and the flow runs the step and asks again.

    Never cached: it answers "where does this run stand now", which changes as the run goes on.
    """
    if not algorithm_of(cfg).warm_start:
        return _said(commit_initial(cfg, actors.trainer_group.initial_state))
    committed = commit_initial(cfg, (lambda: read_tensors(warm_start)[0]) if warm_start else None)
    if warm_start:
        remove_staged([warm_start])
    return _said(committed)


def _said(committed: dict) -> dict:
    """Warn (in the task's log) of each version set aside on the way to the newest valid one."""
    for message in committed["set_aside"]:
        get_run_logger().warning(message)
    return committed


@task(name="checkpoint_diff", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def checkpoint_diff(
    cfg: AnyRunConfig, incarnation: str, iteration: int, version: int, staged: str, experience: list[str],
    writer: CheckpointStore | None = None,
) -> dict:
    """Commit version+1 (learner, and env states where there are envs) as a lossless delta against `version`,
    through `writer` (the flow run's `CommitPipeline` keeps one store across its commits; None opens the store)."""
    return commit_iteration(cfg, iteration, version, staged, experience, writer)
