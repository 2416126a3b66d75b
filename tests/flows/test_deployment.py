"""The operator's path, end to end on 127.0.0.1: server, work pool, deploy, `deployment run`, worker, COMPLETED.

This is README's "Deployments" walk-through as a test: every command is the real `prefect` CLI.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefect(args: list[str], env: dict, timeout: float = 120) -> str:
    done = subprocess.run([PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture
def prefect_server(tmp_path) -> dict:
    """`prefect server start` on a free loopback port with its own PREFECT_HOME; stopped afterwards."""
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp_path / "results"),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", None)
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "prefect server did not start"
                time.sleep(0.5)
        yield env
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_deploy_run_and_worker_complete_the_run(prefect_server: dict, tmp_path) -> None:
    env = prefect_server
    _prefect(["work-pool", "create", "gymflow", "--type", "process"], env)
    _prefect(["--no-prompt", "deploy", "--all"], env)
    listed = _prefect(["deployment", "ls"], env)
    assert "train-control/nightly" in listed and "train-control/train" in listed
    assert "train-agent/agent-nightly" in listed and "train-agent/agent-train" in listed
    out = _prefect(["deployment", "run", "train-control/train", "--param", "preset=tiny", "--param",
                    "run_name=deployed", "--param", f"store=file://{tmp_path}/runs"], env)
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    _prefect(["worker", "start", "--pool", "gymflow", "--run-once"], env, timeout=600)
    assert _state(flow_run_id, env) == "COMPLETED"
    assert (tmp_path / "runs" / "deployed" / "checkpoints" / "versions" / "00000002.commit").exists()

    # A run that fails (a fault outlasting the task retries), then "Retry" as from the UI: it completes,
    # bit-identical to the run that never failed.
    failing = _prefect(["deployment", "run", "train-control/train", "--param", "preset=tiny", "--param",
                        "run_name=retried", "--param", f"store=file://{tmp_path}/runs"], env)
    failing_id = re.search(r"UUID:\s*([0-9a-f-]{36})", failing).group(1)
    faults = {**env, "GYMFLOW_FAULTS": "train.epoch_end:iteration=1,rank=0,epoch=1,count=3",
              "GYMFLOW_FAULT_DIR": str(tmp_path)}
    subprocess.run([PREFECT, "worker", "start", "--pool", "gymflow", "--run-once"], env=faults, cwd=REPO,
                   capture_output=True, timeout=600)
    assert _state(failing_id, env) == "FAILED"
    _prefect(["flow-run", "retry", failing_id], env)
    _prefect(["worker", "start", "--pool", "gymflow", "--run-once"], faults, timeout=600)
    assert _state(failing_id, env) == "COMPLETED"
    assert _final_policy(tmp_path / "runs" / "retried") == _final_policy(tmp_path / "runs" / "deployed")


def test_agent_deployment_runs_through_a_worker(prefect_server: dict, tmp_path) -> None:
    env = prefect_server
    _prefect(["work-pool", "create", "gymflow", "--type", "process"], env)
    _prefect(["--no-prompt", "deploy", "--name", "agent-train"], env)
    out = _prefect(["deployment", "run", "train-agent/agent-train", "--param", "preset=tiny", "--param",
                    "run_name=agent-deployed", "--param", "temperature=0.8", "--param", f"store=file://{tmp_path}/runs"],
                   env)
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    _prefect(["worker", "start", "--pool", "gymflow", "--run-once"], env, timeout=600)
    assert _state(flow_run_id, env) == "COMPLETED"
    run = tmp_path / "runs" / "agent-deployed"
    assert (run / "checkpoints" / "versions" / "00000002.commit").exists()
    assert json.loads((run / "run.json").read_text())["config"]["sampling"]["temperature"] == 0.8


def _state(flow_run_id: str, env: dict) -> str:
    return json.loads(_prefect(["flow-run", "inspect", flow_run_id, "--output", "json"], env))["state"]["type"]


def _final_policy(run_dir: Path) -> str:
    from rl_core.algos.base import policy_sha256
    from rl_core.checkpoint import CheckpointStore

    return policy_sha256(CheckpointStore(f"file://{run_dir}/checkpoints").load().tensors)
