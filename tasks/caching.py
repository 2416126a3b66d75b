"""Cache keys of the steps: (run, incarnation, iteration, step, shard, input version).

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
    """`run/incarnation/iteration/step/shard/vN`: the same inputs in the same run give the same key."""
    cfg = parameters["cfg"]
    return "/".join([
        cfg.run_name,
        parameters["incarnation"],
        f"iter{parameters.get('iteration', '-')}",
        context.task.name,
        f"shard{parameters.get('shard', '-')}",
        f"v{parameters.get('version', '-')}",
    ])
