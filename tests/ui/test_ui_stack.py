"""`make ui` / `make ui-stop` (python -m flows.tooling.ui_stack): server, pool, deployments and a worker come up on a free
loopback port; a second start says so; a taken port is named; stop ends exactly what start recorded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from flows.tooling import ui_stack
from tests.prefect_server import REPO, api_post, free_port, prefect

pytestmark = pytest.mark.slow


def _ui_stack(args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GYMFLOW_UI_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "flows.tooling.ui_stack", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/health", timeout=2):
            return True
    except OSError:
        return False


def test_start_deploys_and_runs_a_worker_and_stop_ends_exactly_those_processes(tmp_path) -> None:
    home, port = tmp_path / "ui", free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        started = _ui_stack(["start", "--port", str(port)], home)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "The gymflow UI is ready" in started.stdout and f"{url}/deployments" in started.stdout
        assert f"export PREFECT_API_URL={url}/api" in started.stdout
        state = json.loads((home / "state.json").read_text())
        assert state["url"] == url and set(state["processes"]) == {"server", "worker"}
        assert (home / "prefect" / "prefect.db").exists()  # the database lives in the stack's own home

        env = ui_stack.prefect_env(home, state["api_url"])
        listed = prefect(["deployment", "ls"], env)
        for name in ("train-control/nightly", "train-control/train", "train-agent/agent-nightly",
                     "train-agent/agent-train"):
            assert name in listed
        workers = api_post(env, "work_pools/gymflow/workers/filter", {})
        assert state["worker_name"] in {w["name"] for w in workers}

        again = _ui_stack(["start", "--port", str(port)], home)
        assert again.returncode == 0 and "already running" in again.stdout, again.stdout + again.stderr
        assert json.loads((home / "state.json").read_text())["processes"] == state["processes"]

        elsewhere = _ui_stack(["start", "--port", str(port)], tmp_path / "other")
        assert elsewhere.returncode == 2
        assert f"port {port} on 127.0.0.1 is in use by a Prefect server" in elsewhere.stderr, elsewhere.stderr
        assert not (tmp_path / "other" / "state.json").exists()
    finally:
        stopped = _ui_stack(["stop"], home)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "server: stopped" in stopped.stdout and "worker: stopped" in stopped.stdout
    assert not (home / "state.json").exists()
    assert not any(ui_stack._group_members(p["pid"], p["started"]) for p in state["processes"].values())
    assert not _answers(url)
    assert "No gymflow UI to stop" in _ui_stack(["stop"], home).stdout
