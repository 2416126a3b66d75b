"""What the flow tests share: the task runs of a flow run (read through the Prefect API), fault injection, and a
command killed mid-way."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def task_runs(flow_run_id) -> list:
    """Every task run of the flow run, with its name, run count and state."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    return asyncio.run(read())


def artifacts(flow_run_id) -> dict[str, object]:
    """The flow run's artifacts by key (the newest of each key), progress artifacts included."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))

    return {a.key: a for a in sorted(asyncio.run(read()), key=lambda a: a.created)}


def check_run_artifacts(flow_run_id, run_name: str, iterations: int, run_dir: Path) -> None:
    """A flow run shows its whole run: progress at 100%, a metrics row per iteration (earlier flow runs' included),
    the learning curve embedded in the summary and stored as a PNG, the checkpoint lineage; TensorBoard events."""
    import json

    shown = artifacts(flow_run_id)
    assert {f"{run_name}-{k}" for k in ("progress", "metrics", "summary", "checkpoints")} <= set(shown), sorted(shown)
    assert float(shown[f"{run_name}-progress"].data) == 100.0
    table = shown[f"{run_name}-metrics"].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert [row["iteration"] for row in rows] == list(range(1, iterations + 1))
    assert "![learning curve](data:image/png;base64," in shown[f"{run_name}-summary"].data
    assert (run_dir / "reports" / "learning-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lineage = shown[f"{run_name}-checkpoints"].data
    lineage = json.loads(lineage) if isinstance(lineage, str) else lineage
    assert [row["version"] for row in lineage] == list(range(iterations + 1))
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


def inject_faults(monkeypatch, tmp_path: Path, spec: str) -> None:
    """GYMFLOW_FAULTS for this test (the flow hands it to its Ray actors), markers in `tmp_path`."""
    monkeypatch.setenv("GYMFLOW_FAULTS", spec)
    monkeypatch.setenv("GYMFLOW_FAULT_DIR", str(tmp_path))


def kill_when(cmd: list[str], env: dict[str, str], ready: Callable[[], bool], timeout_s: float, waiting_for: str
              ) -> None:
    """Start `cmd` in a session of its own, wait until `ready()`, then SIGKILL its whole process group (the command,
    its Prefect API and its Ray: a machine that died) and the Ray workers that can outlive the group. Fails with the
    command's output if it ends first, or with `waiting_for` after `timeout_s`. The output goes to a file, not a
    pipe: nobody reads it while the command runs, and a full pipe would stall a chatty command."""
    from rl_core.runtime.local_ray import kill_local_ray_of

    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while not ready():
                if proc.poll() is not None:
                    output.seek(0)
                    raise AssertionError(output.read().decode()[-3000:])
                assert time.monotonic() < deadline, f"never {waiting_for}"
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kill_local_ray_of(proc.pid)
