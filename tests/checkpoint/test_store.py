"""CheckpointStore: exact restores across delta chains, integrity errors and fallback, the commit protocol
under races and failures, and the memory://, file:// and s3:// backends."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from datetime import datetime

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import (
    CheckpointStore,
    ChunkCorruptError,
    ChunkMissingError,
    VersionConflictError,
    VersionNotFoundError,
)

# ------------------------------------------------------------------------------------------------ helpers


def _fs_root(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def _chunk_path(store: CheckpointStore, url: str, version: int, tensor: str) -> str:
    sha = store.manifest(version)["tensors"][tensor]["chunks"][0]["chunk"]
    return f"{_fs_root(url)[1]}/chunks/{sha[:2]}/{sha}"


def _codec(store: CheckpointStore, version: int, tensor: str) -> str:
    """Codec of a single-chunk tensor (every tensor in this file is smaller than one chunk)."""
    chunks = store.manifest(version)["tensors"][tensor]["chunks"]
    assert len(chunks) == 1
    return chunks[0]["codec"]


def _all_files(url: str) -> list[str]:
    fs, root = _fs_root(url)
    return sorted(fs.find(root)) if fs.exists(root) else []


def _chunk_files(url: str) -> list[str]:
    return [p for p in _all_files(url) if "/chunks/" in p]


def assert_same_tensors(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Byte-exact: same names, dtypes (incl. byte order), shapes and bytes."""
    assert actual.keys() == expected.keys()
    for name, exp in expected.items():
        got = actual[name]
        assert got.dtype == exp.dtype and got.dtype.str == exp.dtype.str, name
        assert got.shape == exp.shape, name
        assert got.tobytes() == np.ascontiguousarray(exp).tobytes(), name


def _policy_state(seed: int, n: int = 4096) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal(n).astype(np.float32),
        "b": rng.standard_normal(64),
        "steps": np.array(0, dtype=np.int64),
        "frozen": rng.integers(0, 255, 256, dtype=np.uint8),
    }


DELTA_CODECS = ("diff", "xor")  # which of the two is smaller for a chunk is the encoder's call


def _step(state: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A small optimizer-like update: a few weights move, the counter ticks, "frozen" stays put."""
    new = {k: v.copy() for k, v in state.items()}
    idx = rng.choice(new["w"].size, 40, replace=False)
    new["w"][idx] += rng.standard_normal(40).astype(np.float32) * 1e-3
    new["b"] += 1e-6
    new["steps"] += 1
    return new


# -------------------------------------------------------------------------------------------- round trips


def test_round_trip_is_byte_exact_for_many_dtypes_and_shapes(url: str) -> None:
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64_scalar": np.array(np.pi),
        "i64_empty": np.zeros((0, 5), dtype=np.int64),
        "u8": rng.integers(0, 256, 17, dtype=np.uint8),
        "flag": np.array([True, False, True]),
        "c64": (rng.standard_normal(5) + 1j).astype(np.complex64),
        "big_endian": np.arange(6, dtype=">f8").reshape(2, 3),
        "strided": rng.standard_normal((6, 8))[::2, ::3].T,
        "nan_bits": np.frombuffer(np.array([0x7FC00001, 0xFFC12345], np.uint32).tobytes(), np.float32),
    }
    meta = {"iteration": 7, "rng": {"state": 2**100 + 3}, "config": {"lr": 3e-4, "layers": [64, 64]}}
    version = CheckpointStore(url).commit(tensors, meta)
    assert version == 0
    snap = CheckpointStore(url).load()  # a fresh store: nothing cached
    assert snap.version == 0 and snap.meta == meta
    assert_same_tensors(snap.tensors, tensors)
    for arr in snap.tensors.values():
        assert arr.flags.writeable and arr.flags.owndata and arr.flags.c_contiguous


def test_caller_may_mutate_arrays_after_commit_and_after_load(url: str) -> None:
    store = CheckpointStore(url)
    state = _policy_state(1)
    kept = {k: v.copy() for k, v in state.items()}
    store.commit(state, {})
    state["w"][:] = 0  # must not leak into the stored version nor into the store's delta reference
    snap = store.load(0)
    snap.tensors["w"][:] = 1
    store.commit(kept, {})
    assert _codec(store, 1, "w") == "same"
    assert_same_tensors(CheckpointStore(url).load(1).tensors, kept)


def test_delta_chain_over_several_full_snapshots_restores_every_version(url: str) -> None:
    rng = np.random.default_rng(2)
    store = CheckpointStore(url, full_every=3)
    state = _policy_state(2)
    history = []
    for i in range(10):
        if i == 4:
            state["new"] = np.arange(10, dtype=np.int32)  # appears: no parent entry -> full
        if i == 5:
            state["b"] = state["b"].astype(np.float32)  # dtype change -> full
        if i == 7:
            state["new"] = np.arange(12, dtype=np.int32)  # shape change -> full
            del state["frozen"]
        assert store.commit(state, {"i": i}) == i
        history.append({k: v.copy() for k, v in state.items()})
        state = _step(state, rng)

    for v in (0, 3, 6, 9):
        assert store.size_report(v)["codec_counts"]["full"] == len(store.manifest(v)["tensors"])
        assert store.manifest(v)["depth"] == 0 and store.manifest(v)["base"] is None
    assert _codec(store, 1, "w") in DELTA_CODECS and _codec(store, 1, "frozen") == "same"
    assert _codec(store, 4, "new") == "full"
    assert _codec(store, 5, "b") == "full" and _codec(store, 7, "new") == "full"
    assert _codec(store, 5, "new") == "same"  # a tensor new since the base is the reference of later deltas
    m2 = store.manifest(2)
    assert m2["parent"] == 1 and m2["depth"] == 2 and m2["base"] == 0
    assert m2["tensors"]["w"]["chunks"][0]["ref_version"] == 0  # against the base, not chained to version 1

    fresh = CheckpointStore(url)
    for v in [9, 0, 5, 2, 8, 1, 7, 3, 6, 4]:
        snap = fresh.load(v)
        assert snap.version == v and snap.meta == {"i": v}
        assert_same_tensors(snap.tensors, history[v])


def test_unchanged_tensors_cost_no_new_chunk(url: str) -> None:
    store = CheckpointStore(url)
    state = _policy_state(3)
    store.commit(state, {})
    before = _chunk_files(url)
    store.commit(state, {"again": True})
    assert _chunk_files(url) == before
    report = store.size_report(1)
    assert report["encoded_bytes"] == 0 and report["codec_counts"] == {"full": 0, "diff": 0, "xor": 0, "rows": 0, "same": 4}
    chunk = store.manifest(1)["tensors"]["w"]["chunks"][0]
    assert chunk["chunk"] == store.manifest(0)["tensors"]["w"]["chunks"][0]["chunk"]  # the base's object
    assert chunk["ref_version"] == 0 and chunk["uploaded"] is False


def test_delta_is_much_smaller_than_full_for_a_small_update(url: str) -> None:
    store = CheckpointStore(url)
    state = _policy_state(4, n=100_000)
    store.commit(state, {})
    state["w"][::1000] += 1e-4
    store.commit(state, {})
    full_entry, delta_entry = (store.manifest(v)["tensors"]["w"]["chunks"][0] for v in (0, 1))
    assert delta_entry["codec"] in DELTA_CODECS and delta_entry["ref_version"] == 0
    assert delta_entry["encoded_bytes"] * 20 < full_entry["encoded_bytes"]


@pytest.mark.parametrize("n", [20_000, 400_000])  # decided on the whole chunk / on samples of it
def test_each_changed_chunk_takes_the_smallest_dense_codec(url: str, n: int) -> None:
    """Additive steps that carry across bits favour the difference; one flipped low bit per element favours XOR (which bit) over the
    difference (which bit and which way); fresh random values favour a full copy. Every choice restores exactly."""
    rng = np.random.default_rng(9)
    state = {name: rng.standard_normal(n).astype(np.float32) for name in ("step", "flip", "fresh")}
    store = CheckpointStore(url)
    store.commit(state, {})
    new = {
        "step": state["step"] - np.float32(0.02) * np.sign(rng.standard_normal(n)).astype(np.float32),  # Adam-like
        "flip": (state["flip"].view(np.uint32) ^ (np.uint32(1) << rng.integers(0, 8, n).astype(np.uint32))).view(
            np.float32
        ),
        "fresh": rng.standard_normal(n).astype(np.float32),
    }
    store.commit(new, {})
    assert {name: _codec(store, 1, name) for name in new} == {"step": "diff", "flip": "xor", "fresh": "full"}
    assert_same_tensors(CheckpointStore(url).load(1).tensors, new)


def test_commit_never_rereads_the_parent_and_a_fresh_store_loads_it_once(url: str, monkeypatch) -> None:
    rng = np.random.default_rng(5)
    state = _policy_state(5)
    store = CheckpointStore(url)
    store.commit(state, {})
    fs = store._objects.fs
    reads: list[str] = []
    real_cat_file = fs.cat_file
    monkeypatch.setattr(fs, "cat_file", lambda path, *a, **k: reads.append(path) or real_cat_file(path, *a, **k))

    state = _step(state, rng)
    store.commit(state, {})
    assert reads == []

    fresh = CheckpointStore(url)
    state = _step(state, rng)
    fresh.commit(state, {})
    first = list(reads)
    assert any("/chunks/" in p for p in first)  # the newest version was restored once ...
    state = _step(state, rng)
    fresh.commit(state, {})
    assert reads == first  # ... and never again
    assert _codec(fresh, 2, "w") in DELTA_CODECS and fresh.manifest(2)["parent"] == 1


def test_commit_after_loading_an_older_version_builds_on_it(url: str) -> None:
    store = CheckpointStore(url)
    rng = np.random.default_rng(6)
    states = [_policy_state(6)]
    for _ in range(3):
        states.append(_step(states[-1], rng))
    for s in states:
        store.commit(s, {})
    other = CheckpointStore(url)
    other.load(1)
    assert other.commit(states[1], {}) == 4
    manifest = other.manifest(4)
    assert manifest["parent"] == 1 and manifest["depth"] == 2 and manifest["base"] == 0
    # the same state as version 1, encoded against the same base: the same objects, nothing new stored
    assert manifest["tensors"] == {
        name: {**entry, "chunks": [{**c, "uploaded": False} for c in entry["chunks"]]}
        for name, entry in other.manifest(1)["tensors"].items()
    }
    assert other.size_report(4)["encoded_bytes"] == 0
    assert_same_tensors(CheckpointStore(url).load(4).tensors, states[1])


def test_manifest_schema_and_size_report(url: str) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.ones((2, 3), np.float32)}, {"note": "hi"})
    m = store.manifest(0)
    assert m["schema_version"] == 3 and m["version"] == 0 and m["parent"] is None and m["meta"] == {"note": "hi"}
    assert m["base"] is None and m["depth"] == 0 and m["chunk_bytes"] == store.chunk_bytes == 8 << 20
    datetime.fromisoformat(m["created"])
    entry = m["tensors"]["x"]
    assert entry["dtype"] == "<f4" and entry["shape"] == [2, 3] and entry["nbytes"] == 24
    (chunk,) = entry["chunks"]
    assert chunk["codec"] == "full" and chunk["offset"] == 0 and chunk["nbytes"] == 24 and chunk["uploaded"]
    assert len(chunk["chunk"]) == 64 and len(chunk["raw_xxh3"]) == 32 and "raw_sha256" not in chunk and chunk["ref_version"] is None
    report = store.size_report(0)
    assert report["raw_bytes"] == 24 and report["encoded_bytes"] == chunk["encoded_bytes"]
    assert report["codec_counts"] == {"full": 1, "diff": 0, "xor": 0, "rows": 0, "same": 0}
    files = _all_files(url)
    root = _fs_root(url)[1]
    assert f"{root}/versions/00000000.json" in files and f"{root}/versions/00000000.commit" in files
    assert f"{root}/chunks/{chunk['chunk'][:2]}/{chunk['chunk']}" in files


def test_bad_inputs_are_rejected_before_anything_is_written(url: str) -> None:
    store = CheckpointStore(url)
    with pytest.raises(TypeError, match="not a fixed-size plain numpy dtype"):
        store.commit({"o": np.array([object()])}, {})
    with pytest.raises(TypeError, match=r"\.item\(\)"):
        store.commit({"x": np.zeros(2)}, {"step": np.int64(3)})
    with pytest.raises(TypeError, match="expected a numpy.ndarray"):
        store.commit({"x": [1.0, 2.0]}, {})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="full_every"):
        CheckpointStore(url, full_every=0)
    assert _all_files(url) == [] and store.versions() == []


# ------------------------------------------------------------------------------------------ integrity


def _three_versions(url: str) -> tuple[CheckpointStore, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(7)
    store = CheckpointStore(url)
    states = [_policy_state(7)]
    for _ in range(3):
        states.append(_step(states[-1], rng))
    for s in states:
        store.commit(s, {})
    return store, states


def test_corrupt_chunk_is_reported_with_tensor_version_chunk_and_fallback(url: str, caplog) -> None:
    store, states = _three_versions(url)
    path = _chunk_path(store, url, 3, "w")
    fs = _fs_root(url)[0]
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
    states = [_policy_state(7)]
    for _ in range(3):
        states.append(_step(states[-1], rng))
    for s in states:
        store.commit(s, {})
    assert store.manifest(3)["base"] == 2 and _codec(store, 3, "w") in DELTA_CODECS
    sha = store.manifest(2)["tensors"]["w"]["chunks"][0]["chunk"]
    assert store.manifest(3)["tensors"]["w"]["chunks"][0]["ref_chunk"] == sha
    _fs_root(url)[0].rm_file(_chunk_path(store, url, 2, "w"))

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
    fs, root = _fs_root(url)
    path = f"{root}/versions/00000002.json"
    entry_hash = store.manifest(2)["tensors"]["b"]["chunks"][0]["raw_xxh3"]
    fs.pipe_file(path, fs.cat_file(path).replace(entry_hash.encode(), b"0" * 32))
    with pytest.raises(ChunkCorruptError, match="hash of them") as info:
        CheckpointStore(url).load(2)
    assert "'b'" in str(info.value) and "load(1)" in str(info.value)


def test_schema_2_manifests_with_sha256_of_the_decoded_bytes_still_load(url: str) -> None:
    """Versions written before XXH3 (schema 2, raw_sha256) stay loadable and are still checked."""
    store, states = _three_versions(url)
    fs, root = _fs_root(url)
    path = f"{root}/versions/00000002.json"
    manifest = json.loads(fs.cat_file(path))
    manifest["schema_version"] = 2
    snap = CheckpointStore(url).load(2)
    for name, entry in manifest["tensors"].items():
        raw = snap.tensors[name].reshape(-1).view(np.uint8)
        for chunk in entry["chunks"]:
            del chunk["raw_xxh3"]
            chunk["raw_sha256"] = hashlib.sha256(raw[chunk["offset"] : chunk["offset"] + chunk["nbytes"]]).hexdigest()
    fs.pipe_file(path, json.dumps(manifest).encode())
    assert_same_tensors(CheckpointStore(url).load(2).tensors, states[2])
    good = manifest["tensors"]["b"]["chunks"][0]["raw_sha256"]
    fs.pipe_file(path, json.dumps(manifest).replace(good, "0" * 64).encode())
    with pytest.raises(ChunkCorruptError, match="hash of them"):
        CheckpointStore(url).load(2)


def test_load_raises_when_no_version_is_loadable(url: str) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.arange(10.0)}, {})
    _fs_root(url)[0].pipe_file(_chunk_path(store, url, 0, "x"), b"garbage")
    with pytest.raises(ChunkCorruptError, match="No older version is loadable"):
        CheckpointStore(url).load()


def test_a_fresh_store_on_an_unloadable_run_commits_a_full_snapshot(url: str, caplog) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.arange(10.0)}, {})
    _fs_root(url)[0].rm_file(_chunk_path(store, url, 0, "x"))
    with caplog.at_level(logging.WARNING, logger="rl_core.checkpoint"):
        assert CheckpointStore(url).commit({"x": np.arange(10.0)}, {}) == 1
    assert "Committing a full snapshot" in caplog.text
    manifest = store.manifest(1)
    assert manifest["parent"] is None and _codec(store, 1, "x") == "full"
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


# -------------------------------------------------------------------------------- races and failures


def test_two_stores_racing_for_the_same_version_exactly_one_wins(url: str, monkeypatch) -> None:
    CheckpointStore(url).commit({"x": np.zeros(100)}, {})
    winner, loser = CheckpointStore(url), CheckpointStore(url)
    winner_state, loser_state = {"x": np.full(100, 1.0)}, {"x": np.full(100, 2.0)}

    real_publish = loser._publish

    def publish_after_the_winner(manifest, *args):  # the loser has picked version 1; the winner commits it first
        assert winner.commit(winner_state, {"who": "winner"}) == manifest.version == 1
        return real_publish(manifest, *args)

    monkeypatch.setattr(loser, "_publish", publish_after_the_winner)
    with pytest.raises(VersionConflictError, match="version 1 of checkpoint store") as info:
        loser.commit(loser_state, {"who": "loser"})
    assert loser.url in str(info.value)

    reader = CheckpointStore(url)
    assert reader.versions() == [0, 1]
    snap = reader.load(1)
    assert snap.meta == {"who": "winner"}
    assert_same_tensors(snap.tensors, winner_state)


def test_concurrent_committers_get_distinct_versions_or_a_conflict(url: str) -> None:
    CheckpointStore(url).commit({"x": np.zeros(1000)}, {})
    n = 4
    barrier = threading.Barrier(n)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        store = CheckpointStore(url)
        store.load()
        barrier.wait()
        try:
            results[i] = store.commit({"x": np.full(1000, float(i))}, {"writer": i})
        except VersionConflictError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = {i: v for i, v in results.items() if isinstance(v, int)}
    assert len(results) == n and won and len(set(won.values())) == len(won)
    reader = CheckpointStore(url)
    assert reader.versions() == [0, *sorted(won.values())]
    for i, v in won.items():
        snap = reader.load(v)
        assert snap.meta == {"writer": i} and np.all(snap.tensors["x"] == i)


class _FailingWriteFile:
    """Stands in for a file object whose write dies halfway (disk full, connection reset)."""

    def __init__(self, real) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        self.real.write(bytes(data[: len(data) // 2]))
        raise OSError("injected write failure")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.real.close()


def _fail_writes_to(monkeypatch, fs, suffix: str) -> None:
    """Make every way this store writes an object ending in ``suffix`` fail after writing part of it."""
    real_open, real_pipe = fs.open, fs.pipe_file

    def open_(path, mode="rb", *a, **k):
        f = real_open(path, mode, *a, **k)
        return _FailingWriteFile(f) if path.endswith(suffix) and "r" not in mode else f

    def pipe_file(path, data, *a, **k):
        if path.endswith(suffix):
            if len(data) // 2:
                real_pipe(path, bytes(data[: len(data) // 2]), *a, **k)
            raise OSError("injected write failure")
        return real_pipe(path, data, *a, **k)

    monkeypatch.setattr(fs, "open", open_)
    monkeypatch.setattr(fs, "pipe_file", pipe_file)


@pytest.mark.parametrize("suffix", [".json", ".commit"])
def test_a_failed_manifest_or_marker_write_leaves_no_version(url: str, monkeypatch, suffix: str) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.zeros(10)}, {})
    with monkeypatch.context() as m:
        _fail_writes_to(m, store._objects.fs, suffix)
        with pytest.raises(OSError, match="injected"):
            store.commit({"x": np.ones(10)}, {"attempt": 1})
    assert store.versions() == [0]
    assert not any(p.endswith(("00000001.json", "00000001.commit")) for p in _all_files(url))
    assert store.commit({"x": np.ones(10)}, {"attempt": 2}) == 1
    snap = CheckpointStore(url).load()
    assert snap.version == 1 and snap.meta == {"attempt": 2} and np.all(snap.tensors["x"] == 1)


def test_a_failed_chunk_write_leaves_no_version_and_no_partial_object(url: str, monkeypatch) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.zeros(10)}, {})
    chunks_before = _chunk_files(url)
    with monkeypatch.context() as m:
        _fail_writes_to(m, store._objects.fs, "")  # every write fails; first up is the new chunk
        with pytest.raises(OSError, match="injected"):
            store.commit({"x": np.arange(10.0)}, {})
    assert store.versions() == [0]
    if url.startswith("file://"):  # temp file + rename: the partial write never reached the chunk's name
        assert _chunk_files(url) == chunks_before
    # elsewhere the injected half-object sits at the chunk's name; the size check makes the next commit rewrite it
    assert not any(".tmp-" in p for p in _all_files(url))
    assert store.commit({"x": np.arange(10.0)}, {}) == 1
    assert_same_tensors(CheckpointStore(url).load(1).tensors, {"x": np.arange(10.0)})


def test_a_marker_that_landed_despite_an_error_counts_as_committed(url: str, monkeypatch, caplog) -> None:
    store = CheckpointStore(url)
    real = store._objects.create_exclusive

    def create_then_lose_the_reply(path: str, data: bytes) -> None:
        real(path, data)
        if path.endswith(".commit"):
            raise TimeoutError("reply lost after the write reached storage")

    monkeypatch.setattr(store._objects, "create_exclusive", create_then_lose_the_reply)
    with caplog.at_level(logging.WARNING, logger="rl_core.checkpoint"):
        assert store.commit({"x": np.ones(3)}, {}) == 0
    assert "version 0 is committed" in caplog.text
    assert CheckpointStore(url).load().version == 0


def test_a_claim_left_by_a_crashed_writer_is_skipped(url: str) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.zeros(4)}, {})
    fs, root = _fs_root(url)
    fs.pipe_file(f"{root}/versions/00000001.json", b'{"half a manif')  # crashed between manifest and marker
    assert store.versions() == [0]
    assert store.commit({"x": np.ones(4)}, {}) == 2
    assert CheckpointStore(url).versions() == [0, 2] and CheckpointStore(url).load().version == 2


# -------------------------------------------------------------------------------------------------- S3


def test_s3_round_trip_against_a_real_endpoint(s3_endpoint: str) -> None:
    options = {"client_kwargs": {"endpoint_url": s3_endpoint}, "key": "testing", "secret": "testing"}
    fsspec.filesystem("s3", **options).mkdir("ckpt-bucket")
    rng = np.random.default_rng(8)
    store = CheckpointStore("s3://ckpt-bucket/run", full_every=2, storage_options=options)
    states = [_policy_state(8, n=1000)]
    for _ in range(2):
        states.append(_step(states[-1], rng))
    for i, s in enumerate(states):
        assert store.commit(s, {"i": i}) == i
    codecs = [_codec(store, v, "w") for v in range(3)]
    assert codecs[0] == codecs[2] == "full" and codecs[1] in DELTA_CODECS

    fresh = CheckpointStore("s3://ckpt-bucket/run", storage_options=options)
    assert fresh.versions() == [0, 1, 2]
    for v, s in enumerate(states):
        assert_same_tensors(fresh.load(v).tensors, s)

    racer = CheckpointStore("s3://ckpt-bucket/run", storage_options=options)
    racer.load()
    fresh.commit(states[0], {})  # takes version 3 ...
    racer._next_version = lambda: 3  # type: ignore[method-assign]  # ... which the racer also picked
    with pytest.raises(VersionConflictError, match="version 3"):
        racer.commit(states[1], {})
    assert CheckpointStore("s3://ckpt-bucket/run", storage_options=options).load().version == 3
