"""One writer per run: a lease in the run's folder (`<run>/lease.json`) held by the flow run that trains it.

Two flow runs of the same run name at once (a nightly run and a rerun started from the UI, say) would interleave
their steps' outputs under one folder. The first to take the lease trains; another stops at its start with an error
naming the holder. The holder rewrites the lease every `HEARTBEAT_S` seconds and removes it when it ends. A lease is
taken over, with no wait, from a holder that is gone: the same flow run again (Prefect's Retry), a process on this
machine that no longer runs (a crash, kill -9), or a holder whose heartbeat is older than `STALE_S` (another
machine that died). Creation is exclusive (the checkpoint store's own primitive), so of two starters one wins.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

from rl_core.checkpoint.objects import StoreObjects

HEARTBEAT_S = 10.0
STALE_S = 90.0


class RunBusy(RuntimeError):
    """Another flow run holds the run's lease."""


def pid_runs(pid: int) -> bool:
    """Whether process `pid` of this machine runs (another user's counts; a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped) answers signal 0 too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class RunLease:
    """`acquire()` at a run's start, `release()` at its end (also when it fails)."""

    def __init__(self, run_url: str, run_name: str, holder_id: str | None) -> None:
        self._objects = StoreObjects(run_url)
        self._path = f"{self._objects.root}/lease.json"
        self.run_url, self.run_name = run_url, run_name
        self.holder = {"flow_run": holder_id, "host": socket.gethostname(), "pid": os.getpid()}
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _record(self) -> bytes:
        return json.dumps({**self.holder, "heartbeat": time.time()}).encode()

    def _current(self) -> dict[str, Any] | None:
        try:
            return json.loads(self._objects.read_fresh(self._path))
        except FileNotFoundError:
            return None
        except ValueError:  # torn or foreign: nobody can be holding it through that
            return {}

    def _gone(self, held: dict[str, Any]) -> bool:
        if not held or (self.holder["flow_run"] and held.get("flow_run") == self.holder["flow_run"]):
            return True
        if held.get("host") == self.holder["host"] and isinstance(held.get("pid"), int) and not pid_runs(held["pid"]):
            return True
        return time.time() - float(held.get("heartbeat", 0)) > STALE_S

    def acquire(self) -> None:
        """Take the lease (or take it over from a holder that is gone), then keep it fresh; RunBusy if held."""
        for _ in range(3):
            try:
                self._objects.create_exclusive(self._path, self._record())
                break
            except FileExistsError:
                held = self._current()
                if held is not None and not self._gone(held):
                    age = time.time() - float(held.get("heartbeat", 0))
                    raise RunBusy(f"run {self.run_name!r} at {self.run_url} is being trained by another flow run "
                                  f"(flow run {held.get('flow_run')}, process {held.get('pid')} on "
                                  f"{held.get('host')}, alive {age:.0f} s ago); wait for it to end, stop it, or start "
                                  "this one with another run name") from None
                self._objects.discard(self._path)  # a holder that is gone: take over (exclusively, next pass)
        else:
            raise RunBusy(f"run {self.run_name!r} at {self.run_url}: could not take its lease (contended)")
        self._beat = threading.Thread(target=self._heartbeat, name="run-lease", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            held = self._current()
            if held and held.get("pid") == self.holder["pid"] and held.get("host") == self.holder["host"]:
                self._objects.put_whole(self._path, self._record())

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if this process still holds it."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        held = self._current()
        if held and held.get("pid") == self.holder["pid"] and held.get("host") == self.holder["host"]:
            self._objects.discard(self._path)
