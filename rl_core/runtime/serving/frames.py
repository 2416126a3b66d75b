"""The env service's binary WebSocket frame: a JSON header and raw arrays, so a large batch's numbers travel as bytes
instead of JSON text (and nothing from the network is ever unpickled).

    frame   = MAGIC | u32 little-endian header length | header (UTF-8 JSON object) | payload
    header  = {"type": ..., "data": {...}, "arrays": [{"name": str, "dtype": str, "shape": [int, ...]}, ...]}
    payload = each array's bytes, C order, in the header's order, with nothing after the last

Dtypes are little-endian float64/float32, bool and int64 only. A client that sends a binary frame is answered with
one; a text frame (OpenEnv's JSON) with text.
"""
from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

MAGIC = b"GFB1"
DTYPES = {"<f8": np.dtype("<f8"), "<f4": np.dtype("<f4"), "|b1": np.dtype("|b1"), "<i8": np.dtype("<i8")}
MAX_ARRAYS = 16
MAX_DIMS = 2
_LENGTH = struct.Struct("<I")


class FrameError(ValueError):
    """A binary frame that does not follow the layout above; the message says where it breaks it."""


def encode_frame(kind: str, data: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """The frame of message `kind` with JSON `data` and `arrays` (converted to a supported dtype)."""
    specs, blobs = [], []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array, dtype=_wire_dtype(array.dtype))
        specs.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape)})
        blobs.append(array.tobytes())
    header = json.dumps({"type": kind, "data": data, "arrays": specs}, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, *blobs])


def decode_frame(frame: bytes) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(type, data, arrays) of a frame, or a FrameError. Arrays are read-only views of `frame`."""
    if len(frame) < len(MAGIC) + _LENGTH.size or not frame.startswith(MAGIC):
        raise FrameError(f"a binary frame starts with {MAGIC!r} and a 4-byte header length")
    (length,) = _LENGTH.unpack_from(frame, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if length > len(frame) - start:
        raise FrameError(f"the header length {length} exceeds the frame's {len(frame) - start} bytes after it")
    try:
        header = json.loads(frame[start:start + length])
    except (ValueError, RecursionError) as err:  # RecursionError: JSON nested deeper than Python's stack
        raise FrameError(f"the header is not UTF-8 JSON: {err}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise FrameError('the header must be a JSON object with a string "type"')
    data, specs = header.get("data", {}), header.get("arrays", [])
    if not isinstance(data, dict):
        raise FrameError('the header\'s "data" must be a JSON object')
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise FrameError(f'the header\'s "arrays" must be a list of at most {MAX_ARRAYS} array descriptions')
    arrays, offset = {}, start + length
    for spec in specs:
        name, dtype, shape = _spec(spec)
        size = math.prod(shape) * dtype.itemsize
        if size > len(frame) - offset:
            raise FrameError(f"array {name!r} ({dtype.str} {shape}) needs {size} bytes; the frame has "
                             f"{len(frame) - offset} left")
        arrays[name] = np.frombuffer(frame, dtype, math.prod(shape), offset).reshape(shape)
        offset += size
    if offset != len(frame):
        raise FrameError(f"{len(frame) - offset} bytes follow the last array the header describes")
    return header["type"], data, arrays


def _spec(spec: Any) -> tuple[str, np.dtype, list[int]]:
    if not isinstance(spec, dict) or set(spec) != {"name", "dtype", "shape"}:
        raise FrameError('each array description is {"name": str, "dtype": str, "shape": [int, ...]}')
    name, dtype, shape = spec["name"], spec["dtype"], spec["shape"]
    if not isinstance(name, str) or dtype not in DTYPES:
        raise FrameError(f"array {name!r}: dtype must be one of {', '.join(DTYPES)}, found {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(type(n) is int and 0 <= n < 2**31 for n in shape)):
        raise FrameError(f"array {name!r}: shape must be a list of at most {MAX_DIMS} non-negative ints, "
                         f"found {shape!r}")
    return name, DTYPES[dtype], shape


def _wire_dtype(dtype: np.dtype) -> np.dtype:
    """The supported dtype an array of `dtype` travels as (floats keep float32, ints become int64)."""
    if dtype.kind == "b":
        return DTYPES["|b1"]
    if dtype.kind in "iu":
        return DTYPES["<i8"]
    return DTYPES["<f4"] if dtype == np.float32 else DTYPES["<f8"]
