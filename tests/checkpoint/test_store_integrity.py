"""CheckpointStore integrity: corrupt or missing chunks and manifests are reported with the tensor, version,
chunk and the newest loadable version; credentials never reach messages."""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore, ChunkCorruptError, ChunkMissingError, VersionNotFoundError
from tests.checkpoint.store_helpers import (
    DELTA_CODECS,
    assert_same_tensors,
    chunk_path,
    commit_manifest_as_is,
    fs_root,
    optimizer_step,
    policy_state,
    single_chunk_codec,
)


def _three_versions(url: str) -> tuple[CheckpointStore, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(7)
    store = CheckpointStore(url, embed_bytes=0)  # the objects in storage, not embedded: this file is about them
    states = [policy_state(7)]
    for _ in range(3):
        states.append(optimizer_step(states[-1], rng))
    for s in states:
        store.commit(s, {})
    return store, states


def test_corrupt_chunk_is_reported_with_tensor_version_chunk_and_fallback(url: str, caplog) -> None:
    store, states = _three_versions(url)
    path = chunk_path(store, url, 3, "w")
    fs = fs_root(url)[0]
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    sha = store.manifest(3)["tensors"]["w"]["chunks"][0]["chunk"]

    fresh = CheckpointStore(url)
    with pytest.raises(ChunkCorruptError) as info:
        fresh.load(3)
    msg = str(info.value)
    for part in (fresh.url, "version 3", "'w'", sha, "load(2)"):
        assert part in msg
    assert info.value.tensor == "w" and info.value.chunk == sha and info.value.loadable_version == 2

    with caplog.at_level(logging.WARNING, logger="rl_core.checkpoint"):
        snap = fresh.load()
    assert snap.version == 2
    assert_same_tensors(snap.tensors, states[2])
    assert any("version 3" in r.getMessage() and "Falling back to version 2" in r.getMessage() for r in caplog.records)


def test_missing_chunk_of_a_base_fails_every_version_built_on_it(url: str, caplog) -> None:
    rng = np.random.default_rng(7)
    store = CheckpointStore(url, full_every=2)  # 0 base, 1 delta, 2 base, 3 delta
    states = [policy_state(7)]
    for _ in range(3):
        states.append(optimizer_step(states[-1], rng))
    for s in states:
        store.commit(s, {})
    assert store.manifest(3)["base"] == 2 and single_chunk_codec(store, 3, "w") in DELTA_CODECS
    sha = store.manifest(2)["tensors"]["w"]["chunks"][0]["chunk"]
    assert store.manifest(3)["tensors"]["w"]["chunks"][0]["ref_chunk"] == sha
    fs_root(url)[0].rm_file(chunk_path(store, url, 2, "w"))

    fresh = CheckpointStore(url)
    with pytest.raises(ChunkMissingError) as info:
        fresh.load(3)
    msg = str(info.value)
    assert "version 3" in msg and "'w'" in msg and sha in msg and "stored with version 2" in msg and "load(1)" in msg
    assert_same_tensors(fresh.load(1).tensors, states[1])  # deltas are against their own base only
    with caplog.at_level(logging.WARNING, logger="rl_core.checkpoint"):
        snap = fresh.load()
    assert snap.version == 1
    assert_same_tensors(snap.tensors, states[1])
    assert sum("chunk missing" in r.getMessage() for r in caplog.records) == 2


def test_decoded_bytes_are_checked_against_the_manifests_hash(url: str) -> None:
    store, _ = _three_versions(url)
    fs, root = fs_root(url)
    path = f"{root}/versions/00000002.json"
    entry_hash = store.manifest(2)["tensors"]["b"]["chunks"][0]["raw_xxh3"]
    commit_manifest_as_is(url, 2, fs.cat_file(path).replace(entry_hash.encode(), b"0" * 32))
    with pytest.raises(ChunkCorruptError, match="hash of them") as info:
        CheckpointStore(url).load(2)
    assert "'b'" in str(info.value) and "load(1)" in str(info.value)


def test_schema_2_manifests_with_sha256_of_the_decoded_bytes_still_load(url: str) -> None:
    """Versions written before XXH3 (schema 2, raw_sha256) stay loadable and are still checked."""
    store, states = _three_versions(url)
    fs, root = fs_root(url)
    path = f"{root}/versions/00000002.json"
    manifest = json.loads(fs.cat_file(path))
    manifest["schema_version"] = 2
    snap = CheckpointStore(url).load(2)
    for name, entry in manifest["tensors"].items():
        raw = snap.tensors[name].reshape(-1).view(np.uint8)
        for chunk in entry["chunks"]:
            del chunk["raw_xxh3"]
            chunk["raw_sha256"] = hashlib.sha256(raw[chunk["offset"] : chunk["offset"] + chunk["nbytes"]]).hexdigest()
    commit_manifest_as_is(url, 2, json.dumps(manifest).encode(), legacy=True)
    assert_same_tensors(CheckpointStore(url).load(2).tensors, states[2])
    good = manifest["tensors"]["b"]["chunks"][0]["raw_sha256"]
    commit_manifest_as_is(url, 2, json.dumps(manifest).replace(good, "0" * 64).encode(), legacy=True)
    with pytest.raises(ChunkCorruptError, match="hash of them"):
        CheckpointStore(url).load(2)


def test_load_raises_when_no_version_is_loadable(url: str) -> None:
    store = CheckpointStore(url, embed_bytes=0)
    store.commit({"x": np.arange(10.0)}, {})
    fs_root(url)[0].pipe_file(chunk_path(store, url, 0, "x"), b"garbage")
    with pytest.raises(ChunkCorruptError, match="No older version is loadable"):
        CheckpointStore(url).load()


def test_a_fresh_store_on_an_unloadable_run_commits_a_full_snapshot(url: str, caplog) -> None:
    store = CheckpointStore(url, embed_bytes=0)
    store.commit({"x": np.arange(10.0)}, {})
    fs_root(url)[0].rm_file(chunk_path(store, url, 0, "x"))
    with caplog.at_level(logging.WARNING, logger="rl_core.checkpoint"):
        assert CheckpointStore(url).commit({"x": np.arange(10.0)}, {}) == 1
    assert "Committing a full snapshot" in caplog.text
    manifest = store.manifest(1)
    assert manifest["parent"] is None and single_chunk_codec(store, 1, "x") == "full"
    assert CheckpointStore(url).load().version == 1


def test_full_every_one_makes_every_version_full(url: str) -> None:
    store = CheckpointStore(url, full_every=1)
    for _ in range(3):
        store.commit({"x": np.zeros(100)}, {})
    assert [store.size_report(v)["codec_counts"]["full"] for v in range(3)] == [1, 1, 1]
    assert [store.manifest(v)["parent"] for v in range(3)] == [None, 0, 1]


def test_unknown_version_lists_the_available_ones(url: str) -> None:
    store = CheckpointStore(url)
    with pytest.raises(VersionNotFoundError, match="no committed versions"):
        store.load()
    store.commit({"x": np.zeros(3)}, {})
    store.commit({"x": np.ones(3)}, {})
    with pytest.raises(VersionNotFoundError, match=r"no version 5; committed versions: 0, 1") as info:
        store.load(5)
    assert info.value.available == [0, 1]
    with pytest.raises(VersionNotFoundError):
        store.manifest(5)
    assert store.versions() == [0, 1] and store.latest() == 1


def test_credentials_in_the_url_never_reach_messages() -> None:
    store = CheckpointStore("memory://user:hunter2@ckpt-redact/run?token=hunter2")
    with pytest.raises(VersionNotFoundError) as info:
        store.load(3)
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(store) and "ckpt-redact" in store.url
