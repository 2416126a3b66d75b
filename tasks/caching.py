"""Cache keys of the steps: (run, incarnation, iteration, step, rank, input version).

Keys are built from inputs, not from the flow-run id, so rerunning a failed run — Prefect's "Retry",
or the same command with the same run name — skips every step that already completed and continues
at the first one that did not. Results are persisted as JSON (never pickle).
"""
from __future__ import annotations

from typing import Any

from prefect.context import TaskRunContext

STEP_OPTIONS: dict[str, Any] = {
    "persist_result": True,
    "result_serializer": "json",
    "retries": 2,
    "retry_delay_seconds": 2,
}


def step_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """`run/incarnation/iteration/step/rank/vN`: the same inputs in the same run give the same key (a live
    object such as the run's actors is never part of it)."""
    cfg = parameters["cfg"]
    return "/".join([
        cfg.run_name,
        parameters["incarnation"],
        f"iter{parameters.get('iteration', '-')}",
        context.task.name,
        f"rank{parameters.get('rank', '-')}",
        f"v{parameters.get('version', '-')}",
    ])


def step_incarnation(incarnation: str, start: dict[str, Any]) -> str:
    """The incarnation the run's steps are cached under, from checkpoint_init's answer (`start`): after a version
    was set aside (it failed verification), the steps cached after the version before it describe state that no
    longer exists, so they run again under a new key."""
    return incarnation if not start.get("lineage") else f"{incarnation}-lineage{start['lineage']}"
