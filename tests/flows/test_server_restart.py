"""The Prefect server restarted while a deployment run is in flight: the run completes (on its own, or after a Retry
as from the UI), every version verifies, and the policy is bit-identical to the same run never disturbed."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rl_core.algos.base import policy_sha256
from rl_core.checkpoint import CheckpointStore
from tests.prefect_server import (
    PREFECT,
    REPO,
    flow_run_state,
    prefect,
    prefect_server,
    run_deployment,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

ITERATIONS = 16
"""Enough that the run is still iterating once the server has stopped: it is stopped (gracefully, which takes seconds)
once version 2 lands, and a quick iteration takes ~0.35 s; with 8 the run had sometimes finished by then."""
TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def _wait_terminal(flow_run_id: str, env: dict, worker: subprocess.Popen, timeout_s: float = 900) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        state = flow_run_state(flow_run_id, env)
        if state in TERMINAL:
            return state
        assert worker.poll() is None, "the worker stopped"
        assert time.monotonic() < deadline, f"still {state} after {timeout_s:.0f} s"
        time.sleep(3)


def test_a_deployment_run_survives_a_prefect_server_restart(tmp_path: Path) -> None:
    from rl_core.algos.ppo.in_process import train_in_process
    from rl_core.config.presets import build_control_config

    undisturbed = train_in_process(build_control_config("quick", run_name="undisturbed", seed=0, num_ranks=1,
                                                iterations=ITERATIONS))  # also tunes the kernels the flow looks up
    run = tmp_path / "runs" / "restarted"
    with prefect_server(tmp_path) as env:
        prefect(["work-pool", "create", "gymflow", "--type", "process"], env)
        prefect(["--no-prompt", "deploy", "--name", "train"], env)
        flow_run_id = run_deployment("train-control/train", {
            "preset": "quick", "run_name": "restarted", "seed": 0, "num_ranks": 1, "iterations": ITERATIONS,
            "store": f"file://{tmp_path}/runs"}, env)
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "gymflow"], env=env, cwd=REPO,
                                  start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 600
            while not (run / "checkpoints" / "versions" / "00000002.commit").exists():
                assert time.monotonic() < deadline and worker.poll() is None, "the run did not reach version 2"
                time.sleep(0.1)
            stop_server(env)  # mid-run: the flow run's state updates and the worker's polls fail meanwhile
            in_flight = len(list((run / "checkpoints" / "versions").glob("*.commit")))
            time.sleep(5)
            start_server(env)  # same port, same database
            state = _wait_terminal(flow_run_id, env, worker)
            retried = state != "COMPLETED"
            print(f"server down for the restart with {in_flight} versions committed; the run then {state}")
            if retried:  # as from the UI's Retry button
                prefect(["flow-run", "retry", flow_run_id], env)
                state = _wait_terminal(flow_run_id, env, worker)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
    assert state == "COMPLETED", f"after the restart{' and a retry' if retried else ''}: {state}"
    assert in_flight < ITERATIONS + 1, "the restart came after the run had finished"
    store = CheckpointStore(f"file://{run}/checkpoints")
    assert store.versions() == list(range(ITERATIONS + 1)) and store.verify()["errors"] == {}
    assert policy_sha256(store.load().tensors) == undisturbed.policy_sha256
