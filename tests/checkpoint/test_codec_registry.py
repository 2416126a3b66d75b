"""The codec registry's promise: registering a codec is all it takes for the store to choose, write, validate
and restore it; a manifest naming a codec this process does not know fails clearly, naming the known ones."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore, Manifest, ManifestCorruptError
from rl_core.checkpoint.codec import (
    ChunkBytes,
    CodecSpec,
    available_codecs,
    decode_full,
    encode_planes,
    get_codec,
    register_codec,
    unregister_codec,
)
from tests.checkpoint.store_helpers import assert_same_tensors, commit_manifest_as_is, fs_root

BUILTIN = ["full", "xor", "diff", "rows", "same"]


def _words(u8: np.ndarray, itemsize: int) -> np.ndarray:
    """The raw bytes as the widest unsigned words dividing the element size (as codec.py's "diff" does)."""
    return u8.view(next(w for w in (np.uint64, np.uint32, np.uint16, np.uint8) if itemsize % w().itemsize == 0))


def _encode_neg(c: ChunkBytes) -> bytes:
    """Wrap-around sum with the reference: all zero bytes where an integer tensor is its reference negated."""
    return encode_planes(np.add(_words(c.raw, c.itemsize), _words(c.ref, c.itemsize)).view(np.uint8), c.itemsize)


def _decode_neg(payload: bytes, ref: np.ndarray | None, itemsize: int, row_bytes: int | None,
                out: np.ndarray | None) -> np.ndarray:
    flat = decode_full(payload, itemsize, out=out)
    np.subtract(_words(flat, itemsize), _words(ref, itemsize), out=_words(flat, itemsize))
    return flat


@pytest.fixture
def neg_codec() -> Iterator[CodecSpec]:
    """A toy dense codec, registered for one test only."""
    spec = register_codec("neg", encode=_encode_neg, decode=_decode_neg, needs_ref=True, dense=True)
    yield spec
    unregister_codec("neg")


@pytest.mark.parametrize("n", [1000, 50_000])  # one small chunk / a chunk big enough to choose on samples
def test_a_registered_codec_is_chosen_committed_and_restored(url: str, neg_codec: CodecSpec, n: int) -> None:
    rng = np.random.default_rng(7)
    state = {
        "ints": rng.integers(-(2**31), 2**31, n, dtype=np.int32),
        "w": rng.standard_normal(256).astype(np.float32),
        "frozen": np.arange(64, dtype=np.uint8),
    }
    store = CheckpointStore(url)
    store.commit(state, {})
    new = {"ints": -state["ints"], "w": state["w"] + np.float32(1e-3), "frozen": state["frozen"]}
    store.commit(new, {})
    chunk = store.manifest(1)["tensors"]["ints"]["chunks"][0]
    assert chunk["codec"] == "neg" and chunk["ref_version"] == 0 and chunk["ref_chunk"] is not None
    assert chunk["encoded_bytes"] < n // 10  # it won by size, as any dense codec must
    assert store.size_report(1)["codec_counts"]["neg"] == 1
    assert_same_tensors(CheckpointStore(url).load(1).tensors, new)
    assert CheckpointStore(url).verify() == {"checked": [0, 1], "errors": {}}


def test_registration_order_and_lookup() -> None:
    assert [c.name for c in available_codecs()] == BUILTIN
    assert [c.name for c in available_codecs() if c.dense] == ["full", "xor", "diff"]  # the tie order
    assert get_codec("rows").row_bytes and get_codec("same").encode is None and not get_codec("full").needs_ref


def test_registration_refuses_duplicates_and_never_replaces_a_built_in(neg_codec: CodecSpec) -> None:
    with pytest.raises(ValueError, match="'neg' is already registered"):
        register_codec("neg", encode=_encode_neg, decode=_decode_neg, needs_ref=True, dense=True)
    assert register_codec("neg", encode=_encode_neg, decode=_decode_neg, needs_ref=True, clobber=True).dense is False
    with pytest.raises(ValueError, match="built-in"):
        register_codec("xor", encode=_encode_neg, decode=_decode_neg, needs_ref=True, clobber=True)
    with pytest.raises(ValueError, match="built in"):
        unregister_codec("same")
    with pytest.raises(ValueError, match="stores no payload"):
        register_codec("nothing", encode=None, decode=_decode_neg, needs_ref=False, dense=True)
    assert [c.name for c in available_codecs()] == [*BUILTIN, "neg"]


def test_an_unknown_codec_in_a_manifest_fails_naming_the_known_ones(tmp_path) -> None:
    url = f"file://{tmp_path}/run"
    store = CheckpointStore(url)
    store.commit({"w": np.arange(10, dtype=np.float32)}, {})
    fs, root = fs_root(url)
    path = f"{root}/versions/{0:08d}.json"
    manifest = json.loads(fs.cat_file(path))
    manifest["tensors"]["w"]["chunks"][0]["codec"] = "zfp"  # as a gymflow with that codec registered wrote it
    commit_manifest_as_is(url, 0, json.dumps(manifest).encode())
    known = "known codecs: full, xor, diff, rows, same"
    with pytest.raises(ValueError, match=f"unknown chunk codec 'zfp'; {known}"):
        Manifest.model_validate(manifest)
    with pytest.raises(ManifestCorruptError, match=f"unknown chunk codec 'zfp'; {known}"):
        CheckpointStore(url).load(0)
    assert "unknown chunk codec 'zfp'" in CheckpointStore(url).verify()["errors"][0]


def test_a_store_using_an_unregistered_codec_says_so(url: str, neg_codec: CodecSpec) -> None:
    ints = np.arange(-500, 500, dtype=np.int64)
    store = CheckpointStore(url)
    store.commit({"ints": ints}, {})
    store.commit({"ints": -ints}, {})
    unregister_codec("neg")
    try:
        with pytest.raises(ManifestCorruptError, match="unknown chunk codec 'neg'; known codecs: full, xor"):
            CheckpointStore(url).load(1)
        assert_same_tensors(CheckpointStore(url).load(0).tensors, {"ints": ints})
    finally:
        register_codec("neg", encode=_encode_neg, decode=_decode_neg, needs_ref=True, dense=True)
