"""A failed run resumes from its last checkpoint and ends bit-identical to a run that never failed.

Faults are injected through GYMFLOW_FAULTS (rl_core/runtime/faults.py), which the flow hands to its Ray
actors; the SIGKILL test kills a real `python -m flows.tooling.cli train` process group mid-iteration.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

from rl_core.checkpoint import CheckpointStore
from tests.flows.flow_helpers import check_run_artifacts, inject_faults, kill_when, task_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "local_ray")]
ITERATIONS = 3
SEED = 11


def _run(store: str, name: str, **kwargs):
    from flows.train_control import train_control

    return train_control(preset="tiny", store=store, run_name=name, seed=SEED, iterations=ITERATIONS, **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run every resumed run must match bit for bit."""
    return _run(f"file://{tmp_path_factory.mktemp('ref')}", "reference")


@pytest.mark.parametrize("fault", ["rank=0,epoch=0", "rank=1,epoch=0,action=kill"],
                         ids=["exception-in-rank-0", "sigkill-of-rank-1"])
def test_train_shard_failure_is_retried_from_its_epoch_checkpoint(tmp_path, monkeypatch, reference,
                                                                 fault: str) -> None:
    """Rank 0 fails right after saving epoch 0 of iteration 1, or rank 1's process is SIGKILLed there: both shards
    retry (the group is started again), resume at epoch 1 where rank 0's save landed, and end bit-identical."""
    inject_faults(monkeypatch, tmp_path, f"train.epoch_end:iteration=1,{fault}")
    from flows.train_control import train_control

    state = train_control(preset="tiny", store=f"file://{tmp_path}/runs", run_name="retried", seed=SEED,
                          iterations=ITERATIONS, return_state=True)
    summary = state.result()
    assert summary["policy_sha256"] == reference["policy_sha256"]
    shards = [t for t in task_runs(state.state_details.flow_run_id) if t.name.startswith("train_shard")]
    retried = [t for t in shards if t.run_count > 1]
    assert retried, "the failing train_shard must have been retried by Prefect"
    results = [t.state.result() for t in retried]
    # The retried attempt resumed after the checkpointed epoch: it ran 1 of the 2 epochs, not both. A SIGKILL of
    # rank 1 may stop rank 0 (the group is torn down) before its save of epoch 0 lands: then it runs both.
    assert all(r["epochs_resumed"] == 1 for r in results) or "kill" in fault


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlapped"])
def test_simulate_failure_restores_envs_from_the_step_outputs(tmp_path, monkeypatch, reference,
                                                              overlap: bool) -> None:
    """simulate(2) runs from env state v2, whose commit starts only after simulate(2) and score(2) (with overlap,
    simulate(2) even runs while iteration 1 trains). Worker 0 fails after its rollout (its envs are then
    mid-change); the retry restores v2's envs from iteration 1's experience shards, and the run ends bit-identical
    to a run that never failed."""
    store = f"file://{tmp_path}/runs"
    expected = _run(store, "overlap-reference", overlap=True) if overlap else reference
    inject_faults(monkeypatch, tmp_path, "simulate.rollout_end:iteration=2,worker=0")
    from flows.train_control import train_control

    state = train_control(preset="tiny", store=store, run_name="simulate-retried", seed=SEED, iterations=ITERATIONS,
                          overlap=overlap, return_state=True)
    assert state.result()["policy_sha256"] == expected["policy_sha256"]
    retried = [t for t in task_runs(state.state_details.flow_run_id)
               if t.name.startswith("simulate") and t.run_count > 1]
    assert len(retried) == 1, "simulate of iteration 2 must have failed once and been retried"


def test_failed_flow_rerun_skips_completed_steps(tmp_path, monkeypatch, reference) -> None:
    """A fault outlasting the task retries fails the run; rerunning the same run continues where it stopped, even
    past a claim a killed commit left (the rerun withdraws it: iteration 1 still commits version 2)."""
    inject_faults(monkeypatch, tmp_path, "train.epoch_end:iteration=1,rank=0,epoch=1,count=3")
    store = f"file://{tmp_path}/runs"
    from flows.train_control import train_control

    with pytest.raises(Exception, match="injected fault|trainer rank"):
        _run(store, "rerun")
    assert CheckpointStore(f"{tmp_path}/runs/rerun/checkpoints").versions() == [0, 1]
    # and, as a run SIGKILLed mid-commit leaves, version 2's claim: a manifest without its commit marker
    claims = tmp_path / "runs" / "rerun" / "checkpoints" / "versions"
    (claims / "00000002.json").write_bytes((claims / "00000001.json").read_bytes())
    state = train_control(preset="tiny", store=store, run_name="rerun", seed=SEED, iterations=ITERATIONS,
                          return_state=True)
    assert state.result()["policy_sha256"] == reference["policy_sha256"]
    names = {t.name.rsplit("-", 1)[0]: t.state.name for t in task_runs(state.state_details.flow_run_id)
             if t.name.startswith(("simulate", "score"))}
    assert "Cached" in names.values(), f"iteration 1's simulate/score must come from cache, got {names}"
    check_run_artifacts(state.state_details.flow_run_id, "rerun", ITERATIONS, tmp_path / "runs" / "rerun")


def test_sigkill_mid_iteration_then_resume(tmp_path, reference) -> None:
    """SIGKILL the whole flow process group in iteration 2, once version 1 is committed; the same command finishes
    the run. Iteration 2's simulate stalls so that the kill lands there: a tiny iteration takes ~50 ms, and a kill
    timed by polling landed anywhere from mid-commit of version 2 (a claim, now a test of its own in
    test_failed_flow_rerun_skips_completed_steps) to after the run's end."""
    store = f"file://{tmp_path}/runs"
    cmd = [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--run-name", "killed",
           "--seed", str(SEED), "--iterations", str(ITERATIONS), "--store", store]
    faults = tmp_path / "faults"
    faults.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GYMFLOW_FAULT_DIR": str(faults),
           "GYMFLOW_FAULTS": "simulate.rollout_end:iteration=2,worker=0,action=stall"}
    versions = tmp_path / "runs" / "killed" / "checkpoints" / "versions"
    kill_when(cmd, env, lambda: (versions / "00000001.commit").exists() and any(faults.iterdir()), 180,
              "committed version 1 and stalled in iteration 2")
    assert CheckpointStore(f"{tmp_path}/runs/killed/checkpoints").versions() == [0, 1]
    launched = time.monotonic()
    done = subprocess.run(cmd, env=env, start_new_session=True, capture_output=True, text=True, timeout=600)
    process_s = time.monotonic() - launched
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["policy_sha256"] == reference["policy_sha256"]
    # start-up: from the process's start (imports included) to its first iteration, after the command's set-up
    assert summary["command_s"] - summary["wall_s"] < summary["startup_s"] < process_s - summary["loop_s"]


@pytest.mark.chaos
def test_sigkill_of_the_main_process_alone_leaves_nothing_running_then_resume(tmp_path, reference) -> None:
    """What the OOM killer does: SIGKILL the command's own process only. Everything it started (Prefect's temporary
    API server, Ray and its workers) ends by itself within a minute; the same command then finishes the run."""
    import psutil

    store = f"file://{tmp_path}/runs"
    cmd = [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--run-name", "oom",
           "--seed", str(SEED), "--iterations", str(ITERATIONS), "--store", store]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    versions = tmp_path / "runs" / "oom" / "checkpoints" / "versions"
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not (versions / "00000001.commit").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run never committed version 1"
        time.sleep(0.05)
    started = psutil.Process(proc.pid).children(recursive=True)
    assert any("uvicorn" in " ".join(p.cmdline()) for p in started), "the command's Prefect API is not a child"
    proc.kill()
    proc.wait()

    def running() -> list[str]:
        alive = []
        for p in started:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
            except psutil.NoSuchProcess:
                continue
        return alive

    deadline = time.monotonic() + 60
    while running() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = running()
    for p in started:  # never leave them to the next test, whatever the assertion says
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert not left, f"still running a minute after the command was killed: {left}"
    done = subprocess.run(cmd, env=env, start_new_session=True, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["policy_sha256"] == reference["policy_sha256"]


def _chunk_only_in(store: CheckpointStore, version: int) -> str:
    """A chunk object in storage that `version` added (no earlier version refers to it; not one embedded in it)."""
    def shas(v: int) -> set[str]:
        m = store.manifest(v)
        named = {c["chunk"] for e in m["tensors"].values() for c in e["chunks"] if c["codec"] != "same"}
        return named - m.get("embedded", {}).keys()

    older = set().union(*(shas(v) for v in range(version)))
    return sorted(shas(version) - older)[0]


@pytest.mark.chaos
def test_a_corrupt_newest_version_is_set_aside_and_the_rerun_ends_bit_identical(tmp_path, reference) -> None:
    """A chunk of the newest version corrupted on disk (bit rot, a torn write): the rerun warns, naming the run,
    version, tensor and chunk, continues from the version before it, and ends where the uninterrupted run ends."""
    from flows.train_control import train_control

    store_url = f"file://{tmp_path}/runs"
    train_control(preset="tiny", store=store_url, run_name="rotted", seed=SEED, iterations=ITERATIONS - 1)
    checkpoints = CheckpointStore(f"{tmp_path}/runs/rotted/checkpoints")
    sha = _chunk_only_in(checkpoints, ITERATIONS - 1)
    chunk = tmp_path / "runs" / "rotted" / "checkpoints" / "chunks" / sha[:2] / sha
    chunk.write_bytes(chunk.read_bytes()[:-7] + b"garbage")
    state = train_control(preset="tiny", store=store_url, run_name="rotted", seed=SEED, iterations=ITERATIONS,
                          return_state=True)
    assert state.result()["policy_sha256"] == reference["policy_sha256"]
    assert CheckpointStore(f"{tmp_path}/runs/rotted/checkpoints").verify()["errors"] == {}
    warned = [m for m in _log_messages(state.state_details.flow_run_id) if "fails verification" in m]
    assert len(warned) == 1 and f"version {ITERATIONS - 1}" in warned[0] and sha[:12] in warned[0]
    assert "rotted" in warned[0] and "set aside" in warned[0]
    assert [p.name for p in (tmp_path / "runs" / "rotted" / "checkpoints" / "set-aside").glob("*.commit")][0].startswith(
        f"{ITERATIONS - 1:08d}-")


def _log_messages(flow_run_id) -> list[str]:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read():
        async with get_client() as client:
            return await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))

    return [log.message for log in asyncio.run(read())]
