"""Named arrays plus a JSON header in one object on any fsspec URL (safetensors format: no pickle).

Used for experience shards, scored batches and staged learner state: the things steps hand to each
other through the store, so a retried or resumed step reads exactly what its predecessor wrote. The header
carries an XXH3-128 of the arrays (names, dtypes, shapes, bytes) and the meta, checked on every read: safetensors
checks only that the header's offsets cover the file, so a damaged byte would otherwise read as another value.
Each array and the meta also carry an XXH3-64 of their own, so a reader that wants some of the arrays (a generator
wants a learner state's weights, not its Adam moments: a third of a full fine-tune's) reads and checks those alone.

On a local store the file is written and read by safetensors itself (`save_file`, `safe_open`), straight between the
arrays and the file: a staged learner state of a full fine-tune is 1.6 GB, and building it as one bytes object (and
reading it back as one, then copying each array out) cost two more copies and their page faults per handoff. It is
written beside its final name and renamed, so a reader never sees half a file. Other stores get one whole put.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
from typing import Any

import fsspec
import numpy as np
import xxhash
from fsspec.implementations.local import LocalFileSystem
from safetensors import safe_open
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save
from safetensors.numpy import save_file as st_save_file

_META_KEY = "gymflow"
_DIGEST_KEY = "gymflow_xxh3"
_EACH_KEY = "gymflow_xxh3_each"


class TensorFileError(RuntimeError):
    """A tensor file is missing or unreadable; the message names the URL."""


Tensors = dict[str, np.ndarray]
"""Named arrays: what steps hand each other through the store and what a checkpoint holds."""

def write_tensors(url: str, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> int:
    """Write `arrays` and JSON-able `meta` to `url` as one whole object; returns its size in bytes."""
    arrays = {k: _c_contiguous(v) for k, v in arrays.items()}
    meta_json = json.dumps(meta or {})
    metadata = {_META_KEY: meta_json, _DIGEST_KEY: _digest(arrays, meta_json),
                _EACH_KEY: json.dumps({"meta": xxhash.xxh3_64_hexdigest(meta_json.encode()),
                                       "arrays": {name: _array_digest(name, a) for name, a in arrays.items()}})}
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    if isinstance(fs, LocalFileSystem):
        partial = f"{path}.partial-{secrets.token_hex(4)}"
        try:
            st_save_file(arrays, partial, metadata=metadata)
            os.replace(partial, path)  # whole or not at all, as a put is
        finally:
            if os.path.exists(partial):
                os.remove(partial)
        for stale in glob.glob(f"{glob.escape(path)}.partial-*"):  # of writes of this file killed mid-way
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)
        return os.path.getsize(path)
    payload = st_save(arrays, metadata=metadata)
    fs.pipe_file(path, payload)  # one whole put: no half-written object on object stores
    return len(payload)


def _c_contiguous(array: np.ndarray) -> np.ndarray:
    """C-ordered without changing shape (np.ascontiguousarray would turn a 0-d array into 1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


def _digest(arrays: dict[str, np.ndarray], meta_json: str) -> str:
    """XXH3-128 of what a reader gets back: each array's name, dtype, shape and bytes (little-endian, as safetensors
    stores them), then the meta's JSON."""
    h = xxhash.xxh3_128()
    for name in sorted(arrays):
        _hash_array(h, name, arrays[name])
    h.update(meta_json.encode())
    return h.hexdigest()


def _array_digest(name: str, array: np.ndarray) -> str:
    """XXH3-64 of one array as a reader gets it back (its own checksum, for a reader that takes some arrays)."""
    return _hash_array(xxhash.xxh3_64(), name, array).hexdigest()


def _hash_array(h: Any, name: str, array: np.ndarray) -> Any:
    """`h` fed an array's name, dtype, shape and little-endian bytes; returns `h`."""
    stored = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    h.update(json.dumps([name, stored.dtype.str, list(array.shape)]).encode())
    h.update(stored)
    return h


def read_tensors(url: str, prefix: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and meta written by `write_tensors`; with `prefix`, only the arrays whose names start with it (read
    and checked alone from a local file that carries per-array checksums, else filtered after a whole read)."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        if isinstance(fs, LocalFileSystem):
            arrays, meta_json, digest = _read_local(path, prefix)
        else:
            arrays, meta_json, digest = _read_whole(fs, path)
        meta = json.loads(meta_json)
    except FileNotFoundError:
        raise TensorFileError(f"{url} is missing: the step that writes it has not completed") from None
    except Exception as err:  # safetensors raises its own error types for truncated/garbled files
        raise TensorFileError(f"{url} is not a readable tensor file ({err}); rerun the step that writes it") from err
    if digest is not None and digest != _digest(arrays, meta_json):
        raise TensorFileError(f"{url} does not hold what was written: its arrays or meta no longer match the "
                              "checksum written with them (damaged in storage); rerun the step that writes it")
    if prefix is not None:
        arrays = {name: array for name, array in arrays.items() if name.startswith(prefix)}
    return arrays, meta


def _read_local(path: str, prefix: str | None) -> tuple[Tensors, str, str | None]:
    """(arrays, meta JSON, whole-file checksum) of a local file: each array copied once, from the file into its own
    memory. With `prefix` and per-array checksums, only the arrays it selects, each checked here (the whole-file
    checksum answered is then None: nothing is left for it to check)."""
    with safe_open(path, framework="np") as opened:
        metadata = _checked_metadata(opened.metadata() or {})
        names = list(opened.keys())
        meta_json = metadata.get(_META_KEY, "{}")
        if prefix is None or _EACH_KEY not in metadata:
            return {name: opened.get_tensor(name) for name in names}, meta_json, metadata.get(_DIGEST_KEY)
        each = json.loads(metadata[_EACH_KEY])
        if each["meta"] != xxhash.xxh3_64_hexdigest(meta_json.encode()):
            raise ValueError("its meta does not match the checksum written with it")
        arrays = {}
        for name in (name for name in names if name.startswith(prefix)):
            arrays[name] = opened.get_tensor(name)
            if each["arrays"][name] != _array_digest(name, arrays[name]):
                raise ValueError(f"array {name!r} does not match the checksum written with it")
    return arrays, meta_json, None


def _read_whole(fs: fsspec.AbstractFileSystem, path: str) -> tuple[Tensors, str, str | None]:
    """(arrays, meta JSON, checksum) of an object read in one get."""
    payload = fs.cat_file(path)
    arrays = st_load(payload)
    size = int.from_bytes(payload[:8], "little")
    metadata = _checked_metadata(json.loads(payload[8 : 8 + size]).get("__metadata__") or {})
    return {k: np.array(v) for k, v in arrays.items()}, metadata.get(_META_KEY, "{}"), metadata.get(_DIGEST_KEY)


def _checked_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """The header's metadata, as write_tensors writes it. A file written before the checksum existed holds the meta
    alone: any other key there means a damaged header."""
    if _DIGEST_KEY not in metadata and set(metadata) - {_META_KEY}:  # (per-array sums came with the whole one)
        raise ValueError(f"its header metadata holds {sorted(metadata)}, not what write_tensors writes")
    return metadata
