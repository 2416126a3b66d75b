"""What the flow tests share: the task runs of a flow run (read through the Prefect API), and fault injection."""
from __future__ import annotations

import asyncio
from pathlib import Path


def task_runs(flow_run_id) -> list:
    """Every task run of the flow run, with its name, run count and state."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    return asyncio.run(read())


def inject_faults(monkeypatch, tmp_path: Path, spec: str) -> None:
    """GYMFLOW_FAULTS for this test (the flow hands it to its Ray actors), markers in `tmp_path`."""
    monkeypatch.setenv("GYMFLOW_FAULTS", spec)
    monkeypatch.setenv("GYMFLOW_FAULT_DIR", str(tmp_path))
