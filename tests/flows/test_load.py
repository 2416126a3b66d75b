"""Load: runs that share a store or a server do not interfere, and a queue of deployment runs drains completely.

`make load` runs these (pytest -m load; minutes each), `make test` leaves them out.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from rl_core.algos.base import policy_sha256
from rl_core.checkpoint import CheckpointStore
from tests.prefect_server import PREFECT, REPO, api_call, api_post, prefect, prefect_server

pytestmark = [pytest.mark.slow, pytest.mark.load]

SEEDS = (0, 1, 2, 3)


def _verified_policy(run_dir: Path, versions: int) -> str:
    """The final policy's sha256, after checking that every version 0..`versions` is committed and verifies."""
    store = CheckpointStore(f"file://{run_dir}/checkpoints")
    assert store.versions() == list(range(versions + 1)), (run_dir, store.versions())
    assert store.verify()["errors"] == {}, run_dir
    return policy_sha256(store.load().tensors)


def test_four_runs_in_parallel_on_one_store_equal_their_solo_runs(tmp_path) -> None:
    """Four `gymflow train` commands at once (each its own Prefect API and Ray) write four runs into one store;
    each run's final policy equals the same configuration trained alone, in one process."""
    from rl_core.algos.ppo.in_process import train_in_process
    from rl_core.config.presets import build_control_config

    options = {"num_ranks": 1, "iterations": 3}
    solo = {seed: train_in_process(build_control_config("tiny", run_name=f"solo-{seed}", seed=seed, **options)).policy_sha256
            for seed in SEEDS}  # also tunes the kernels first, so the four runs look up the same winners
    assert len(set(solo.values())) == len(SEEDS)
    store = tmp_path / "runs"
    procs = {seed: subprocess.Popen(
        [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--seed", str(seed), "--num-ranks", "1",
         "--iterations", "3", "--run-name", f"parallel-{seed}", "--store", f"file://{store}"],
        env={**os.environ, "PREFECT_HOME": str(tmp_path / f"prefect-{seed}")}, cwd=REPO, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for seed in SEEDS}
    outputs = {seed: proc.communicate(timeout=900)[0] for seed, proc in procs.items()}
    for seed, proc in procs.items():
        assert proc.returncode == 0, outputs[seed][-3000:]
        summary = json.loads(outputs[seed].strip().splitlines()[-1])
        assert summary["policy_sha256"] == solo[seed], f"run {seed} differs from its solo run"
        assert _verified_policy(store / f"parallel-{seed}", 3) == summary["policy_sha256"]
    assert sorted(p.name for p in store.iterdir()) == [f"parallel-{s}" for s in SEEDS]


QUEUED = 20


def _api_get(env: dict, path: str) -> object:
    return api_call(f"{env['PREFECT_API_URL']}/{path}")


def test_twenty_queued_deployment_runs_drain_through_one_worker(tmp_path) -> None:
    """20 runs of the `train` deployment queued at once on a pool that runs one at a time; one worker drains them:
    every one COMPLETED, every run's versions committed and verifying, all 20 (same seed) the same policy."""
    store = tmp_path / "runs"
    with prefect_server(tmp_path) as env:
        prefect(["work-pool", "create", "gymflow", "--type", "process"], env)
        prefect(["work-pool", "set-concurrency-limit", "gymflow", "1"], env)
        prefect(["--no-prompt", "deploy", "--name", "train"], env)
        deployment = _api_get(env, "deployments/name/" + urllib.parse.quote("train-control/train"))
        ids = [api_post(env, f"deployments/{deployment['id']}/create_flow_run",
                        {"parameters": {"preset": "tiny", "run_name": f"queued-{i:02d}", "store": f"file://{store}"}}
                        )["id"] for i in range(QUEUED)]
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "gymflow"], env=env, cwd=REPO,
                                  start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 40 * 60
            while True:
                runs = api_post(env, "flow_runs/filter", {"flow_runs": {"id": {"any_": ids}}, "limit": QUEUED})
                states = {r["id"]: r["state"]["type"] for r in runs}
                if all(s in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for s in states.values()):
                    break
                assert worker.poll() is None, "the worker stopped"
                assert time.monotonic() < deadline, f"not drained in 40 min: {sorted(states.values())}"
                time.sleep(5)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
    assert sorted(states.values()) == ["COMPLETED"] * QUEUED, states
    policies = {_verified_policy(store / f"queued-{i:02d}", 2) for i in range(QUEUED)}
    assert len(policies) == 1
