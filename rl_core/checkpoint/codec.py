"""Lossless byte codecs for tensor payloads: byte planes + zstd, optionally after an XOR with a parent.

Why byte planes: in a float array the sign/exponent bytes of neighbouring elements are nearly identical while
the low mantissa bytes look random. Grouping byte k of every element together (plane k) puts the compressible
bytes next to each other, so zstd finds them; interleaved, it mostly does not.

Why XOR: two checkpoints a few optimizer steps apart share most high-order bits, so the XOR of their bit
patterns is mostly zero bytes in the high planes. XOR is exactly invertible, so the codec stays lossless.

Why "diff" as well: XOR only zeroes the bits two values share from the top. The wrap-around difference of the
bit patterns (as unsigned integers of the element's word size) is small whenever the values are close, even
when the change carries into higher bits (a small negative step gives 0xFF high bytes, which compress as well
as 0x00); on Adam state 20 steps apart it stores fewer bytes than XOR (docs/benchmarks.md). Exactly invertible.

Why zstd level 1: on this project's tensors level 3 was never smaller, and it is slower (docs/benchmarks.md;
bench/checkpoint.py measures the codecs).

All functions take raw bytes (anything exposing the buffer protocol: bytes, memoryview, contiguous uint8
arrays) plus the element size, and never look at the dtype: the caller owns dtype/shape bookkeeping.
Decoders return a 1-D uint8 array holding the raw bytes; pass ``out`` to decode straight into the memory of the
array the caller will hand out.

Why a registry (end of this file, in the style of fsspec's ``register_implementation``): it is the one place
that says what a codec named in a manifest is (encoder, decoder, whether it needs a reference, whether every
changed chunk tries it or only sparse-row chunks), and chunk choice (chunks.py), manifest validation
(manifest.py) and restore (restore.py) only consult it, so a new codec is one :func:`register_codec` call. The
built-in names and payloads are the on-disk format of existing stores: they cannot be replaced or removed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import zstandard

__all__ = [
    "ZSTD_LEVEL",
    "ChunkBytes",
    "CodecSpec",
    "available_codecs",
    "changed_rows",
    "decode_full",
    "decode_rows",
    "decode_diff",
    "decode_xor",
    "diff_bytes",
    "encode_diff",
    "encode_full",
    "encode_picked_rows",
    "encode_planes",
    "encode_rows",
    "encode_xor",
    "get_codec",
    "register_codec",
    "unregister_codec",
    "xor_bytes",
]

ZSTD_LEVEL = 1

_thread_state = threading.local()

Buffer = bytes | bytearray | memoryview | np.ndarray


def _compressor() -> zstandard.ZstdCompressor:
    """This thread's compressor: creating one per call costs more than compressing a small tensor, and
    zstandard context objects must not be shared between threads."""
    cctx = getattr(_thread_state, "cctx", None)
    if cctx is None:
        cctx = _thread_state.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor, reused for the same reason as :func:`_compressor`."""
    dctx = getattr(_thread_state, "dctx", None)
    if dctx is None:
        dctx = _thread_state.dctx = zstandard.ZstdDecompressor()
    return dctx


def _as_bytes_array(raw: Buffer, itemsize: int, what: str) -> np.ndarray:
    """View ``raw`` as flat uint8 without copying, and reject lengths that cannot hold whole elements."""
    if itemsize < 1:
        raise ValueError(f"itemsize must be >= 1, got {itemsize}")
    u8 = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
    if u8.size % itemsize:
        raise ValueError(
            f"{what} has {u8.size} bytes, which is not a multiple of itemsize {itemsize}: "
            "pass the array's raw bytes and its dtype's itemsize"
        )
    return u8


def _to_planes(u8: np.ndarray, itemsize: int) -> np.ndarray:
    """Reorder n*itemsize bytes so byte 0 of every element comes first, then byte 1, ... (C-contiguous)."""
    if itemsize == 1:
        return u8
    return np.ascontiguousarray(u8.reshape(-1, itemsize).T)


def _compress_planes(u8: np.ndarray, itemsize: int) -> bytes:
    return _compressor().compress(_to_planes(u8, itemsize))


def _decompress_planes(encoded: Buffer, itemsize: int, out: np.ndarray | None) -> np.ndarray:
    """Invert :func:`_compress_planes`, writing the element-ordered bytes into ``out`` (or a new array)."""
    try:
        planes = np.frombuffer(_decompressor().decompress(encoded), dtype=np.uint8)
    except zstandard.ZstdError as exc:
        raise ValueError(f"payload is not a valid zstd frame: {exc}") from exc
    if planes.size % itemsize:
        raise ValueError(f"decoded payload has {planes.size} bytes, not a multiple of itemsize {itemsize}")
    if out is None:
        out = np.empty(planes.size, dtype=np.uint8)
    elif out.size != planes.size:
        raise ValueError(f"decoded payload has {planes.size} bytes but the output buffer holds {out.size}")
    if itemsize == 1:
        out[...] = planes
    else:
        out.reshape(-1, itemsize)[...] = planes.reshape(itemsize, -1).T
    return out


def _out_bytes(out: np.ndarray | None) -> np.ndarray | None:
    """Flat writable uint8 view of the caller's output array (0-d and empty arrays included)."""
    if out is None:
        return None
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be a writable C-contiguous array")
    return out.reshape(-1).view(np.uint8)


def encode_full(raw: Buffer, itemsize: int) -> bytes:
    """Encode ``raw`` on its own: byte planes, then zstd level 1."""
    return _compress_planes(_as_bytes_array(raw, itemsize, "raw"), itemsize)


def decode_full(encoded: Buffer, itemsize: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Invert :func:`encode_full`; returns flat uint8 raw bytes (``out``'s bytes when given)."""
    return _decompress_planes(encoded, itemsize, _out_bytes(out))


def encode_xor(raw: Buffer, parent_raw: Buffer, itemsize: int) -> bytes:
    """Encode ``raw`` as the XOR of its bit patterns with ``parent_raw`` (same length), byte planes, zstd-1."""
    new = _as_bytes_array(raw, itemsize, "raw")
    old = _as_bytes_array(parent_raw, itemsize, "parent_raw")
    if new.size != old.size:
        raise ValueError(
            f"raw has {new.size} bytes but parent_raw has {old.size}: XOR needs same-sized tensors; "
            "encode a resized tensor with encode_full"
        )
    return _compress_planes(np.bitwise_xor(new, old), itemsize)


def decode_xor(encoded: Buffer, parent_raw: Buffer, itemsize: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Invert :func:`encode_xor` given the same ``parent_raw``; returns flat uint8 raw bytes."""
    old = _as_bytes_array(parent_raw, itemsize, "parent_raw")
    flat = _decompress_planes(encoded, itemsize, _out_bytes(out))
    if flat.size != old.size:
        raise ValueError(f"decoded payload has {flat.size} bytes but parent_raw has {old.size}")
    np.bitwise_xor(flat, old, out=flat)
    return flat


# ------------------------------------------------------------------------------------- wrap-around diff

_WORDS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


def _word_type(itemsize: int) -> type:
    """The widest unsigned integer type whose size divides ``itemsize`` (complex128: two uint64 words)."""
    return next(word for size, word in _WORDS.items() if itemsize % size == 0)


def diff_bytes(raw: Buffer, parent_raw: Buffer, itemsize: int) -> np.ndarray:
    """(raw - parent_raw) per unsigned word, wrapping modulo 2**bits, as a new flat uint8 array."""
    new = _as_bytes_array(raw, itemsize, "raw")
    old = _as_bytes_array(parent_raw, itemsize, "parent_raw")
    if new.size != old.size:
        raise ValueError(f"raw has {new.size} bytes but parent_raw has {old.size}: diff needs same-sized buffers")
    word = _word_type(itemsize)
    return np.subtract(new.view(word), old.view(word)).view(np.uint8)  # unsigned arithmetic wraps


def encode_diff(raw: Buffer, parent_raw: Buffer, itemsize: int) -> bytes:
    """Encode ``raw`` as its wrap-around difference from ``parent_raw`` (same length), byte planes, zstd-1."""
    return _compress_planes(diff_bytes(raw, parent_raw, itemsize), itemsize)


def decode_diff(encoded: Buffer, parent_raw: Buffer, itemsize: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Invert :func:`encode_diff` given the same ``parent_raw``; returns flat uint8 raw bytes."""
    old = _as_bytes_array(parent_raw, itemsize, "parent_raw")
    flat = _decompress_planes(encoded, itemsize, _out_bytes(out))
    if flat.size != old.size:
        raise ValueError(f"decoded payload has {flat.size} bytes but parent_raw has {old.size}")
    word = _word_type(itemsize)
    np.add(flat.view(word), old.view(word), out=flat.view(word))
    return flat


# ------------------------------------------------------------------------------------------ sparse rows

_ROWS_HEADER = np.dtype("<u8")


def changed_rows(xor: np.ndarray, row_bytes: int) -> np.ndarray:
    """Indices of the rows (``row_bytes`` each) of a flat uint8 XOR buffer that hold a nonzero byte."""
    rows = xor.reshape(-1, row_bytes)
    if row_bytes % 8 == 0:
        rows = rows.view(np.uint64)
    elif row_bytes % 4 == 0:
        rows = rows.view(np.uint32)
    return np.flatnonzero(rows.any(axis=1))


def encode_rows(xor: Buffer, itemsize: int, row_bytes: int, rows: np.ndarray | None = None) -> bytes:
    """Sparse-row codec for 2-D tensors where few rows change (embedding tables under sparse updates).

    Takes the XOR of new and parent bytes (see :func:`xor_bytes`) and stores only the rows with a nonzero byte:
    ``zstd(count as <u8 | row indices as <u4 | byte planes of those XOR'd rows)``. Lossless given the parent.
    """
    x = _as_bytes_array(xor, itemsize, "xor")
    if row_bytes < itemsize or row_bytes % itemsize or x.size % row_bytes:
        raise ValueError(f"row_bytes {row_bytes} must be a multiple of itemsize {itemsize} dividing {x.size}")
    if x.size // row_bytes >= 2**32:
        raise ValueError("encode_rows supports fewer than 2**32 rows per chunk")
    if rows is None:
        rows = changed_rows(x, row_bytes)
    return encode_picked_rows(rows, x.reshape(-1, row_bytes)[rows], itemsize)


def encode_picked_rows(rows: np.ndarray, xor_rows: np.ndarray, itemsize: int) -> bytes:
    """The payload of :func:`encode_rows` from the changed rows alone: their indices (ascending) and their XOR
    with the reference (one row per index). A chained delta computes these without a whole XOR buffer."""
    body = np.concatenate(
        [
            np.array([rows.size], dtype=_ROWS_HEADER).view(np.uint8),
            rows.astype("<u4").view(np.uint8),
            _to_planes(np.ascontiguousarray(xor_rows).reshape(-1), itemsize).reshape(-1),
        ]
    )
    return _compressor().compress(body)


def decode_rows(
    encoded: Buffer, parent_raw: Buffer, itemsize: int, row_bytes: int, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Invert :func:`encode_rows` given the same ``parent_raw``; returns flat uint8 raw bytes."""
    old = _as_bytes_array(parent_raw, itemsize, "parent_raw")
    if row_bytes < 1 or old.size % row_bytes:
        raise ValueError(f"row_bytes {row_bytes} does not divide parent_raw's {old.size} bytes")
    try:
        body = np.frombuffer(_decompressor().decompress(encoded), dtype=np.uint8)
    except zstandard.ZstdError as exc:
        raise ValueError(f"payload is not a valid zstd frame: {exc}") from exc
    if body.size < 8:
        raise ValueError("sparse-rows payload is shorter than its header")
    count = int(body[:8].view(_ROWS_HEADER)[0])
    n_rows = old.size // row_bytes
    if count > n_rows or body.size != 8 + 4 * count + count * row_bytes:
        raise ValueError(f"sparse-rows payload of {body.size} bytes does not hold {count} rows of {row_bytes} bytes")
    rows = body[8 : 8 + 4 * count].view("<u4").astype(np.intp)
    if count and (rows.max() >= n_rows):
        raise ValueError(f"sparse-rows payload names row {rows.max()} but the parent has {n_rows} rows")
    planes = body[8 + 4 * count :]
    flat = _out_bytes(out)
    if flat is None:
        flat = np.empty(old.size, dtype=np.uint8)
    elif flat.size != old.size:
        raise ValueError(f"output buffer holds {flat.size} bytes but parent_raw has {old.size}")
    flat[...] = old
    if count:
        if itemsize == 1:
            xr = planes.reshape(count, row_bytes)
        else:
            xr = np.ascontiguousarray(planes.reshape(itemsize, -1).T).reshape(count, row_bytes)
        view = flat.reshape(n_rows, row_bytes)
        view[rows] ^= xr
    return flat


def xor_bytes(raw: Buffer, parent_raw: Buffer, itemsize: int) -> np.ndarray:
    """XOR of two same-sized raw buffers as a new flat uint8 array."""
    new = _as_bytes_array(raw, itemsize, "raw")
    old = _as_bytes_array(parent_raw, itemsize, "parent_raw")
    if new.size != old.size:
        raise ValueError(f"raw has {new.size} bytes but parent_raw has {old.size}: XOR needs same-sized buffers")
    return np.bitwise_xor(new, old)


def encode_planes(u8: Buffer, itemsize: int) -> bytes:
    """Byte planes + zstd-1 of already prepared bytes (a raw buffer, or an XOR from :func:`xor_bytes`).
    ``encode_full(raw)`` == ``encode_planes(raw)``; ``encode_xor(raw, p)`` == ``encode_planes(xor_bytes(raw, p))``."""
    return _compress_planes(_as_bytes_array(u8, itemsize, "raw"), itemsize)


# --------------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ChunkBytes:
    """What an encoder sees of one chunk: its raw bytes and the same span of its reference (None for a base).
    The XOR and the changed rows are computed once per chunk and shared by every codec that uses them."""

    raw: np.ndarray
    ref: np.ndarray | None
    itemsize: int
    row_bytes: int | None = None

    @cached_property
    def xor(self) -> np.ndarray:
        return xor_bytes(self.raw, self.ref, self.itemsize)

    @cached_property
    def changed_rows(self) -> np.ndarray:
        """Indices of the rows (``row_bytes`` each) that differ from the reference."""
        return changed_rows(self.xor, self.row_bytes)


Encoder = Callable[[ChunkBytes], bytes]
Decoder = Callable[[Buffer, "np.ndarray | None", int, "int | None", "np.ndarray | None"], np.ndarray]
"""``(payload, reference raw bytes or None, itemsize, row_bytes or None, out)`` -> the flat raw bytes."""


@dataclass(frozen=True)
class CodecSpec:
    """One registered chunk codec (see :func:`register_codec` for what each field means to the store)."""

    name: str
    encode: Encoder | None
    decode: Decoder
    needs_ref: bool
    dense: bool
    row_bytes: bool


_CODECS: dict[str, CodecSpec] = {}
_BUILTIN: frozenset[str] = frozenset()  # set below, once the built-in codecs are registered


def register_codec(
    name: str, *, encode: Encoder | None, decode: Decoder, needs_ref: bool, dense: bool = False,
    row_bytes: bool = False, clobber: bool = False,
) -> CodecSpec:
    """Make ``name`` a codec the store can choose, manifests can name and restore can decode.

    ``encode`` returns a chunk's payload (None: the codec stores no object, as "same", whose ``chunk`` is the
    reference's object, read with ``decode``). ``needs_ref``: the payload decodes against the reference's raw
    bytes, so the entry records ``ref_version`` and ``ref_chunk``. ``dense``: every changed chunk tries it and
    keeps the smallest payload (a tie goes to the codec registered first: "full", which needs no reference).
    ``row_bytes``: tried first on whole-row chunks where few rows changed (chunks.py says how few), and the
    entry records the row size. A registered name is refused unless ``clobber`` (a built-in one always is).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a codec name must be a non-empty str, got {name!r}")
    if name in _CODECS and (not clobber or name in _BUILTIN):
        hint = "built-in codecs define existing stores' format" if name in _BUILTIN else "pass clobber=True"
        raise ValueError(f"codec {name!r} is already registered ({hint})")
    if encode is None and (needs_ref or dense or row_bytes):
        raise ValueError(f"codec {name!r} stores no payload, so it cannot need a reference or be chosen by size")
    spec = _CODECS[name] = CodecSpec(name, encode, decode, needs_ref, dense, row_bytes)
    return spec


def unregister_codec(name: str) -> None:
    """Forget a codec registered by a plugin or a test; manifests naming it no longer parse."""
    if get_codec(name).name in _BUILTIN:
        raise ValueError(f"codec {name!r} is built in: existing stores name it")
    del _CODECS[name]


def get_codec(name: str) -> CodecSpec:
    """The codec a manifest names; an unknown name (a newer writer's codec, or a typo) says which are known."""
    try:
        return _CODECS[name]
    except KeyError:
        known = ", ".join(_CODECS)
        raise ValueError(f"unknown chunk codec {name!r}; known codecs: {known} (a plugin's codec must be "
                         "registered, with register_codec, before reading a store that uses it)") from None


def available_codecs() -> tuple[CodecSpec, ...]:
    """Every registered codec, in registration order (the order dense codecs break ties in)."""
    return tuple(_CODECS.values())


def _decode_full(payload: Buffer, ref: None, itemsize: int, row_bytes: None, out: np.ndarray | None) -> np.ndarray:
    """A "full" object (also what a "same" chunk names) decodes on its own: no reference, no rows."""
    return decode_full(payload, itemsize, out=out)


# Registration order is the dense codecs' tie order: "full" (no reference) first, then "xor" before "diff", as
# stores have always chosen. It is also the order of Manifest.codec_counts.
register_codec("full", encode=lambda c: encode_full(c.raw, c.itemsize), needs_ref=False, dense=True,
               decode=_decode_full)
register_codec("xor", encode=lambda c: encode_planes(c.xor, c.itemsize), needs_ref=True, dense=True,
               decode=lambda p, ref, itemsize, _, out: decode_xor(p, ref, itemsize, out=out))
register_codec("diff", encode=lambda c: encode_diff(c.raw, c.ref, c.itemsize), needs_ref=True, dense=True,
               decode=lambda p, ref, itemsize, _, out: decode_diff(p, ref, itemsize, out=out))
register_codec("rows", encode=lambda c: encode_rows(c.xor, c.itemsize, c.row_bytes, c.changed_rows), needs_ref=True,
               row_bytes=True, decode=lambda p, ref, itemsize, rb, out: decode_rows(p, ref, itemsize, rb, out=out))
register_codec("same", encode=None, decode=_decode_full, needs_ref=False)
_BUILTIN = frozenset(_CODECS)
