"""A command's temporary Prefect API records nothing nobody can read (task runs, events, logs, heartbeats) and is sent
no events, a flow still runs on it to completion, and the command never imports Prefect's server (it runs in its own
process); a configured API is left as it is. Each case runs in a fresh interpreter: the test session has its own API
configured."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import contextlib, json, sys, time
import psutil
from prefect import flow, get_client, task
from prefect.settings import get_current_settings
from flows.tooling.startup import api_for_the_run, start_temporary_api

@task
def double(x: int) -> int:
    return 2 * x

@flow
def tiny() -> int:
    return double(21)

async def task_runs(flow_run_id):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        return run.state.type.value, len(runs)

lean = sys.argv[1] == "lean"
api = start_temporary_api() if lean else None
with api_for_the_run(api):
    state = tiny(return_state=True)
    if lean:
        server = api.process
    else:
        from prefect.server.api.server import SubprocessASGIServer
        server = SubprocessASGIServer().server_process
    environ = psutil.Process(server.pid).environ()
    listening = {c.laddr.ip for c in psutil.Process(server.pid).net_connections(kind="tcp") if c.status == "LISTEN"}
    server_imported = "prefect.server.api.server" in sys.modules
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker
    event_emitted = emit_event("gymflow.test", {"prefect.resource.id": "gymflow.test"}) is not None
    import asyncio
    deadline = time.monotonic() + 8
    while True:  # the recorder works behind the API: wait for the task run (lean: for the same time, for none)
        flow_state, recorded = asyncio.run(task_runs(state.state_details.flow_run_id))
        if recorded or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    print(json.dumps({"result": state.result(), "flow_state": flow_state, "task_runs": recorded,
                      "recorder": environ.get("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED"),
                      "logs_to_api": get_current_settings().logging.to_api.enabled,
                      "heartbeat_s": get_current_settings().flows.heartbeat_frequency,
                      "listening": sorted(listening), "server_imported": server_imported,
                      "event_emitted": event_emitted}))
assert EventsWorker._client_override is None, "Prefect's events client was not restored after the run"
if lean:
    api.stop()
    assert server.poll() is not None, "the temporary API outlived its stop()"
'''


def _run(mode: str, tmp_path: Path) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    environ.update(PREFECT_HOME=str(tmp_path / mode), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], check=False, capture_output=True, text=True,
                          env=environ, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_temporary_api_records_no_task_runs_and_still_runs_the_flow(tmp_path) -> None:
    plain = _run("plain", tmp_path)
    assert plain == {"result": 42, "flow_state": "COMPLETED", "task_runs": 1, "recorder": None, "logs_to_api": True,
                     "heartbeat_s": 180, "listening": ["127.0.0.1"], "server_imported": True,
                     "event_emitted": True}
    lean = _run("lean", tmp_path)
    assert lean == {"result": 42, "flow_state": "COMPLETED", "task_runs": 0, "recorder": "False",
                    "logs_to_api": False, "heartbeat_s": None, "listening": ["127.0.0.1"], "server_imported": False,
                    "event_emitted": False}


def test_a_configured_api_keeps_its_records() -> None:
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from flows.tooling.startup import api_for_the_run, start_temporary_api

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        api = start_temporary_api()
        assert api is None
        with api_for_the_run(api):
            settings = get_current_settings()
            assert settings.api.url == "http://127.0.0.1:9/api"
            assert settings.logging.to_api.enabled
            assert settings.server.services.task_run_recorder.enabled
            assert settings.flows.heartbeat_frequency == 180  # a lasting server detects crashed runs by them


def test_a_temporary_api_that_cannot_start_is_a_clear_error(tmp_path, monkeypatch) -> None:
    """A server that exits before answering (here: its Python cannot import the app) names its status and the way
    out, instead of waiting for the start-up timeout."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.tooling.startup import TemporaryApi

    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "uvicorn.py").write_text("raise SystemExit(7)\n")  # `python -m uvicorn` finds this one first
    with temporary_settings(updates={PREFECT_API_URL: None}):
        api = TemporaryApi()
        api.start()
        with pytest.raises(RuntimeError, match="exited with status 7 .*PREFECT_API_URL"):
            api.wait()
        api.stop()
