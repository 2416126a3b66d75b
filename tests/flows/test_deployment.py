"""The operator's path, end to end on 127.0.0.1: server, work pool, deploy, `deployment run`, worker, COMPLETED.

This is docs/guides/ui-and-deployments.md's deployments walk-through ("Without make ui", "From a shell") as a test:
every command is the real `prefect` CLI.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.prefect_server import PREFECT, REPO, flow_run_state, prefect, prefect_server, run_deployment

pytestmark = pytest.mark.slow


@pytest.fixture
def server_env(tmp_path) -> dict:
    """The environment that reaches a `prefect server start` of this test (tests/prefect_server.py)."""
    with prefect_server(tmp_path) as env:
        yield env


def test_deploy_run_and_worker_complete_the_run(server_env: dict, tmp_path) -> None:
    env = server_env
    prefect(["work-pool", "create", "gymflow", "--type", "process"], env)
    prefect(["--no-prompt", "deploy", "--all"], env)
    listed = prefect(["deployment", "ls"], env)
    assert "train-control/nightly" in listed and "train-control/train" in listed
    assert "train-agent/agent-nightly" in listed and "train-agent/agent-train" in listed
    flow_run_id = run_deployment("train-control/train", {"preset": "tiny", "run_name": "deployed",
                                                          "store": f"file://{tmp_path}/runs"}, env)
    prefect(["worker", "start", "--pool", "gymflow", "--run-once"], env, timeout=600)
    assert flow_run_state(flow_run_id, env) == "COMPLETED"
    assert (tmp_path / "runs" / "deployed" / "checkpoints" / "versions" / "00000002.commit").exists()

    # A run that fails (a fault outlasting the task retries), then "Retry" as from the UI: it completes,
    # bit-identical to the run that never failed.
    failing_id = run_deployment("train-control/train", {"preset": "tiny", "run_name": "retried",
                                                         "store": f"file://{tmp_path}/runs"}, env)
    faults = {**env, "GYMFLOW_FAULTS": "train.epoch_end:iteration=1,rank=0,epoch=1,count=3",
              "GYMFLOW_FAULT_DIR": str(tmp_path)}
    subprocess.run([PREFECT, "worker", "start", "--pool", "gymflow", "--run-once"], env=faults, cwd=REPO,
                   capture_output=True, timeout=600)
    assert flow_run_state(failing_id, env) == "FAILED"
    prefect(["flow-run", "retry", failing_id], env)
    prefect(["worker", "start", "--pool", "gymflow", "--run-once"], faults, timeout=600)
    assert flow_run_state(failing_id, env) == "COMPLETED"
    assert _final_policy(tmp_path / "runs" / "retried") == _final_policy(tmp_path / "runs" / "deployed")


def test_agent_deployment_runs_through_a_worker(server_env: dict, tmp_path) -> None:
    env = server_env
    prefect(["work-pool", "create", "gymflow", "--type", "process"], env)
    prefect(["--no-prompt", "deploy", "--name", "agent-train"], env)
    flow_run_id = run_deployment("train-agent/agent-train", {"preset": "tiny", "run_name": "agent-deployed",
                                                              "temperature": 0.8, "store": f"file://{tmp_path}/runs"},
                                 env)
    prefect(["worker", "start", "--pool", "gymflow", "--run-once"], env, timeout=600)
    assert flow_run_state(flow_run_id, env) == "COMPLETED"
    run = tmp_path / "runs" / "agent-deployed"
    assert (run / "checkpoints" / "versions" / "00000002.commit").exists()
    assert json.loads((run / "run.json").read_text())["config"]["sampling"]["temperature"] == 0.8


def _final_policy(run_dir: Path) -> str:
    from rl_core.algos.base import policy_sha256
    from rl_core.checkpoint import CheckpointStore

    return policy_sha256(CheckpointStore(f"file://{run_dir}/checkpoints").load().tensors)
