"""How the legacy store beside this script was made: with the code of commit
2455d0d26e58fe67c98ab4ac49b705d7a2998c38, ``python tests/checkpoint/data/make_legacy_store.py``.

Why it exists: ``tests/checkpoint/test_legacy_store.py`` loads that store with today's code, so a change to the
codecs, the manifest or the restore path that stops old stores from loading fails a test. Each version is built
so that every codec appears: v0 a full base; v1 and v2 deltas with "diff" (Adam-like steps), "xor" (one flipped
low bit per element), "rows" (a few changed rows of an embedding table), "same" (a frozen tensor), and a tensor
new since the base ("full" in v1, then "same" against v1); v3 a new base (``full_every=3``); v4 a delta on it.
Writes the store to ``store-<short commit>/`` and, beside it, ``store-<short commit>.json``: per version, per
tensor, the sha256 of its raw bytes, its dtype, shape and logical dtype, plus the version's meta and the
zstandard version that compressed it. Run it only from a checkout of that commit (it refuses to overwrite an
existing store). The test also calls :func:`write_store` to check that today's code still writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from rl_core.checkpoint import CheckpointStore  # noqa: E402

CHUNK_BYTES = 2048


def _states() -> list[tuple[dict[str, np.ndarray], dict[str, str], dict]]:
    """(tensors, logical dtypes, meta) of each version, in commit order."""
    rng = np.random.default_rng(20240607)
    state = {
        "step": rng.standard_normal(1024).astype(np.float32),  # 2 chunks
        "flip": rng.standard_normal(1024).astype(np.float32),
        "emb": rng.standard_normal((128, 16)).astype(np.float32),  # 64-B rows, 32 rows per chunk
        "frozen": rng.integers(0, 255, 512, dtype=np.uint8),
        "big_endian": rng.standard_normal(64).astype(">f4"),
        "bf16": rng.integers(0, 2**16, 256, dtype=np.uint16),
        "counter": np.array(0, dtype=np.int64),
    }
    logical = {"bf16": "bfloat16"}
    out = [(state, logical, {"step": 0, "note": "base"})]
    for v in range(1, 5):
        new = {k: a.copy() for k, a in out[-1][0].items()}
        n = new["step"].size
        new["step"] -= np.float32(0.02) * np.sign(rng.standard_normal(n)).astype(np.float32)
        new["flip"] = (new["flip"].view(np.uint32) ^ (np.uint32(1) << rng.integers(0, 8, n).astype(np.uint32))).view(
            np.float32
        )
        new["emb"][rng.choice(128, 2, replace=False)] += np.float32(0.01)
        new["big_endian"] += np.float32(1e-3)
        new["bf16"][:8] += 1
        new["counter"] = np.array(v, dtype=np.int64)
        if v == 1:
            new["late"] = rng.standard_normal(300).astype(np.float32)  # new since the base: "full", then "same"
        out.append((new, logical, {"step": v, "lr": 3e-4, "nan": float("nan"), "tags": ["a", v]}))
    return out


def _expected(tensors: dict[str, np.ndarray], logical: dict[str, str], meta: dict) -> dict:
    return {
        "meta": meta,
        "tensors": {
            name: {
                "dtype": arr.dtype.str, "shape": list(arr.shape), "logical_dtype": logical.get(name),
                "sha256": hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest(),
            }
            for name, arr in tensors.items()
        },
    }


def write_store(url: str, **options: int) -> dict:
    """Commit every state to a new store at ``url``; returns the expected content (the JSON written beside it).
    ``options``: more CheckpointStore settings (the test turns off what the legacy code did not have)."""
    store = CheckpointStore(url, full_every=3, chunk_bytes=CHUNK_BYTES, workers=1, **options)
    expected: dict = {"chunk_bytes": CHUNK_BYTES, "zstandard": zstandard.__version__, "versions": {}}
    for tensors, logical, meta in _states():
        version = store.commit(tensors, meta, logical_dtypes={k: v for k, v in logical.items() if k in tensors})
        expected["versions"][str(version)] = _expected(tensors, logical, meta)
    return expected


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    short = commit.stdout.strip()[:7]
    target = Path(__file__).resolve().parent / f"store-{short}"
    if target.exists():
        raise SystemExit(f"{target} exists; delete it first to regenerate")
    expected = {"commit": commit.stdout.strip(), **write_store(f"file://{target}")}
    store = CheckpointStore(f"file://{target}")
    for v in store.versions():
        print(v, store.size_report(v)["codec_counts"])
    (target.parent / f"store-{short}.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")

if __name__ == "__main__":
    main()
