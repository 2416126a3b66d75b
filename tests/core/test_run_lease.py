"""One writer per run: the run's lease is exclusive while its holder lives, and taken over from a holder that is gone
(the same flow run retried, a dead process on this machine, a stale heartbeat from elsewhere)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from rl_core.data import run_lease
from rl_core.data.run_lease import RunBusy, RunLease


def _lease_file(tmp_path):
    return tmp_path / "run" / "lease.json"


def _hold(tmp_path, holder: str | None = "flow-a") -> RunLease:
    lease = RunLease(f"file://{tmp_path}/run", "run", holder)
    lease.acquire()
    return lease


def test_a_held_run_refuses_a_second_flow_naming_the_holder(tmp_path) -> None:
    first = _hold(tmp_path)
    with pytest.raises(RunBusy, match=r"run 'run' at .* is being trained by another flow run \(flow run flow-a"):
        _hold(tmp_path, "flow-b")
    first.release()
    assert not _lease_file(tmp_path).exists()
    _hold(tmp_path, "flow-b").release()


def test_the_same_flow_run_retried_takes_its_lease_back(tmp_path) -> None:
    _hold(tmp_path, "flow-a")  # never released: the process "crashed" but is this one
    again = _hold(tmp_path, "flow-a")
    again.release()


def test_a_dead_holder_on_this_machine_or_a_silent_one_elsewhere_is_taken_over(tmp_path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lease = _hold(tmp_path, "flow-a")
    lease._stop.set()
    record = json.loads(_lease_file(tmp_path).read_text())
    _lease_file(tmp_path).write_text(json.dumps({**record, "pid": int(dead.stdout)}))
    _hold(tmp_path, "flow-b").release()
    _lease_file(tmp_path).write_text(json.dumps({**record, "host": "elsewhere", "heartbeat": time.time() - 3600}))
    _hold(tmp_path, "flow-c").release()
    _lease_file(tmp_path).write_text('{"flow_run": "torn')
    _hold(tmp_path, "flow-d").release()


def test_the_holder_keeps_its_lease_fresh_and_never_removes_another_holders(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(run_lease, "HEARTBEAT_S", 0.05)
    lease = _hold(tmp_path, "flow-a")
    before = json.loads(_lease_file(tmp_path).read_text())["heartbeat"]
    time.sleep(0.3)
    assert json.loads(_lease_file(tmp_path).read_text())["heartbeat"] > before
    record = json.loads(_lease_file(tmp_path).read_text())
    _lease_file(tmp_path).write_text(json.dumps({**record, "pid": record["pid"] + 1_000_000, "flow_run": "other"}))
    lease.release()
    assert json.loads(_lease_file(tmp_path).read_text())["flow_run"] == "other"
