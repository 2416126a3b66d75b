"""The on-disk winner cache: tuning is slow, so a winner is measured once and reused by every later process.

Winners live in `$GYMFLOW_CACHE_DIR/kernels/winners.json` (default: the platform's user cache dir). An entry is
keyed by everything that can change which implementation is fastest or whether it is still the code that was
measured: op, shape bucket, dtype, device, torch and numpy versions, CPU model and flags (or GPU name), core and
thread count, and a hash of the implementations' sources. The cache is only an optimisation, so a corrupt file is
ignored with a warning.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
import warnings
from pathlib import Path

import numpy as np
import platformdirs
import torch

from gymflow_kernels.registry import Op

SCHEMA = 1
"""Version of the file layout; a file with another version is ignored (and rewritten by the next tune)."""


def cache_dir() -> Path:
    """Root of gymflow's cache: `$GYMFLOW_CACHE_DIR`, else the platform's user cache dir."""
    return _cache_dir(os.environ.get("GYMFLOW_CACHE_DIR"))


def winners_path() -> Path:
    """Where tuned winners are stored."""
    return _winners_path(os.environ.get("GYMFLOW_CACHE_DIR"))


# Memoised per setting: dispatch resolves the path on every call, and building Paths costs more than the lookup.
@functools.cache
def _cache_dir(configured: str | None) -> Path:
    return Path(configured) if configured else Path(platformdirs.user_cache_dir("gymflow"))


@functools.cache
def _winners_path(configured: str | None) -> Path:
    return _cache_dir(configured) / "kernels" / "winners.json"


def cache_key(op: Op, bucket: dict, dtype: str, device: str, num_threads: int) -> str:
    """The key a winner is stored under: one JSON string, so the file stays readable and diffable."""
    fields = {
        "op": op.name,
        "bucket": bucket,
        "dtype": dtype,
        "device": device,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu": cpu_signature(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "cpu_count": os.cpu_count(),
        "num_threads": num_threads,
        "sources": op.source_hash,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


@functools.cache
def cpu_signature() -> str:
    """Short hash of the CPU model and instruction-set flags: a winner (or a -march=native build) is only valid
    on the CPU it was made on."""
    described = platform.machine() + platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):  # Features: ARM's flags
                described += line
    except OSError:  # not Linux: the platform's own description is all there is
        pass
    return hashlib.sha256(described.encode()).hexdigest()[:12]


def read_entries(path: Path) -> dict[str, dict]:
    """All entries of the cache file; missing means empty, unreadable or corrupt means empty with a warning."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        _warn(path, f"{type(exc).__name__}: {exc}")
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
        _warn(path, f"expected a JSON object with schema {SCHEMA} and an 'entries' object")
        return {}
    return data["entries"]


def _warn(path: Path, problem: str) -> None:
    warnings.warn(
        f"ignoring kernel winner cache {path} ({problem}); reference kernels are used until `autotune` rewrites it",
        RuntimeWarning,
        stacklevel=3,
    )


def write_entry(path: Path, key: str, entry: dict) -> None:
    """Add or replace one entry; the file is swapped in atomically so a reader never sees half a file."""
    entries = read_entries(path)
    entries[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".winners.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"schema": SCHEMA, "entries": entries}, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class WinnerFile:
    """A lazily read view of one cache file that reloads when the file changes (another process tuned)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict] = {}
        self._stamp: tuple[int, int, int] | None = None

    def refresh(self) -> bool:
        """Re-read the file if it changed since the last look; returns whether it changed (one stat when not)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        self.entries = read_entries(self.path) if stamp else {}
        return True

    def winner(self, key: str) -> str | None:
        """Name of the stored winner for `key`, or None when that bucket was never tuned."""
        entry = self.entries.get(key)
        winner = entry.get("winner") if isinstance(entry, dict) else None
        return winner if isinstance(winner, str) else None
