"""Damaged stores, fuzzed (issue 20, "Bad input, fuzzed"): a committed store's manifests and chunk objects are
truncated, flipped, extended, retyped and cut short of keys. Loading then either raises a CheckpointError naming the
version, or returns exactly what was committed; with load() the newest intact version comes back exactly. Nothing
else escapes: no KeyError, TypeError or JSON error from deep inside, and never other tensors than those committed.
Tensor files: tests/checkpoint/test_tensor_file_fuzz.py."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_core.checkpoint import (
    CheckpointError,
    CheckpointStore,
    ChunkCorruptError,
    ChunkEntry,
    ChunkMissingError,
    Manifest,
    ManifestCorruptError,
    RestoreError,
    Snapshot,
    TensorEntry,
)
from tests.checkpoint.store_helpers import assert_same_tensors

VERSIONS = (0, 1, 2)


@dataclass(frozen=True, repr=False)
class Committed:
    """A memory:// store of three versions (a base and two deltas against it) and what each version holds."""

    url: str
    root: str
    states: list[dict[str, np.ndarray]]
    metas: list[dict[str, Any]]
    manifests: list[bytes]  # each version's manifest as committed
    needs: list[set[str]]  # the objects each version reads from storage

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("memory")

    def __repr__(self) -> str:  # hypothesis prints it with every failing case
        return f"Committed({self.url!r})"

    def manifest_path(self, version: int) -> str:
        return f"{self.root}/versions/{version:08d}.json"

    def marker_path(self, version: int) -> str:
        return f"{self.root}/versions/{version:08d}.commit"

    def object_path(self, sha: str) -> str:
        return f"{self.root}/chunks/{sha[:2]}/{sha}"


LOGICAL = {"half": "bfloat16"}


def _states() -> list[dict[str, np.ndarray]]:
    """States whose deltas use every codec: a few weights move (diff/xor), embedding rows (rows; the second delta
    changes one row of the first chunk, where the first changed two, so it is chained), a counter ticks, and an
    empty and a bfloat16 tensor (its uint16 bit patterns) stay put (same)."""
    rng = np.random.default_rng(20)
    state = {"w": rng.standard_normal((64, 16)).astype(np.float32), "b": rng.standard_normal(64),
             "emb": rng.standard_normal((256, 8)).astype(np.float32), "steps": np.array(0, dtype=np.int64),
             "empty": np.zeros((0, 4), dtype=np.float32), "half": rng.integers(0, 2**16, 32, dtype=np.uint16)}
    states = [state]
    for rows in ([3, 7], [12]):
        new = {k: v.copy() for k, v in states[-1].items()}
        new["w"].reshape(-1)[rng.choice(new["w"].size, 40, replace=False)] += np.float32(1e-3)
        new["b"] += 1e-6
        new["emb"][rows] += np.float32(1.0)
        new["steps"] += 1
        states.append(new)
    return states


@pytest.fixture(scope="module")
def committed() -> Iterator[Committed]:
    root = f"/ckpt-fuzz-{uuid.uuid4().hex}/run"
    url = f"memory://{root}"
    # several chunks per tensor (offsets to get wrong); small deltas embedded in the manifest, the rest stored
    store = CheckpointStore(url, chunk_bytes=1024, embed_bytes=256)
    states = _states()
    metas = [{"iteration": v, "metrics": {"return": 1.5 * v, "nan": math.nan}, "tags": ["a", "b"]} for v in VERSIONS]
    for state, meta in zip(states, metas):
        store.commit(state, meta, logical_dtypes=LOGICAL)
    codecs = {c["codec"] for v in (1, 2) for e in store.manifest(v)["tensors"].values() for c in e["chunks"]}
    assert {"same", "rows"} <= codecs and codecs & {"diff", "xor"}, codecs
    assert Manifest.model_validate(store.manifest(2)).chained()  # the chain's fields are fuzzed too
    fs = fsspec.filesystem("memory")
    manifests = [fs.cat_file(f"{root}/versions/{v:08d}.json") for v in VERSIONS]
    parsed = [Manifest.from_json_bytes(m) for m in manifests]
    needs = [m.stored_objects() for m in parsed]
    assert all(needs) and parsed[2].embedded, "both stored and embedded objects are fuzzed"
    yield Committed(url, root, states, metas, manifests, needs)
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


@contextmanager
def _damaged(committed: Committed, path: str, data: bytes | None) -> Iterator[None]:
    """`path` holds `data` (None: is gone) inside the block, its committed bytes after."""
    fs = committed.fs
    original = fs.cat_file(path)
    try:
        if data is None:
            fs.rm_file(path)
        else:
            fs.pipe_file(path, data)
        yield
    finally:
        fs.pipe_file(path, original)


@contextmanager
def _unsealed(committed: Committed, version: int, data: bytes | None) -> Iterator[None]:
    """The manifest of `version` holds `data` under an empty commit marker, as in a store written before markers
    recorded the manifest's sha256: the manifest's parser and checks are then all that stands between it and a
    restore."""
    with _damaged(committed, committed.marker_path(version), b""), \
            _damaged(committed, committed.manifest_path(version), data):
        yield


def _load(committed: Committed, version: int | None) -> Snapshot | CheckpointError:
    """What a fresh store (nothing cached from the commits) loads: a snapshot, or the CheckpointError it raises."""
    try:
        return CheckpointStore(committed.url).load(version)
    except CheckpointError as exc:
        return exc
    except Exception as exc:  # what the property rules out
        raise AssertionError(f"load({version}) failed inside the store with {type(exc).__name__}: {exc}") from exc


def _assert_exact(committed: Committed, snap: Snapshot) -> None:
    v = snap.version
    assert_same_tensors(snap.tensors, committed.states[v])
    assert json.dumps(snap.meta, sort_keys=True) == json.dumps(committed.metas[v], sort_keys=True)  # NaN too
    assert snap.logical_dtypes == LOGICAL


def _assert_refused(outcome: Snapshot | CheckpointError, version: int, kind: type = RestoreError) -> RestoreError:
    assert isinstance(outcome, kind), f"version {version} loaded despite the damage, or failed otherwise: {outcome!r}"
    assert outcome.version == version and f"version {version}" in str(outcome)
    return outcome


def _assert_exact_or_refused(committed: Committed, version: int) -> bool:
    """load(version) is exact or refused naming the version; then load() is exact, of the newest version that
    loads. Returns whether `version` loads."""
    outcome = _load(committed, version)
    if isinstance(outcome, Snapshot):
        _assert_exact(committed, outcome)
    else:
        _assert_refused(outcome, version)
    newest = _load(committed, None)
    assert isinstance(newest, Snapshot), newest
    assert newest.version == (2 if isinstance(outcome, Snapshot) or version != 2 else 1)
    _assert_exact(committed, newest)
    return isinstance(outcome, Snapshot)


# --------------------------------------------------------------------------------------------------- manifests


@given(version=st.sampled_from(VERSIONS), data=st.data())
def test_a_missing_or_truncated_manifest_is_refused_naming_its_version(committed: Committed, version: int,
                                                                       data: st.DataObject) -> None:
    original = committed.manifests[version]
    cut = data.draw(st.none() | st.integers(0, len(original) - 1), label="cut (None: deleted)")
    with _damaged(committed, committed.manifest_path(version), None if cut is None else original[:cut]):
        err = _assert_refused(_load(committed, version), version, ManifestCorruptError)
        assert committed.manifest_path(version) in str(err)
        assert ("load(1)" if version == 2 else "load(0)" if version == 1 else "No older version") in str(err)
        assert not _assert_exact_or_refused(committed, version)


def _labels(manifest: dict[str, Any]) -> Any:
    """What the restore takes from a manifest on trust (no hash covers it): names, dtypes, shapes, meta."""
    return ([(n, e["dtype"], e["shape"], e.get("logical_dtype")) for n, e in manifest["tensors"].items()],
            json.dumps(manifest["meta"], sort_keys=True))


@given(version=st.sampled_from(VERSIONS), data=st.data())
def test_flipped_manifest_bytes_never_restore_other_bytes(committed: Committed, version: int,
                                                          data: st.DataObject) -> None:
    """Any byte may change. Every restored tensor holds bytes committed as one of the version's tensors (every
    chunk is hashed); only a change to what no hash covers (a name, a dtype, a shape of the same size, the meta: see
    test_a_manifest_that_stays_valid_is_trusted) can relabel them."""
    damaged = bytearray(committed.manifests[version])
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(damaged) - 1), st.integers(1, 255)), min_size=1,
                               max_size=4), label="flips (position, xor)")
    for position, mask in flips:
        damaged[position] ^= mask
    with _damaged(committed, committed.manifest_path(version), bytes(damaged)):
        outcome = _load(committed, version)
        if isinstance(outcome, CheckpointError):
            _assert_refused(outcome, version)
            return
        committed_bytes = {a.tobytes() for a in committed.states[version].values()}
        assert all(a.tobytes() in committed_bytes for a in outcome.tensors.values())
        if _labels(json.loads(bytes(damaged))) == _labels(json.loads(committed.manifests[version])):
            _assert_exact(committed, outcome)


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a manifest's JSON, but none inside `meta` (free-form: any JSON is valid there)."""
    yield prefix
    if prefix == ("meta",):
        return
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from _paths(child, (*prefix, key))


def _kind(value: Any) -> str:
    return {bool: "bool", int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), "null")


_JSON_OF_KIND = {
    "null": st.none(),
    "bool": st.booleans(),
    "number": st.integers() | st.floats(),
    "string": st.text(max_size=20),
    "array": st.lists(st.integers() | st.text(max_size=3), max_size=3),
    "object": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
}


def _edited(manifest_bytes: bytes, path: tuple, edit: Any) -> bytes:
    """The manifest with the value at `path` replaced by `edit(value)`, or its key dropped when `edit` is None."""
    manifest = json.loads(manifest_bytes)
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    if edit is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = edit(parent[path[-1]])
    return json.dumps(manifest).encode()


@given(version=st.sampled_from(VERSIONS), data=st.data())
def test_a_manifest_value_of_the_wrong_type_is_refused_or_read_as_the_same(committed: Committed, version: int,
                                                                          data: st.DataObject) -> None:
    """Each value replaced by one of another JSON type: refused, or (pydantic's lax mode reading "24" as 24, 1 as
    True) read as a value that restores the same."""
    manifest = json.loads(committed.manifests[version])
    path = data.draw(st.sampled_from([p for p in _paths(manifest) if p]), label="path")
    value = manifest
    for key in path:
        value = value[key]
    kinds = [k for k in _JSON_OF_KIND if k != _kind(value)]
    if path[-1] == "logical_dtype":  # a label no hash covers, null or a string (the trusted-label test's case)
        kinds = [k for k in kinds if k not in ("null", "string")]
    replacement = data.draw(st.sampled_from(kinds).flatmap(_JSON_OF_KIND.get), label="replacement")
    with _unsealed(committed, version,
                  _edited(committed.manifests[version], path, lambda _: replacement)):
        _assert_exact_or_refused(committed, version)


_MODELS = {0: Manifest, 2: TensorEntry, 4: ChunkEntry}  # by path length: top level, a tensor, a chunk


@given(version=st.sampled_from(VERSIONS), data=st.data())
def test_a_manifest_without_a_key_is_refused_or_read_as_the_same(committed: Committed, version: int,
                                                                 data: st.DataObject) -> None:
    """Every key of the schema may go: one the schema requires is refused; one with a default reads as that
    default, which restores the same (`meta` and a tensor's `logical_dtype` would not: the trusted-label test)."""
    manifest = json.loads(committed.manifests[version])
    keys = [p for p in _paths(manifest) if len(p) in (1, 3, 5) and isinstance(p[-1], str)
            and p[-1] not in ("meta", "logical_dtype")]
    path = data.draw(st.sampled_from(keys), label="dropped key")
    required = _MODELS[len(path) - 1].model_fields[path[-1]].is_required()
    with _unsealed(committed, version, _edited(committed.manifests[version], path, None)):
        loads = _assert_exact_or_refused(committed, version)
    assert not (required and loads), f"{path} is required, yet version {version} loaded without it"


@given(version=st.sampled_from(VERSIONS), schema=st.integers().filter(lambda n: n not in (2, 3, 4)))
def test_a_manifest_of_another_schema_is_refused_naming_the_schemas_read(committed: Committed, version: int,
                                                                         schema: int) -> None:
    with _unsealed(committed, version,
                  _edited(committed.manifests[version], ("schema_version",), lambda _: schema)):
        err = _assert_refused(_load(committed, version), version, ManifestCorruptError)
        assert "not a valid schema 2, 3 or 4 manifest" in str(err) and "schema_version" in str(err)
        _assert_exact_or_refused(committed, version)


@pytest.mark.parametrize("shape", [[0, 10**20], [0, 2**40, 2**40], [1] * 70 + [0]],
                         ids=["a-dimension-beyond-intp", "a-size-beyond-intp", "71-dimensions"])
def test_an_empty_tensor_numpy_cannot_shape_is_refused_naming_its_version(committed: Committed, shape: list) -> None:
    """An empty tensor's shape is covered by no byte count: one numpy refuses failed after the restore, bare."""
    with _unsealed(committed, 2,
                  _edited(committed.manifests[2], ("tensors", "empty", "shape"), lambda _: shape)):
        err = _assert_refused(_load(committed, 2), 2, ManifestCorruptError)
        assert "tensors.empty" in str(err)


_STILL_VALID = {
    "a dtype's byte order": (("tensors", "w", "dtype"), lambda _: ">f4"),
    "a dtype of the same size": (("tensors", "steps", "dtype"), lambda _: "<f8"),
    "a shape of the same size": (("tensors", "w", "shape"), lambda _: [16, 64]),
    "an empty tensor's shape": (("tensors", "empty", "shape"), lambda _: [0, 5]),
    "a logical dtype": (("tensors", "half", "logical_dtype"), lambda _: None),
    "a meta value": (("meta", "iteration"), lambda _: 7),
    "the meta": (("meta",), None),
    "a tensor": (("tensors", "b"), None),
}


@pytest.mark.parametrize("edit", _STILL_VALID.values(), ids=_STILL_VALID.keys())
def test_a_manifest_edited_into_another_valid_one_is_refused(committed: Committed, edit: tuple) -> None:
    path, change = edit
    with _damaged(committed, committed.manifest_path(2), _edited(committed.manifests[2], path, change)):
        _assert_refused(_load(committed, 2), 2, ManifestCorruptError)


# ------------------------------------------------------------------------------------------------ chunk objects

_CHUNK_DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255))),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("delete"), st.none()),
)


def _apply(data: bytes, damage: tuple[str, Any]) -> bytes | None:
    kind, arg = damage
    if kind == "truncate":
        return data[: int(arg * len(data))]
    if kind == "flip":
        at, mask = int(arg[0] * len(data)), arg[1]
        return data[:at] + bytes([data[at] ^ mask]) + data[at + 1 :]
    return data + arg if kind == "append" else None


@given(data=st.data(), damage=_CHUNK_DAMAGE)
def test_a_damaged_chunk_object_fails_exactly_the_versions_that_read_it(committed: Committed, data: st.DataObject,
                                                                        damage: tuple[str, Any]) -> None:
    sha = data.draw(st.sampled_from(sorted(set().union(*committed.needs))), label="object")
    path = committed.object_path(sha)
    with _damaged(committed, path, _apply(committed.fs.cat_file(path), damage)):
        for v in VERSIONS:
            outcome = _load(committed, v)
            if sha not in committed.needs[v]:
                assert isinstance(outcome, Snapshot), outcome
                _assert_exact(committed, outcome)
                continue
            err = _assert_refused(outcome, v, ChunkMissingError if damage[0] == "delete" else ChunkCorruptError)
            assert err.chunk == sha and sha in str(err) and err.tensor in committed.states[v]
        intact = [v for v in VERSIONS if sha not in committed.needs[v]]
        newest = _load(committed, None)
        if intact:
            assert isinstance(newest, Snapshot) and newest.version == intact[-1], newest
            _assert_exact(committed, newest)
        else:
            assert isinstance(newest, RestoreError) and "No older version is loadable" in str(newest)

