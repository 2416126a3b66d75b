"""Retention and garbage collection: the policy, bases kept for retained deltas, unreferenced chunks, and
safety against a writer committing at the same time."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import CheckpointError, CheckpointStore


def _objects(url: str) -> set[str]:
    fs, root = fsspec.core.url_to_fs(url)
    d = f"{root.rstrip('/')}/chunks"
    return {p.rsplit("/", 1)[-1] for p in fs.find(d)} if fs.exists(d) else set()


def _run(url: str, n: int, full_every: int = 4) -> tuple[CheckpointStore, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    store = CheckpointStore(url, full_every=full_every, embed_bytes=0)  # gc is about the objects in storage
    x = rng.standard_normal(4000).astype(np.float32)
    history = []
    for i in range(n):
        x = x.copy()
        x[rng.choice(x.size, 20, replace=False)] += 1.0
        store.commit({"x": x, "const": np.arange(100)}, {"i": i})
        history.append(x)
    return store, history


def test_gc_keeps_the_policy_and_the_bases_retained_versions_need(url: str) -> None:
    store, history = _run(url, 10)  # bases 0, 4, 8
    report = store.gc(keep_last=2, keep_every=5, grace_s=0)
    # newest 2 (8, 9), multiples of 5 (0, 5), and 5's base 4
    assert report["kept_versions"] == [0, 4, 5, 8, 9]
    assert report["deleted_versions"] == [1, 2, 3, 6, 7] and report["deleted_chunks"] > 0
    fresh = CheckpointStore(url)
    assert fresh.versions() == [0, 4, 5, 8, 9]
    for v in fresh.versions():
        assert fresh.load(v).tensors["x"].tobytes() == history[v].tobytes()
    needed = set().union(*(fresh._reader.manifest(v, v).stored_objects() for v in fresh.versions()))
    assert _objects(url) == needed
    assert fresh.verify()["errors"] == {}
    fs, root = fsspec.core.url_to_fs(url)
    assert not any(p.endswith(("00000001.json", "00000001.commit")) for p in fs.find(root))


def test_gc_dry_run_deletes_nothing(url: str) -> None:
    store, _ = _run(url, 6)
    before = _objects(url)
    report = store.gc(keep_last=1, grace_s=0, dry_run=True)
    assert report["dry_run"] and report["deleted_versions"] == [0, 1, 2, 3] and report["deleted_chunks"] > 0
    assert store.versions() == list(range(6)) and _objects(url) == before


def test_young_unreferenced_chunks_survive_the_grace_period(url: str) -> None:
    store, _ = _run(url, 3)
    fs, root = fsspec.core.url_to_fs(url)
    orphan = "ab" + "0" * 62  # e.g. uploaded by a commit whose manifest is not written yet
    fs.makedirs(f"{root.rstrip('/')}/chunks/ab", exist_ok=True)
    fs.pipe_file(f"{root.rstrip('/')}/chunks/ab/{orphan}", b"in flight")
    report = store.gc(keep_last=3)  # default grace: one hour
    assert report["young_unreferenced_chunks"] == 1 and orphan in _objects(url)
    assert store.gc(keep_last=3, grace_s=0)["deleted_chunks"] == 1 and orphan not in _objects(url)


def test_a_claimed_manifest_protects_its_chunks_while_the_writer_finishes(url: str, monkeypatch) -> None:
    store, _ = _run(url, 2)
    writer = CheckpointStore(url)
    writer.load()
    real = writer._objects.create_exclusive
    reports = []

    def gc_between_claim_and_marker(path: str, data: bytes) -> None:
        real(path, data)
        if path.endswith(".json"):  # claimed, not yet visible: a gc runs now
            reports.append(CheckpointStore(url).gc(keep_last=1, grace_s=0))

    monkeypatch.setattr(writer._objects, "create_exclusive", gc_between_claim_and_marker)
    y = np.random.default_rng(1).standard_normal(4000).astype(np.float32)
    v = writer.commit({"x": y, "const": np.arange(100)}, {})
    assert reports[0]["deleted_chunks"] == 0  # grace 0, yet the claim protects the writer's new objects
    assert CheckpointStore(url).load(v).tensors["x"].tobytes() == y.tobytes()


def test_a_commit_whose_base_was_collected_meanwhile_fails_cleanly_then_succeeds(url: str, monkeypatch) -> None:
    store, _ = _run(url, 3, full_every=10)  # 0 base, 1, 2 deltas
    writer = CheckpointStore(url)
    writer.load(1)  # continues from version 1 against base 0
    real = writer._objects.create_exclusive

    def gc_removes_the_base(path: str, data: bytes) -> None:
        real(path, data)
        if path.endswith(".json"):
            fs, root = fsspec.core.url_to_fs(url)  # what a gc with a policy that drops 0..2 does first
            for v in (0, 1, 2):
                fs.rm_file(f"{root.rstrip('/')}/versions/{v:08d}.commit")

    monkeypatch.setattr(writer._objects, "create_exclusive", gc_removes_the_base)
    x = writer.load(1).tensors["x"]
    with pytest.raises(CheckpointError, match="version 0, whose chunks version 3 reuses, was deleted"):
        writer.commit({"x": x, "const": np.arange(100)}, {})
    monkeypatch.undo()
    assert CheckpointStore(url).versions() == []
    v = writer.commit({"x": x, "const": np.arange(100)}, {})
    assert writer.manifest(v)["base"] is None and CheckpointStore(url).load(v).tensors["x"].tobytes() == x.tobytes()


def test_stale_claims_of_crashed_writers_are_removed(url: str) -> None:
    store, _ = _run(url, 2)
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root.rstrip('/')}/versions/00000005.json", b'{"half')
    assert store.gc(keep_last=5, grace_s=0)["deleted_claims"] == []  # young: maybe a writer in flight
    assert store.gc(keep_last=5, claim_grace_s=0)["deleted_claims"] == [5]
    assert not fs.exists(f"{root.rstrip('/')}/versions/00000005.json")


def test_gc_rejects_a_policy_that_keeps_nothing(url: str) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointStore(url).gc(keep_last=0)
