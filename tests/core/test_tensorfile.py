"""Step outputs round-trip exactly, and a missing or garbled one names its URL."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors import SafetensorError
from safetensors.numpy import save as st_save

from rl_core.data import TensorFileError, read_tensors, write_tensors
from rl_core.data.tensorfile import _digest


def test_round_trip_keeps_shapes_dtypes_and_meta(tmp_path) -> None:
    arrays = {"scalar": np.array(2.5), "m": np.arange(12, dtype=np.int64).reshape(3, 4),
              "t": np.arange(6, dtype=np.float32).reshape(2, 3).T}  # a non-contiguous view
    url = f"file://{tmp_path}/x/a.safetensors"
    write_tensors(url, arrays, {"iteration": 3})
    back, meta = read_tensors(url)
    assert meta == {"iteration": 3}
    for k, v in arrays.items():
        assert back[k].shape == v.shape and back[k].dtype == v.dtype and np.array_equal(back[k], v)


def test_missing_file_names_the_url(tmp_path) -> None:
    with pytest.raises(TensorFileError, match="missing"):
        read_tensors(f"file://{tmp_path}/nope.safetensors")


def test_garbled_file_names_the_url(tmp_path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(TensorFileError, match="not a readable tensor file"):
        read_tensors(f"file://{path}")


def test_a_local_write_leaves_no_partial_file_and_replaces_whole(tmp_path) -> None:
    """Written beside its name and renamed: the folder holds the file alone (what a killed write of it left is
    removed), and a rewrite replaces it whole."""
    url = f"file://{tmp_path}/a.safetensors"
    (tmp_path / "a.safetensors.partial-0bad").write_bytes(b"half")  # a write of it killed mid-way
    write_tensors(url, {"x": np.zeros(3)}, {"n": 1})
    size = write_tensors(url, {"x": np.arange(5.0), "flags": np.array([True, False])}, {"n": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]
    assert size == (tmp_path / "a.safetensors").stat().st_size
    back, meta = read_tensors(url)
    assert meta == {"n": 2} and np.array_equal(back["x"], np.arange(5.0)) and back["flags"].dtype == bool
    back["x"][0] = 7.0  # the arrays read are the caller's own, writable


def test_a_failed_local_write_leaves_the_old_file(tmp_path) -> None:
    url = f"file://{tmp_path}/a.safetensors"
    write_tensors(url, {"x": np.ones(2)})
    with pytest.raises(SafetensorError, match="Unknown dtype"):
        write_tensors(url, {"x": np.array(["text"], dtype=object)})  # no such safetensors dtype
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]
    assert np.array_equal(read_tensors(url)[0]["x"], np.ones(2))


def _byte_of(path, name: str) -> int:
    """The file offset of array `name`'s first byte."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    return 8 + size + header[name]["data_offsets"][0]


@pytest.mark.parametrize("store", ["file", "memory"])
def test_a_prefix_reads_those_arrays_alone_and_checks_them(tmp_path, store: str) -> None:
    """A generator reads a learner state's weights without its optimizer state: the same arrays a whole read gives."""
    arrays = {"model.w": np.arange(6, dtype=np.float32).reshape(2, 3), "model.b": np.ones(3),
              "optim.m": np.full(6, 0.5, dtype=np.float32), "step": np.array(4)}
    folder = f"file://{tmp_path}" if store == "file" else f"memory:///prefix-read-{tmp_path.name}"
    url = f"{folder}/staged.safetensors"
    write_tensors(url, arrays, {"iteration": 2})
    some, meta = read_tensors(url, prefix="model.")
    assert meta == {"iteration": 2} and sorted(some) == ["model.b", "model.w"]
    whole, _ = read_tensors(url)
    assert all(np.array_equal(some[k], whole[k]) and some[k].dtype == whole[k].dtype for k in some)


def test_a_prefix_read_refuses_a_damaged_array_it_reads_and_ignores_one_it_does_not(tmp_path) -> None:
    path = tmp_path / "staged.safetensors"
    write_tensors(f"file://{path}", {"model.w": np.arange(4.0), "optim.m": np.arange(4.0)}, {"n": 1})
    original = path.read_bytes()
    for name, refused in (("model.w", True), ("optim.m", False)):
        damaged = bytearray(original)
        damaged[_byte_of(path, name)] ^= 0x40
        path.write_bytes(bytes(damaged))
        if refused:
            with pytest.raises(TensorFileError, match="model.w"):
                read_tensors(f"file://{path}", prefix="model.")
        else:
            assert np.array_equal(read_tensors(f"file://{path}", prefix="model.")[0]["model.w"], np.arange(4.0))
        with pytest.raises(TensorFileError, match="checksum"):  # a whole read checks every array
            read_tensors(f"file://{path}")
        path.write_bytes(original)


def test_a_prefix_read_of_a_file_without_per_array_checksums_reads_it_whole(tmp_path) -> None:
    """Files written before per-array checksums: read whole, checked whole, then filtered."""
    path = tmp_path / "old.safetensors"
    arrays = {"model.w": np.arange(3.0), "optim.m": np.zeros(3)}
    meta_json = json.dumps({"n": 1})
    path.write_bytes(st_save(arrays, metadata={"gymflow": meta_json, "gymflow_xxh3": _digest(arrays, meta_json)}))
    back, meta = read_tensors(f"file://{path}", prefix="model.")
    assert list(back) == ["model.w"] and meta == {"n": 1}
