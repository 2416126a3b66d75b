"""A fork of a run against a full copy of it: bytes written and seconds.

Builds a run of `--versions` versions by committing them directly through CheckpointStore (a learner-like state:
weights and two Adam moments of `--params` float32 each, every entry moving a little each version), then forks its
newest version (`CheckpointStore.fork`: a pin, a manifest and a commit marker) and copies its folder whole with
fsspec (what forking a run costs without forks). `gymflow fork` also verifies the version it forks (every object
read and hashed): `verify_s`. Each figure is the median of `--repeats`.

    python bench/fork.py [--versions 100] [--params 250000] [--repeats 3] [--store file:///some/dir]

Last line: one JSON object with the run's size, the fork's and the copy's bytes written and seconds, and their ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import fsspec
import numpy as np

from rl_core.checkpoint import CheckpointStore
from rl_core.private_temp import use_private_temp_dir


def build_run(url: str, versions: int, params: int) -> CheckpointStore:
    """A run's checkpoints: `versions` versions of weights and Adam moments that all move a little each time."""
    rng = np.random.default_rng(0)
    state = {name: rng.standard_normal(params).astype(np.float32) for name in ("w", "adam.m", "adam.v")}
    store = CheckpointStore(url)
    for i in range(versions):
        state = {name: x + np.float32(1e-3) * rng.standard_normal(params).astype(np.float32)
                 for name, x in state.items()}
        store.commit(state, {"iteration": i})
    return store


def du(fs: fsspec.AbstractFileSystem, path: str) -> int:
    return int(fs.du(path)) if fs.exists(path) else 0


def measure_fork(store: str, versions: int, params: int, repeats: int) -> dict[str, float]:
    """Build the run under `store`, then fork it and copy it `repeats` times: the run's bytes and the medians of each
    fork's and copy's bytes written and seconds (and of the forked version's verification)."""
    fs, root = fsspec.core.url_to_fs(store)
    root = root.rstrip("/")
    parent = build_run(f"{store}/parent/checkpoints", versions, params)
    newest = parent.latest()
    run_bytes = du(fs, f"{root}/parent")

    fork_s, fork_bytes, copy_s, copy_bytes, verify_s = [], [], [], [], []
    for i in range(repeats):
        before = du(fs, root)
        started = time.perf_counter()
        parent.fork(f"{store}/fork-{i}/checkpoints", [newest], lineage={"run": "parent"})
        fork_s.append(time.perf_counter() - started)
        fork_bytes.append(du(fs, root) - before)
        started = time.perf_counter()
        assert CheckpointStore(f"{store}/fork-{i}/checkpoints").verify(newest)["errors"] == {}
        verify_s.append(time.perf_counter() - started)

        before = du(fs, root)
        started = time.perf_counter()
        fs.copy(f"{root}/parent", f"{root}/copy-{i}", recursive=True)
        copy_s.append(time.perf_counter() - started)
        copy_bytes.append(du(fs, root) - before)
    return {"run_bytes": run_bytes, "fork_bytes": statistics.median(fork_bytes), "fork_s": statistics.median(fork_s),
            "verify_s": statistics.median(verify_s), "copy_bytes": statistics.median(copy_bytes),
            "copy_s": statistics.median(copy_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=100)
    parser.add_argument("--params", type=int, default=250_000, help="float32 entries of each of the 3 tensors")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", help="fsspec URL to build the runs under (default: a private temp dir)")
    args = parser.parse_args()
    store = args.store or f"file://{use_private_temp_dir('gymflow-bench-fork-')}/runs"
    measured = measure_fork(store, args.versions, args.params, args.repeats)
    print(json.dumps({
        "versions": args.versions,
        "state_mb": round(3 * args.params * 4 / 1e6, 1),
        "run_mb": round(measured["run_bytes"] / 1e6, 1),
        "fork_bytes": int(measured["fork_bytes"]),
        "fork_s": round(measured["fork_s"], 4),
        "verify_s": round(measured["verify_s"], 3),
        "copy_bytes": int(measured["copy_bytes"]),
        "copy_s": round(measured["copy_s"], 3),
        "bytes_ratio": round(measured["copy_bytes"] / measured["fork_bytes"]),
        "time_ratio": round(measured["copy_s"] / measured["fork_s"], 1),
    }))


if __name__ == "__main__":
    main()
