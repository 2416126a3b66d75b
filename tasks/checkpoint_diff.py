"""checkpoint_diff: commit the iteration's state as a delta version (and version 0 at a run's start)."""
from __future__ import annotations

import threading

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from rl_core.algos.base import algorithm_of
from rl_core.checkpoint import CheckpointStore
from rl_core.config.agent import AnyRunConfig
from rl_core.data import read_tensors
from rl_core.runtime.agent.actors import AgentActors
from rl_core.runtime.commits import commit_initial, commit_iteration, remove_staged, writer_store
from rl_core.runtime.control.actors import ControlActors
from tasks.caching import STEP_OPTIONS, step_cache_key
from tasks.sft_warm_start import sft_warm_start


@task(name="checkpoint_init", cache_policy=NO_CACHE, **STEP_OPTIONS)
def checkpoint_init(cfg: AnyRunConfig, actors: ControlActors | AgentActors, incarnation: str) -> dict:
    """Newest committed version of the run; for a new run, version 0 is committed first: the seeded learner, or
    for an algorithm that starts from a warm start (GRPO) the result of the `sft_warm_start` step (cached itself).

    Never cached: it answers "where does this run stand now", which changes as the run goes on.
    """
    if not algorithm_of(cfg).warm_start:
        return _said(commit_initial(cfg, actors.trainer_group.initial_state))
    staged: list[str] = []

    def warm_started() -> dict:
        staged.append(sft_warm_start(cfg, actors, incarnation)["staged"])
        return read_tensors(staged[0])[0]

    committed = commit_initial(cfg, warm_started)
    remove_staged(staged)
    return _said(committed)


def _said(committed: dict) -> dict:
    """Warn (in the task's log) of each version set aside on the way to the newest valid one."""
    for message in committed["set_aside"]:
        get_run_logger().warning(message)
    return committed


@task(name="checkpoint_diff", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def checkpoint_diff(
    cfg: AnyRunConfig, incarnation: str, iteration: int, version: int, staged: str, experience: list[str]
) -> dict:
    """Commit version+1 (learner, and env states where there are envs) as a lossless delta against `version`."""
    return commit_iteration(cfg, iteration, version, staged, experience, _flow_run_writer(cfg))


_writer_lock = threading.Lock()
_writer: tuple[tuple[str, str], CheckpointStore] | None = None  # (flow run id, run URL) and its store


def _flow_run_writer(cfg: AnyRunConfig) -> CheckpointStore:
    """The store this flow run commits through, kept across its iterations (see `commit_iteration`). Keyed by the
    flow run: while it lives, the run's lease makes it the run's only writer; a rerun opens the store afresh."""
    global _writer
    key = (str(TaskRunContext.get().task_run.flow_run_id), cfg.run_url)
    with _writer_lock:
        if _writer is None or _writer[0] != key:
            _writer = (key, writer_store(cfg))
        return _writer[1]


def release_flow_run_writer() -> None:
    """Drop the kept store at the flow run's end: it holds the base's tensors, which a long-lived worker process
    would otherwise keep until its next run."""
    global _writer
    with _writer_lock:
        _writer = None
