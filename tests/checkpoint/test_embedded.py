"""Small objects embedded in the manifest (schema 4): a policy's biases, normalizer statistics and Adam steps are many
tiny chunks, and a file per chunk cost more than encoding them. Every manifest must embed every embedded object it
names, so that each version restores on its own, whatever gc removed, and a writer that continues the store later
can still reference them."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore, ChunkCorruptError, Manifest
from tests.checkpoint.store_helpers import chunk_files, commit_manifest_as_is, fs_root

KIB = 1024


def _states(n: int) -> list[dict[str, np.ndarray]]:
    """A big weight that moves every version, small tensors of which some move (bias, step) and one never does."""
    rng = np.random.default_rng(0)
    state = {"w": rng.standard_normal(64 * KIB).astype(np.float32), "bias": rng.standard_normal(64).astype(np.float32),
             "step": np.array(0, dtype=np.int64), "frozen": rng.standard_normal(32)}
    states = [state]
    for _ in range(n - 1):
        new = {k: v.copy() for k, v in states[-1].items()}
        new["w"] += rng.standard_normal(new["w"].size).astype(np.float32) * 1e-3
        new["bias"] += np.float32(1e-3)
        new["step"] += 1
        states.append(new)
    return states


def _manifest(url: str, version: int) -> Manifest:
    fs, root = fs_root(url)
    return Manifest.from_json_bytes(fs.cat_file(f"{root}/versions/{version:08d}.json"))


def _stored(url: str) -> set[str]:
    return {p.rsplit("/", 1)[-1] for p in chunk_files(url)}


def test_small_objects_go_into_the_manifest_and_every_version_names_what_it_needs(url: str) -> None:
    states = _states(5)
    store = CheckpointStore(url, full_every=3)  # bases 0 and 3
    for i, state in enumerate(states):
        store.commit(state, {"i": i})
    stored = _stored(url)
    for v in range(5):
        m = _manifest(url, v)
        assert m.schema_version == 4 and m.embedded
        assert m.objects() <= stored | m.embedded.keys()  # a delta re-embeds the base objects it references
        assert not m.embedded.keys() & stored
        big = [c.chunk for c in m.tensors["w"].chunks]
        assert set(big) <= stored  # a 256 KiB chunk is stored on its own
        for name in ("bias", "step", "frozen"):
            assert m.tensors[name].chunks[0].chunk in m.embedded
    assert _manifest(url, 1).tensors["frozen"].chunks[0].codec == "same"
    fresh = CheckpointStore(url)
    for v, state in enumerate(states):
        assert all(fresh.load(v).tensors[k].tobytes() == a.tobytes() for k, a in state.items())


def test_a_version_whose_base_gc_removed_still_restores_its_embedded_references(url: str) -> None:
    states = _states(4)
    store = CheckpointStore(url, full_every=8)
    for i, state in enumerate(states):
        store.commit(state, {"i": i})
    fs, root = fs_root(url)
    for suffix in ("commit", "json"):  # the base's manifest, and with it its embedded table, is gone
        fs.rm_file(f"{root}/versions/00000000.{suffix}")
    snap = CheckpointStore(url).load(3)
    assert all(snap.tensors[k].tobytes() == a.tobytes() for k, a in states[3].items())


def test_a_writer_continuing_the_store_carries_the_bases_embedded_objects(url: str) -> None:
    states = _states(4)
    first = CheckpointStore(url)
    for i, state in enumerate(states[:2]):
        first.commit(state, {"i": i})
    later = CheckpointStore(url)  # a resumed run: it knows the base only from storage
    later.load(1)
    for i, state in enumerate(states[2:], start=2):
        assert later.commit(state, {"i": i}) == i
    m = _manifest(url, 3)
    assert m.base == 0 and m.tensors["frozen"].chunks[0].codec == "same"
    assert m.tensors["frozen"].chunks[0].chunk in m.embedded
    assert all(CheckpointStore(url).load(3).tensors[k].tobytes() == a.tobytes() for k, a in states[3].items())


@pytest.mark.parametrize("damage", ["other bytes", "not base64"])
def test_a_damaged_embedded_object_is_a_corrupt_chunk_naming_the_manifest(url: str, damage: str) -> None:
    store = CheckpointStore(url)
    store.commit(_states(1)[0], {})
    store.commit(_states(2)[1], {})
    manifest = json.loads(fs_root(url)[0].cat_file(f"{fs_root(url)[1]}/versions/00000001.json"))
    sha = manifest["tensors"]["bias"]["chunks"][0]["chunk"]
    payload = base64.b64decode(manifest["embedded"][sha])
    tampered = base64.b64encode(payload[:-1] + bytes([payload[-1] ^ 1])).decode()
    manifest["embedded"][sha] = tampered if damage == "other bytes" else "%%%"
    commit_manifest_as_is(url, 1, json.dumps(manifest).encode())  # sealed again: only the embedded object is bad
    with pytest.raises(ChunkCorruptError, match="embedded in version 1's manifest") as err:
        CheckpointStore(url).load(1)
    assert err.value.chunk == sha and err.value.tensor == "bias"
    assert CheckpointStore(url).load().version == 0  # the newest version that restores


def test_embedding_is_a_setting(url: str) -> None:
    with pytest.raises(ValueError, match="embed_bytes must be an int >= 0"):
        CheckpointStore(url, embed_bytes=-1)
    store = CheckpointStore(url, embed_bytes=0)
    store.commit(_states(1)[0], {})
    assert store.manifest(0)["schema_version"] == 3 and "embedded" not in store.manifest(0)
    assert len(_stored(url)) == 1 + 3  # w, then each small tensor: an object of its own
