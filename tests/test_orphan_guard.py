"""flows.tooling.orphan_guard: a command SIGKILLed outright takes what it started with it; one that ends normally leaves the
guard nothing to do."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

PARENT = """
import subprocess, sys, time
from flows.tooling.orphan_guard import guard
guard()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(float(sys.argv[1]))
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _start(seconds: float) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(seconds)], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = int(parent.stdout.readline())
    time.sleep(1.5)  # the guard has seen the child
    return parent, child


def test_a_killed_commands_children_are_stopped() -> None:
    parent, child = _start(600)
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone(child, 15), "the orphaned child still runs"
    finally:
        if not _gone(child, 0.1):
            os.kill(child, signal.SIGKILL)


def test_after_a_normal_exit_the_guard_ends_too() -> None:
    parent, child = _start(0.1)
    parent.wait()
    assert _gone(child, 15)  # the child was ours: once the command is gone it is stopped too
    guards = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
              and "flows.tooling.orphan_guard" in " ".join(p.info["cmdline"]) and str(parent.pid) in p.info["cmdline"]]
    assert all(_gone(g.pid, 15) for g in guards)
