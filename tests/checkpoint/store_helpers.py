"""Helpers shared by the CheckpointStore tests: store files on disk, states that change like a policy's, and a
byte-exact comparison."""

from __future__ import annotations

import fsspec
import numpy as np

from rl_core.checkpoint import CheckpointStore
from rl_core.checkpoint.manifest import commit_marker


def fs_root(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def commit_manifest_as_is(url: str, version: int, data: bytes, *, legacy: bool = False) -> None:
    """Replace a committed version's manifest by ``data`` and its commit marker by one recording it, as if the
    writer had committed that manifest (``legacy``: an empty marker, as written before markers held its sha256)."""
    fs, root = fs_root(url)
    fs.pipe_file(f"{root}/versions/{version:08d}.json", data)
    fs.pipe_file(f"{root}/versions/{version:08d}.commit", b"" if legacy else commit_marker(data))


def chunk_path(store: CheckpointStore, url: str, version: int, tensor: str) -> str:
    sha = store.manifest(version)["tensors"][tensor]["chunks"][0]["chunk"]
    return f"{fs_root(url)[1]}/chunks/{sha[:2]}/{sha}"


def single_chunk_codec(store: CheckpointStore, version: int, tensor: str) -> str:
    """Codec of a single-chunk tensor (every tensor in this file is smaller than one chunk)."""
    chunks = store.manifest(version)["tensors"][tensor]["chunks"]
    assert len(chunks) == 1
    return chunks[0]["codec"]


def all_files(url: str) -> list[str]:
    fs, root = fs_root(url)
    return sorted(fs.find(root)) if fs.exists(root) else []


def chunk_files(url: str) -> list[str]:
    return [p for p in all_files(url) if "/chunks/" in p]


def assert_same_tensors(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Byte-exact: same names, dtypes (incl. byte order), shapes and bytes."""
    assert actual.keys() == expected.keys()
    for name, exp in expected.items():
        got = actual[name]
        assert got.dtype == exp.dtype and got.dtype.str == exp.dtype.str, name
        assert got.shape == exp.shape, name
        assert got.tobytes() == np.ascontiguousarray(exp).tobytes(), name


def policy_state(seed: int, n: int = 4096) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal(n).astype(np.float32),
        "b": rng.standard_normal(64),
        "steps": np.array(0, dtype=np.int64),
        "frozen": rng.integers(0, 255, 256, dtype=np.uint8),
    }


DELTA_CODECS = ("diff", "xor")  # which of the two is smaller for a chunk is the encoder's call


def optimizer_step(state: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A small optimizer-like update: a few weights move, the counter ticks, "frozen" stays put."""
    new = {k: v.copy() for k, v in state.items()}
    idx = rng.choice(new["w"].size, 40, replace=False)
    new["w"][idx] += rng.standard_normal(40).astype(np.float32) * 1e-3
    new["b"] += 1e-6
    new["steps"] += 1
    return new
