"""Damaged step outputs (tensor files), fuzzed (issue 20, "Bad input, fuzzed"): truncated, extended or flipped
anywhere, a file is refused with a TensorFileError naming its URL, or (a change JSON ignores) read exactly; never
other arrays than those written."""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save as st_save

from rl_core.data import TensorFileError, read_tensors, write_tensors
from tests.checkpoint.store_helpers import assert_same_tensors

TENSOR_FILE_ARRAYS = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "act": np.arange(3, dtype=np.int64),
                      "done": np.array([True, False, True]), "ret": np.array(2.5)}
TENSOR_FILE_META = {"iteration": 7, "version": 6, "worker": 1}


@pytest.fixture(scope="module", params=["memory", "file"])
def tensor_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[str, bytes]]:
    """One file on an object-like store (read in one get) and one on local disk (read by safetensors' safe_open)."""
    folder = (f"memory:///tensorfile-fuzz-{uuid.uuid4().hex}" if request.param == "memory"
              else f"file://{tmp_path_factory.mktemp('tensorfile-fuzz')}")
    url = f"{folder}/experience-000.safetensors"
    write_tensors(url, TENSOR_FILE_ARRAYS, TENSOR_FILE_META)
    fs, path = fsspec.core.url_to_fs(url)
    yield url, fs.cat_file(path)
    fs.rm_file(path)


def _read_back(url: str, data: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]] | TensorFileError:
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(path, data)
    try:
        return read_tensors(url)
    except TensorFileError as exc:
        assert url in str(exc)
        return exc


def _header_end(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little")


@given(data=st.data())
def test_a_damaged_tensor_file_is_refused_naming_its_url(tensor_file: tuple[str, bytes], data: st.DataObject) -> None:
    """Truncated, extended, or any bytes changed (its header's above all): refused naming the URL, or (a change
    JSON ignores) read exactly."""
    url, original = tensor_file
    where = data.draw(st.sampled_from(["header", "anywhere"]), label="flips in")
    span = _header_end(original) if where == "header" else len(original)
    damage = data.draw(st.one_of(
        st.tuples(st.just("truncate"), st.integers(0, len(original) - 1)),
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, span - 1), st.integers(1, 255)), min_size=1,
                                            max_size=4)),
    ), label="damage")
    kind, arg = damage
    if kind == "truncate":
        damaged = original[:arg]
    elif kind == "append":
        damaged = original + arg
    else:
        buf = bytearray(original)
        for position, mask in arg:
            buf[position] ^= mask
        damaged = bytes(buf)
    try:
        outcome = _read_back(url, damaged)
    finally:
        _read_back(url, original)
    if kind != "flip":
        assert isinstance(outcome, TensorFileError), f"{kind}: read despite the damage"
    if isinstance(outcome, TensorFileError):
        return
    arrays, meta = outcome
    assert_same_tensors(arrays, TENSOR_FILE_ARRAYS)
    assert meta == TENSOR_FILE_META


def test_a_tensor_file_written_before_the_checksum_still_reads(tensor_file: tuple[str, bytes]) -> None:
    url, _ = tensor_file
    legacy = st_save(dict(TENSOR_FILE_ARRAYS), metadata={"gymflow": json.dumps(TENSOR_FILE_META)})
    arrays, meta = _read_back(url, legacy)
    assert_same_tensors(arrays, TENSOR_FILE_ARRAYS)
    assert meta == TENSOR_FILE_META
    renamed = legacy.replace(b'"gymflow"', b'"gymflox"')  # its one key damaged: no longer read as empty meta
    assert isinstance(_read_back(url, renamed), TensorFileError)
