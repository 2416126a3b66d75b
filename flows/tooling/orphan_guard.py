"""Ends what a command started when the command itself dies without cleaning up (SIGKILL, the OOM killer).

A command's children (Prefect's temporary API server, Ray's GCS, raylet and agents, their workers) are stopped by
the command at exit; a command killed outright never gets there, and some would live on as orphans (the API server,
a large process, and Ray's dashboard and runtime-env agents, one set more per crash). `guard()` starts a small
watcher, in a session of its own, that follows the command's process tree while the command runs; once the command
is gone, whichever way it went, it stops what is left of that tree (SIGTERM, then SIGKILL after a grace period),
checking each process's start time so that a reused process id is never signalled.

    python -m flows.tooling.orphan_guard PARENT_PID
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

POLL_S = 0.5
GRACE_S = 5.0


def guard() -> None:
    """Stop this process's descendants once it is gone (for commands whose children must not outlive them)."""
    subprocess.Popen([sys.executable, "-m", "flows.tooling.orphan_guard", str(os.getpid())], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def _tree(parent: psutil.Process) -> dict[int, float]:
    """pid -> start time of every descendant of `parent` now (this watcher excluded)."""
    found = {}
    try:
        children = parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            if child.pid != os.getpid():
                found[child.pid] = child.create_time()
        except psutil.NoSuchProcess:
            continue
    return found


def _alive(tree: dict[int, float]) -> list[psutil.Process]:
    alive = []
    for pid, started in tree.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


def main(argv: list[str]) -> int:
    parent_pid = int(argv[0])
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return 0
    seen: dict[int, float] = {}
    while os.getppid() == parent_pid:  # re-parented once the command is gone, whatever ended it
        seen.update(_tree(parent))
        time.sleep(POLL_S)
    for stop, wait_s in ((psutil.Process.terminate, GRACE_S), (psutil.Process.kill, 0.0)):
        for proc in _alive(seen):
            try:
                stop(proc)
            except psutil.NoSuchProcess:
                continue
        deadline = time.monotonic() + wait_s
        while _alive(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
