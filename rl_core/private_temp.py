"""Temp folders a process owns: removed by `close`, at exit (an uncaught exception and SIGTERM included) and, after a
SIGKILL that nothing can catch, by the next process that makes one with the same prefix.

A command or benchmark makes one its temp dir (`use_private_temp_dir`): `tempfile`'s default here and TMPDIR for the
processes it starts, so that what libraries leave in the temp dir (vLLM's FileStore file and sockets, a child's own
temp folders) goes with it. Two things stay where their libraries document them, in the temp dir outside: Ray's
session folders (RAY_TMPDIR: Ray keeps a session's logs after it ends on purpose, and its socket paths must stay
short) and torch's compile cache (TORCHINDUCTOR_CACHE_DIR: meant to outlive a command).
"""
from __future__ import annotations

import getpass
import glob
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from pathlib import Path

from rl_core.data.run_lease import pid_runs


def _remove(path: str, owner: int) -> None:
    """Remove `path` unless this is a forked child of its owner (whose exit must not take the parent's folder)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def remove_orphaned(prefix: str) -> list[str]:
    """Remove the folders `<temp dir>/<prefix><pid>-<mkdtemp's 8 characters>` whose process is gone; the folders
    removed. A live process's folder, or any other name (a trainer group's `gymflow-<run>-ranks-<pid>-*` whose run
    name starts like a prefix, a plain `mkdtemp`'s), is left alone."""
    ours = re.compile(rf"{re.escape(prefix)}(\d+)-[a-z0-9_]{{8}}")
    removed = []
    for path in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), f"{glob.escape(prefix)}*")):
        match = ours.fullmatch(os.path.basename(path))
        if match and not pid_runs(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class PrivateTempDir:
    """A new folder `<temp dir>/<prefix><pid>-<random>`, removed by `close`, when garbage collected, or at exit."""

    def __init__(self, prefix: str) -> None:
        remove_orphaned(prefix)
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
        self._remove = weakref.finalize(self, _remove, str(self.path), os.getpid())

    def close(self) -> None:
        """Remove the folder and everything in it (a second call does nothing)."""
        self._remove()


_process_temp_dir: PrivateTempDir | None = None  # held for the process's life: dropped, it would be removed at once


def use_private_temp_dir(prefix: str) -> Path:
    """Make a new `PrivateTempDir` this process's temp dir and its children's (TMPDIR) until it exits; its path (the
    same one for every later call in the process: a test running several commands).

    SIGTERM then ends the process through `sys.exit` (when its handler is still Python's default, which ends the
    process on the spot, running no exit handler), so the folder goes after a SIGTERM too.
    """
    global _process_temp_dir
    if _process_temp_dir is not None and _process_temp_dir.path.is_dir():  # a second command in this process
        return _process_temp_dir.path
    outside = tempfile.gettempdir()
    os.environ.setdefault("RAY_TMPDIR", outside)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(outside, f"torchinductor_{_torch_user()}"))
    _process_temp_dir = PrivateTempDir(prefix)
    os.environ["TMPDIR"] = tempfile.tempdir = str(_process_temp_dir.path)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return _process_temp_dir.path


def _torch_user() -> str:
    """The user part of torch's default compile cache folder (torch/_inductor/runtime/cache_dir_utils.py)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return re.sub(r'[\\/:*?"<>|]', "_", user)
