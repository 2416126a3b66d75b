"""CheckpointStore: exact restores across delta chains, the codecs each change takes, manifests and size
reports, and a round trip on a real S3 endpoint."""

from __future__ import annotations

from datetime import datetime

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore, VersionConflictError
from rl_core.checkpoint.restore import MANIFESTS_CACHED
from tests.checkpoint.store_helpers import (
    DELTA_CODECS,
    all_files,
    assert_same_tensors,
    chunk_files,
    fs_root,
    optimizer_step,
    policy_state,
    single_chunk_codec,
)


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
    state = policy_state(1)
    kept = {k: v.copy() for k, v in state.items()}
    store.commit(state, {})
    state["w"][:] = 0  # must not leak into the stored version nor into the store's delta reference
    snap = store.load(0)
    snap.tensors["w"][:] = 1
    store.commit(kept, {})
    assert single_chunk_codec(store, 1, "w") == "same"
    assert_same_tensors(CheckpointStore(url).load(1).tensors, kept)


def test_delta_chain_over_several_full_snapshots_restores_every_version(url: str) -> None:
    rng = np.random.default_rng(2)
    store = CheckpointStore(url, full_every=3)
    state = policy_state(2)
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
        state = optimizer_step(state, rng)

    for v in (0, 3, 6, 9):
        assert store.size_report(v)["codec_counts"]["full"] == len(store.manifest(v)["tensors"])
        assert store.manifest(v)["depth"] == 0 and store.manifest(v)["base"] is None
    assert single_chunk_codec(store, 1, "w") in DELTA_CODECS and single_chunk_codec(store, 1, "frozen") == "same"
    assert single_chunk_codec(store, 4, "new") == "full"
    assert single_chunk_codec(store, 5, "b") == "full" and single_chunk_codec(store, 7, "new") == "full"
    assert single_chunk_codec(store, 5, "new") == "same"  # a tensor new since the base is the reference of later deltas
    m2 = store.manifest(2)
    assert m2["parent"] == 1 and m2["depth"] == 2 and m2["base"] == 0
    assert m2["tensors"]["w"]["chunks"][0]["ref_version"] == 0  # against the base, not chained to version 1

    fresh = CheckpointStore(url)
    for v in [9, 0, 5, 2, 8, 1, 7, 3, 6, 4]:
        snap = fresh.load(v)
        assert snap.version == v and snap.meta == {"i": v}
        assert_same_tensors(snap.tensors, history[v])


def test_a_writer_kept_for_a_whole_run_stays_bounded_and_every_version_loads(url: str) -> None:
    """A flow run keeps its store across all its commits: the manifests it caches (the newest MANIFESTS_CACHED) and
    the objects it remembers as uploaded (those of the newest two base cycles) stay bounded, and every version
    loads."""
    rng = np.random.default_rng(5)
    store = CheckpointStore(url, full_every=4)
    state = policy_state(5)
    history = []
    for i in range(MANIFESTS_CACHED + 9):
        assert store.commit(state, {"i": i}) == i
        history.append({k: v.copy() for k, v in state.items()})
        state = optimizer_step(state, rng)
        assert len(store._reader._manifests) <= MANIFESTS_CACHED
    bases = [v for v in range(len(history)) if store.manifest(v)["base"] is None]
    assert len(bases) > 3 and min(store._writer._known.values()) == bases[-2]
    newest_base = bases[-1]
    meta = store.meta(0)  # no longer cached: read again
    meta["i"] = "changed"
    assert store.meta(0) == {"i": 0}
    fresh = CheckpointStore(url)
    for v in (0, 1, newest_base - 1, len(history) - 1):
        assert_same_tensors(fresh.load(v).tensors, history[v])


def test_unchanged_tensors_cost_no_new_chunk(url: str) -> None:
    store = CheckpointStore(url)
    state = policy_state(3)
    store.commit(state, {})
    before = chunk_files(url)
    store.commit(state, {"again": True})
    assert chunk_files(url) == before
    report = store.size_report(1)
    assert report["encoded_bytes"] == 0 and report["codec_counts"] == {"full": 0, "diff": 0, "xor": 0, "rows": 0, "same": 4}
    chunk = store.manifest(1)["tensors"]["w"]["chunks"][0]
    assert chunk["chunk"] == store.manifest(0)["tensors"]["w"]["chunks"][0]["chunk"]  # the base's object
    assert chunk["ref_version"] == 0 and chunk["uploaded"] is False


def test_delta_is_much_smaller_than_full_for_a_small_update(url: str) -> None:
    store = CheckpointStore(url)
    state = policy_state(4, n=100_000)
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
    assert {name: single_chunk_codec(store, 1, name) for name in new} == {"step": "diff", "flip": "xor", "fresh": "full"}
    assert_same_tensors(CheckpointStore(url).load(1).tensors, new)


def test_commit_never_rereads_the_parent_and_a_fresh_store_loads_it_once(url: str, monkeypatch) -> None:
    rng = np.random.default_rng(5)
    state = policy_state(5)
    store = CheckpointStore(url)
    store.commit(state, {})
    fs = store._objects.fs
    reads: list[str] = []
    real_cat_file = fs.cat_file
    monkeypatch.setattr(fs, "cat_file", lambda path, *a, **k: reads.append(path) or real_cat_file(path, *a, **k))

    state = optimizer_step(state, rng)
    store.commit(state, {})
    assert reads == []

    fresh = CheckpointStore(url)
    state = optimizer_step(state, rng)
    fresh.commit(state, {})
    first = list(reads)
    assert any("/chunks/" in p for p in first)  # the newest version was restored once ...
    state = optimizer_step(state, rng)
    fresh.commit(state, {})
    assert reads == first  # ... and never again
    assert single_chunk_codec(fresh, 2, "w") in DELTA_CODECS and fresh.manifest(2)["parent"] == 1


def test_commit_after_loading_an_older_version_builds_on_it(url: str) -> None:
    store = CheckpointStore(url)
    rng = np.random.default_rng(6)
    states = [policy_state(6)]
    for _ in range(3):
        states.append(optimizer_step(states[-1], rng))
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
    store = CheckpointStore(url, embed_bytes=0)  # schema 3: nothing embedded (test_embedded.py: schema 4)
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
    files = all_files(url)
    root = fs_root(url)[1]
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
    assert all_files(url) == [] and store.versions() == []


# -------------------------------------------------------------------------------------------------- S3


def test_s3_round_trip_against_a_real_endpoint(s3_endpoint: str) -> None:
    options = {"client_kwargs": {"endpoint_url": s3_endpoint}, "key": "testing", "secret": "testing"}
    fsspec.filesystem("s3", **options).mkdir("ckpt-bucket")
    rng = np.random.default_rng(8)
    store = CheckpointStore("s3://ckpt-bucket/run", full_every=2, storage_options=options)
    states = [policy_state(8, n=1000)]
    for _ in range(2):
        states.append(optimizer_step(states[-1], rng))
    for i, s in enumerate(states):
        assert store.commit(s, {"i": i}) == i
    codecs = [single_chunk_codec(store, v, "w") for v in range(3)]
    assert codecs[0] == codecs[2] == "full" and codecs[1] in DELTA_CODECS

    fresh = CheckpointStore("s3://ckpt-bucket/run", storage_options=options)
    assert fresh.versions() == [0, 1, 2]
    for v, s in enumerate(states):
        assert_same_tensors(fresh.load(v).tensors, s)

    racer = CheckpointStore("s3://ckpt-bucket/run", storage_options=options)
    racer.load()
    fresh.commit(states[0], {})  # takes version 3 ...
    racer._writer._next_version = lambda: 3  # type: ignore[method-assign]  # ... which the racer also picked
    with pytest.raises(VersionConflictError, match="version 3"):
        racer.commit(states[1], {})
    assert CheckpointStore("s3://ckpt-bucket/run", storage_options=options).load().version == 3

    s3 = fsspec.filesystem("s3", **options)
    s3.pipe_file("ckpt-bucket/run/versions/00000004.json", b'{"half a manif')  # a claim a killed commit left
    sole = CheckpointStore("s3://ckpt-bucket/run", storage_options=options, sole_writer=True)
    assert sole.commit(states[2], {}) == 4 and sole.load().version == 4
