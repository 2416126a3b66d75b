"""Chained sparse-row deltas (schema 4): under sparse updates a delta against the base stores every row changed since
the base, so the store chains such chunks to the parent's delta and each version costs about what it changed. Chains
must restore exactly, stay bounded, survive gc and fail clearly when a link is damaged."""

from __future__ import annotations

from collections.abc import Iterable

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore, ChunkMissingError, Manifest
from rl_core.checkpoint import chunks as chunks_module

KIB = 1024
ROWS, WIDTH = 4000, 16  # rows of 64 B, 1024 rows per 64 KiB chunk


def _sparse_history(versions: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """An embedding where each version changes a fresh 1% of the rows, next to a dense bias that moves every time."""
    rng = np.random.default_rng(seed)
    state = {"emb": rng.standard_normal((ROWS, WIDTH)).astype(np.float32), "bias": rng.standard_normal(64)}
    history = [state]
    for _ in range(versions - 1):
        new = {k: v.copy() for k, v in history[-1].items()}
        rows = rng.choice(ROWS, ROWS // 100, replace=False)
        new["emb"][rows] += rng.standard_normal((rows.size, WIDTH)).astype(np.float32) * 1e-2
        new["bias"] += 1e-3
        history.append(new)
    return history


def _commit_all(store: CheckpointStore, history: list[dict[str, np.ndarray]]) -> None:
    for i, state in enumerate(history):
        assert store.commit(state, {"i": i}) == i


def _chunk_entries(store: CheckpointStore, version: int, name: str = "emb") -> list[dict]:
    return store.manifest(version)["tensors"][name]["chunks"]


def _assert_restores(url: str, history: list[dict[str, np.ndarray]]) -> None:
    _assert_restores_versions(url, history, range(len(history)))


def _assert_restores_versions(url: str, history: list[dict[str, np.ndarray]], versions: Iterable[int]) -> None:
    fresh = CheckpointStore(url)
    for v in versions:
        snap = fresh.load(v)
        for name, arr in history[v].items():
            assert snap.tensors[name].tobytes() == arr.tobytes(), (v, name)


def test_sparse_deltas_chain_to_the_parent_and_cost_what_they_changed(url: str) -> None:
    history = _sparse_history(8)
    store = CheckpointStore(url, chunk_bytes=64 * KIB, full_every=8)
    _commit_all(store, history)
    first_delta = store.size_report(1)["encoded_bytes"]
    for v in range(1, 8):
        m = store.manifest(v)
        assert m["base"] == 0 and m["depth"] == v
        links = [[link["version"] for link in c.get("via", [])] for c in _chunk_entries(store, v)]
        if v >= 3:  # from depth 3 on, the rows since the parent are at most half of those since the base
            assert m["schema_version"] == 4 and all(chain and chain[-1] == v - 1 for chain in links), links
            assert store.size_report(v)["encoded_bytes"] < 1.3 * first_delta
        assert all(c.get("via") is None for c in store.manifest(v)["tensors"]["bias"]["chunks"])  # dense: never
    # without chains the 7th delta would store every row changed since the base, ~7x the first
    assert store.size_report(7)["encoded_bytes"] < 2 * first_delta
    _assert_restores(url, history)


def test_a_chunk_unchanged_since_its_parent_reuses_the_parents_entry(url: str) -> None:
    history = _sparse_history(4, seed=1)
    history.append({k: v.copy() for k, v in history[-1].items()})
    history[-1]["bias"] += 1.0  # only the dense tensor moves
    store = CheckpointStore(url, chunk_bytes=64 * KIB)
    _commit_all(store, history)
    last, parent = _chunk_entries(store, 4), _chunk_entries(store, 3)
    assert all(c["via"] for c in parent)
    assert [{**c, "uploaded": True} for c in last] == [{**c, "uploaded": True} for c in parent]
    assert not any(c["uploaded"] for c in last)
    _assert_restores(url, history)


def test_chains_are_bounded(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks_module, "_MAX_CHAIN_LINKS", 2)
    history = _sparse_history(7, seed=2)
    store = CheckpointStore(url, chunk_bytes=64 * KIB, full_every=20)
    _commit_all(store, history)
    lengths = np.array([[len(c.get("via", [])) for c in _chunk_entries(store, v)] for v in range(7)])
    assert lengths.max() == 2, lengths
    at_cap = lengths[:-1] == 2
    assert at_cap.any() and (lengths[1:][at_cap] == 0).all(), lengths  # a chain at the cap restarts from the base
    _assert_restores(url, history)


def test_a_fresh_writer_starts_a_new_chain_from_the_base(url: str) -> None:
    history = _sparse_history(7, seed=3)
    _commit_all(CheckpointStore(url, chunk_bytes=64 * KIB), history[:4])
    store = CheckpointStore(url, chunk_bytes=64 * KIB)  # a resumed run: it knows no rows since the base
    for i in range(4, 7):
        assert store.commit(history[i], {"i": i}) == i
    assert all("via" not in c for c in _chunk_entries(store, 4))
    assert all(c["via"][-1]["version"] == 5 for c in _chunk_entries(store, 6))
    _assert_restores(url, history)


def test_a_missing_link_fails_every_version_after_it_and_load_falls_back_before_it(url: str) -> None:
    history = _sparse_history(6, seed=4)
    # the objects in storage, not embedded: this test is about them
    store = CheckpointStore(url, chunk_bytes=64 * KIB, embed_bytes=0)
    _commit_all(store, history)
    link = _chunk_entries(store, 5)[0]["via"][-1]
    assert link["version"] == 4
    fs, root = fsspec.core.url_to_fs(url)
    fs.rm_file(f"{root.rstrip('/')}/chunks/{link['chunk'][:2]}/{link['chunk']}")
    fresh = CheckpointStore(url)
    with pytest.raises(ChunkMissingError) as err:
        fresh.load(5)
    assert err.value.chunk == link["chunk"] and "Version 3 is the newest older version that loads" in str(err.value)
    snap = fresh.load()  # the newest version that restores
    assert snap.version == 3 and snap.tensors["emb"].tobytes() == history[3]["emb"].tobytes()


def test_gc_keeps_a_chained_versions_objects_not_the_versions_its_chains_pass_through(url: str) -> None:
    history = _sparse_history(6, seed=5)
    store = CheckpointStore(url, chunk_bytes=64 * KIB, embed_bytes=0)  # the link objects in storage
    _commit_all(store, history)
    links = {link["version"] for c in _chunk_entries(store, 5) for link in c.get("via", [])}
    assert {2, 3, 4} <= links
    store.gc(keep_last=1, grace_s=0.0)
    assert store.versions() == [0, 5]  # the base and the newest: the other versions' objects may go
    assert CheckpointStore(url).load(5).tensors["emb"].tobytes() == history[5]["emb"].tobytes()
    history.append({k: v.copy() for k, v in history[5].items()})
    history[6]["emb"][:40] += 1.0
    assert store.commit(history[6], {"i": 6}) == 6  # the writer goes on after gc, its chains through them too
    first, *rest = _chunk_entries(store, 6)  # rows 0-39 are in the first chunk; the others kept v5's entries
    assert first["via"][-1]["version"] == 5 and {link["version"] for link in first["via"]} >= {2, 3, 4}
    assert [c["chunk"] for c in rest] == [c["chunk"] for c in _chunk_entries(store, 5)[1:]]
    _assert_restores_versions(url, history, [0, 5, 6])


def test_a_chained_chunk_in_a_schema_3_manifest_is_refused(url: str) -> None:
    store = CheckpointStore(url, chunk_bytes=64 * KIB)
    _commit_all(store, _sparse_history(4, seed=6))
    manifest = store.manifest(3)
    assert manifest["schema_version"] == 4
    with pytest.raises(ValueError, match="needs schema 4"):
        Manifest.model_validate({**manifest, "schema_version": 3})
