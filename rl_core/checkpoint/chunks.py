"""How a version's tensors become chunks, and how one chunk is encoded (see store.py for the layout).

A tensor's raw bytes are cut into spans of whole rows (or elements); each span is encoded on its own as the
smallest lossless codec against the same span of the base version: "same" when unchanged, else the smallest
of the codecs in codec.py's registry (the dense ones, "full", "xor", "diff", and the sparse-row one, "rows";
manifest.py says what each stores). Choosing costs little: big chunks compress samples of each dense codec
and encode only the winner, and row codecs are only tried when a sample of rows says few changed.

Sparse-row chunks may be chained instead: under sparse updates each version changes a few rows, and a delta
against the base stores every row changed since the base, so it grows with each version of a cycle (bench/
checkpoint.py's embedding: 1%, 2%, ... 7% of the table). When at most ``_CHAIN_GAIN`` of those rows changed since
the parent version, the chunk is stored as the rows changed since the parent, chained to the parent's delta
(manifest.py's ``via``): each version then costs about what it changed. Dense chunks are never chained: Adam moves
every element at every step, a delta against the parent costs about what one against the base does (measured on
the 25M transformer), and a chain would only add objects to read. What the next commit needs to chain a chunk is
the rows this version changed since the base and their XOR (:class:`RowsSinceBase`), a fraction of the chunk.
Pure functions of numpy arrays: no storage, no threads (the store runs them on its worker threads).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from .codec import ChunkBytes, CodecSpec, available_codecs, diff_bytes, encode_picked_rows, encode_planes, get_codec
from .manifest import ChainLink, ChunkEntry, TensorEntry

#: a 2-D chunk whose changed rows are at most this fraction of its rows is also tried as "rows" ...
_ROWS_TRY_FRACTION = 0.25
#: ... and at most this fraction takes "rows" without trying the dense codecs at all.
_ROWS_TAKE_FRACTION = 0.05
#: whether to look for changed rows at all is decided on this many evenly spaced rows.
_SAMPLE_ROWS = 64
#: chunks of at least this size choose between the dense codecs by compressing samples (slices of
#: ``_SAMPLE_SLICE_BYTES``), then encode only the winner; smaller chunks encode each and keep the smallest.
_SAMPLE_ABOVE = 128 << 10
_SAMPLE_SLICES, _SAMPLE_SLICE_BYTES = 8, 4 << 10
#: a row chunk is chained to its parent when at most this fraction of the rows it changed since the base changed
#: since the parent (the delta at least halves; less would buy too little for one more object to read) ...
_CHAIN_GAIN = 0.5
#: ... and its chain stays at most this long (each link is one more object a restore reads).
_MAX_CHAIN_LINKS = 15


def sha256_hex(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def raw_hash_fields(raw: np.ndarray) -> dict[str, str]:
    """The manifest field that lets a restore check its decoded bytes (see manifest.py for why XXH3)."""
    return {"raw_xxh3": xxhash.xxh3_128_hexdigest(raw)}


def raw_hash_matches(chunk: ChunkEntry, raw: np.ndarray) -> bool:
    if chunk.raw_xxh3 is not None:
        return xxhash.xxh3_128_hexdigest(raw) == chunk.raw_xxh3
    return sha256_hex(raw) == chunk.raw_sha256  # schema 2


def raw_view(arr: np.ndarray) -> np.ndarray:
    """Flat uint8 view of a C-contiguous array's bytes (works for 0-d and empty arrays)."""
    return arr.reshape(-1).view(np.uint8)


def _torch_to_numpy(name: str, value: Any) -> tuple[np.ndarray, str | None]:
    """A CPU numpy view/copy of a torch tensor; bfloat16 (no numpy dtype) as its uint16 bit patterns."""
    import torch

    t = value.detach()
    if t.dtype == torch.bfloat16:
        return t.cpu().contiguous().view(torch.int16).numpy().view(np.uint16), "bfloat16"
    try:
        return t.cpu().contiguous().numpy(), None
    except TypeError as exc:
        raise TypeError(f"tensor {name!r}: torch dtype {t.dtype} has no numpy equivalent ({exc})") from None


def prepare_tensors(
    tensors: Mapping[str, Any], logical_dtypes: Mapping[str, str] | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Validate the caller's arrays and make them C-contiguous (no copy when they already are). Commit reads
    them synchronously and copies what it keeps, so the caller may change them once commit() returns.
    torch tensors are accepted (bfloat16 is stored as its uint16 bit patterns with logical dtype "bfloat16")."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> numpy array, got {type(tensors).__name__}")
    logical = dict(logical_dtypes or {})
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r} ({type(name).__name__})")
        if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
            value, log = _torch_to_numpy(name, value)
            if log:
                logical[name] = log
        if not isinstance(value, np.ndarray):
            raise TypeError(
                f"tensor {name!r}: expected a numpy.ndarray or torch.Tensor, got {type(value).__name__}; convert "
                "with t.detach().cpu().numpy() (bfloat16: pass the torch tensor, or t.view(torch.int16))"
            )
        dt = value.dtype
        if dt.hasobject or dt.fields is not None or dt.itemsize == 0 or np.dtype(dt.str) != dt:
            raise TypeError(
                f"tensor {name!r}: dtype {dt} is not a fixed-size plain numpy dtype; store structured arrays "
                "field by field and object arrays not at all"
            )
        out[name] = value if value.flags.c_contiguous else np.array(value, order="C")  # (0-d stays 0-d)
    unknown = set(logical) - set(out)
    if unknown:
        raise ValueError(f"logical_dtypes names tensors that are not given: {sorted(unknown)}")
    return out, logical


def normalize_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Return meta exactly as load() will hand it back (JSON round trip: tuples become lists, ...), failing
    now rather than after chunks were written."""
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        return json.loads(json.dumps(dict(meta)))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"meta must be JSON-serializable ({exc}); convert numpy scalars with .item() and arrays to tensors"
        ) from exc


def to_array(entry: TensorEntry, raw: np.ndarray) -> np.ndarray:
    """A fresh array that owns its memory, holding ``raw`` with the entry's dtype and shape."""
    arr = np.empty(entry.shape, dtype=np.dtype(entry.dtype))
    raw_view(arr)[...] = raw
    return arr


def tensor_row_bytes(dtype: np.dtype, shape: list[int] | tuple[int, ...]) -> int | None:
    """Bytes of one row of a 2-D+ tensor (None for 0-d and 1-D tensors)."""
    if len(shape) < 2:
        return None
    return math.prod(shape[1:]) * dtype.itemsize or None


def chunk_spans(nbytes: int, itemsize: int, row: int | None, chunk_bytes: int) -> list[tuple[int, int]]:
    """(offset, size) of each chunk: ``chunk_bytes`` rounded down to whole rows (whole elements for 1-D, or
    when one row is larger than a chunk), at least one row/element."""
    if nbytes == 0:
        return []
    unit = row if row is not None and row <= chunk_bytes else itemsize
    step = max(unit, chunk_bytes // unit * unit)
    return [(o, min(step, nbytes - o)) for o in range(0, nbytes, step)]


def _sample_starts(nbytes: int, itemsize: int) -> np.ndarray:
    """Byte offsets of ``_SAMPLE_SLICES`` evenly spaced, element-aligned slices of a buffer."""
    n, width = nbytes // itemsize, _SAMPLE_SLICE_BYTES // itemsize
    return np.linspace(0, n - width, _SAMPLE_SLICES).astype(np.int64) * itemsize


def _smallest(codecs: list[CodecSpec], chunk: ChunkBytes) -> tuple[CodecSpec, bytes]:
    """(codec, payload) of the codec whose payload is smallest; on a tie the one registered first."""
    return min(((c, c.encode(chunk)) for c in codecs), key=lambda encoded: len(encoded[1]))


def _choose_dense(chunk: ChunkBytes) -> tuple[CodecSpec, bytes]:
    """(codec, payload) of the smallest dense codec for a changed chunk. Big chunks decide on evenly spaced
    samples and encode only the winner, so choosing costs a fraction of one more encode."""
    dense = [c for c in available_codecs() if c.dense]
    raw, itemsize = chunk.raw, chunk.itemsize
    if raw.size < _SAMPLE_ABOVE:
        return _smallest(dense, chunk)
    starts = _sample_starts(raw.size, itemsize)
    width = _SAMPLE_SLICE_BYTES // itemsize * itemsize
    sample = ChunkBytes(
        np.concatenate([raw[o : o + width] for o in starts]),
        np.concatenate([chunk.ref[o : o + width] for o in starts]),
        itemsize,
    )
    codec = min(dense, key=lambda c: len(c.encode(sample)))
    return codec, codec.encode(chunk)


def probe(raw: np.ndarray, itemsize: int) -> np.ndarray | None:
    """A copy of one element-aligned ``_SAMPLE_SLICE_BYTES`` slice from the middle of a chunk (None for
    smaller chunks). The writer keeps the probes of the version it last committed, so that the next commit can
    estimate what a delta right after a new base would cost (see ``writer.VersionWriter._rebase_due``)."""
    width = _SAMPLE_SLICE_BYTES // itemsize * itemsize
    if raw.size < max(width, itemsize):
        return None
    start = (raw.size - width) // 2 // itemsize * itemsize
    return raw[start : start + width].copy()


def delta_cost(new: np.ndarray, old: np.ndarray, itemsize: int) -> int:
    """Encoded size of the cheaper of "full" and "diff" for two probes: the unit of the rebase estimate."""
    return min(len(encode_planes(new, itemsize)), len(encode_planes(diff_bytes(new, old, itemsize), itemsize)))


def _few_rows_may_differ(raw: np.ndarray, ref_raw: np.ndarray, row: int) -> bool:
    """Whether trying "rows" is worth a full pass: False when most of ``_SAMPLE_ROWS`` evenly spaced rows
    differ (a dense update, e.g. Adam state, where "rows" cannot win)."""
    n_rows = raw.size // row
    picked = np.linspace(0, n_rows - 1, min(n_rows, _SAMPLE_ROWS)).astype(np.int64)
    differ = (raw.reshape(n_rows, row)[picked] != ref_raw.reshape(n_rows, row)[picked]).any(axis=1)
    return differ.mean() <= 2 * _ROWS_TRY_FRACTION


@dataclass(frozen=True)
class RowsSinceBase:
    """What the next commit needs to chain a sparse-row chunk to this version: the version, its entry for the
    chunk, and the rows where its bytes differ from the base's (ascending indices) with their XOR."""

    version: int
    entry: ChunkEntry
    rows: np.ndarray
    xor: np.ndarray


def _rows_against_parent(
    changed: np.ndarray, xor: np.ndarray, parent: RowsSinceBase
) -> tuple[np.ndarray, np.ndarray]:
    """The rows that differ from the parent, and their XOR with it, from both versions' rows since the base:
    XOR(raw, parent) = XOR(raw, base) ^ XOR(parent, base), nonzero only on rows either changed."""
    union = np.union1d(changed, parent.rows)
    xor_parent = np.zeros((union.size, xor.shape[1]), dtype=np.uint8)
    xor_parent[np.searchsorted(union, changed)] = xor
    xor_parent[np.searchsorted(union, parent.rows)] ^= parent.xor
    differ = xor_parent.any(axis=1)
    return union[differ], xor_parent[differ]


def _chained(
    hashed: dict[str, str], row: int, itemsize: int, changed: np.ndarray, xor: np.ndarray,
    parent: RowsSinceBase | None,
) -> tuple[dict[str, Any], bytes | None] | None:
    """The chunk as a delta against the parent, chained to the parent's delta (None when that does not pay, see
    ``_CHAIN_GAIN``, or the parent is no delta against the same base). Unchanged since the parent: the parent's
    own entry, which the store already holds (payload None)."""
    if parent is None or not get_codec(parent.entry.codec).needs_ref or len(parent.entry.via) >= _MAX_CHAIN_LINKS:
        return None
    rows, xor_parent = _rows_against_parent(changed, xor, parent)
    if rows.size == 0:
        return parent.entry.model_dump(exclude={"offset", "nbytes", "uploaded"}), None
    if rows.size > _CHAIN_GAIN * changed.size:
        return None
    payload = encode_picked_rows(rows, xor_parent, itemsize)
    link = ChainLink(version=parent.version, codec=parent.entry.codec, chunk=parent.entry.chunk,
                     encoded_bytes=parent.entry.encoded_bytes, row_bytes=parent.entry.row_bytes)
    return dict(
        codec="rows", **hashed, chunk=sha256_hex(payload), encoded_bytes=len(payload), row_bytes=row,
        ref_version=parent.entry.ref_version, ref_chunk=parent.entry.ref_chunk, via=[*parent.entry.via, link],
    ), payload


def encode_chunk(
    raw: np.ndarray, itemsize: int, row: int | None, ref: ChunkEntry | None, ref_raw: np.ndarray | None,
    ref_version: int | None, parent: RowsSinceBase | None = None,
) -> tuple[dict[str, Any], bytes | None, tuple[np.ndarray, np.ndarray] | None]:
    """Smallest lossless encoding of one chunk, chained to ``parent`` where that pays (see the module docstring).
    Returns (ChunkEntry fields minus offset/uploaded, payload or None when the object is already stored, and for a
    sparse-row chunk its rows since the base with their XOR, else None)."""
    hashed = raw_hash_fields(raw)
    if ref is None or ref_raw is None:
        payload = get_codec("full").encode(ChunkBytes(raw, None, itemsize))
        return dict(codec="full", **hashed, chunk=sha256_hex(payload), encoded_bytes=len(payload)), payload, None
    # a different hash proves a change without a compare pass; an equal one (or a schema-2 reference, which has
    # no XXH3) is confirmed byte for byte
    if ref.raw_xxh3 in (None, hashed["raw_xxh3"]) and np.array_equal(raw, ref_raw):
        return dict(
            codec="same", raw_xxh3=ref.raw_xxh3, raw_sha256=ref.raw_sha256, chunk=ref.chunk,
            encoded_bytes=ref.encoded_bytes,
            ref_version=ref_version,
        ), None, None
    chunk = ChunkBytes(raw, ref_raw, itemsize, row)
    encoded: tuple[CodecSpec, bytes] | None = None
    since_base: tuple[np.ndarray, np.ndarray] | None = None
    row_codecs = [c for c in available_codecs() if c.row_bytes]
    if row_codecs and row is not None and raw.size % row == 0 and _few_rows_may_differ(raw, ref_raw, row):
        changed, n_rows = chunk.changed_rows, raw.size // row
        if changed.size <= _ROWS_TRY_FRACTION * n_rows:
            since_base = changed, chunk.xor.reshape(n_rows, row)[changed]
            chained = _chained(hashed, row, itemsize, *since_base, parent)
            if chained is not None:
                return (*chained, since_base)
            encoded = _smallest(row_codecs, chunk)
            if changed.size > _ROWS_TAKE_FRACTION * n_rows:
                encoded = min(encoded, _choose_dense(chunk), key=lambda e: len(e[1]))
    codec, payload = encoded or _choose_dense(chunk)
    fields: dict[str, Any] = dict(codec=codec.name, **hashed, chunk=sha256_hex(payload), encoded_bytes=len(payload))
    if codec.needs_ref:
        fields.update(ref_version=ref_version, ref_chunk=ref.chunk)
    if codec.row_bytes:
        fields["row_bytes"] = row
    return fields, payload, since_base


@dataclass(frozen=True)
class BaseTensor:
    """A tensor the next delta is encoded against: its version, its entry there (all chunks "full") and its
    raw bytes (a private, read-only flat uint8 copy)."""

    version: int
    entry: TensorEntry
    raw: np.ndarray


@dataclass(frozen=True)
class EncodedVersion:
    """A version's chunks, encoded: the manifest entries, the payloads to upload (objects not already known), the
    payloads small enough to embed in the manifest instead (known or not: see manifest.py), its probes (by tensor
    and chunk offset), for a delta the estimated cost of a delta against the parent relative to the one against the
    base (None when unknown: no parent probes, or no changed dense chunk), and the rows each sparse-row chunk changed
    since the base with their XOR (by tensor and chunk offset: see RowsSinceBase)."""

    entries: dict[str, TensorEntry]
    payloads: dict[str, bytes]
    embedded: dict[str, bytes]
    probes: dict[tuple[str, int], np.ndarray]
    fresh_ratio: float | None
    since_base: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]


def encode_version(
    arrays: dict[str, np.ndarray],
    logical: dict[str, str],
    refs: dict[str, BaseTensor],
    parent_probes: dict[tuple[str, int], np.ndarray],
    parent_rows: dict[tuple[str, int], RowsSinceBase],
    chunk_bytes: int,
    known: Container[str],
    run_jobs: Callable[[Callable[..., Any], list[Any], int], list[Any]],
    embed_max: int = 0,
) -> EncodedVersion:
    """Encode every chunk of every tensor against ``refs`` (empty for a base), sparse-row chunks chained to the
    parent's where ``parent_rows`` allows and it pays; ``run_jobs(fn, items, nbytes)`` runs the chunk jobs (the
    store's worker threads). ``parent_probes``: the parent's probes, for the estimate of a fresh delta's cost.
    Payloads of at most ``embed_max`` bytes are returned to embed, not to upload."""
    jobs: list[tuple[Any, ...]] = []
    layout: dict[str, list[int]] = {}
    for name, arr in arrays.items():
        raw = raw_view(arr)
        row = tensor_row_bytes(arr.dtype, arr.shape)
        ref = refs.get(name)
        if ref is not None and (ref.entry.dtype, ref.entry.shape) != (arr.dtype.str, list(arr.shape)):
            ref = None
        if ref is not None:
            spans = [(c.offset, c.nbytes) for c in ref.entry.chunks]
        else:
            spans = chunk_spans(arr.nbytes, arr.itemsize, row, chunk_bytes)
        layout[name] = []
        for i, (off, n) in enumerate(spans):
            r = None if ref is None else ref.entry.chunks[i]
            rr = None if ref is None else ref.raw[off : off + n]
            row_ok = row if row is not None and off % row == 0 and n % row == 0 else None
            parent = parent_rows.get((name, off)) if ref is not None else None
            if parent is not None and parent.entry.ref_version != ref.version:
                parent = None
            layout[name].append(len(jobs))
            jobs.append((
                raw[off : off + n], arr.itemsize, row_ok, r, rr, None if ref is None else ref.version, off,
                parent_probes.get((name, off)), parent,
            ))

    def run(raw, itemsize, row, r, rr, ref_version, off, parent_probe, parent):
        fields, payload, since_base = encode_chunk(raw, itemsize, row, r, rr, ref_version, parent)
        now = probe(raw, itemsize)
        costs = None
        if rr is not None and parent_probe is not None and now is not None and get_codec(fields["codec"]).dense:
            costs = (delta_cost(now, probe(rr, itemsize), itemsize), delta_cost(now, parent_probe, itemsize))
        return off, int(raw.size), fields, payload, now, costs, since_base

    # Largest chunks first: the worker threads then end together instead of one encoding a big chunk it took last
    # while the others idle. Results go back to manifest order.
    largest_first = sorted(range(len(jobs)), key=lambda j: -jobs[j][0].size)
    results = [None] * len(jobs)
    for j, result in zip(largest_first, run_jobs(run, [jobs[j] for j in largest_first],
                                                 sum(job[0].size for job in jobs))):
        results[j] = result
    entries: dict[str, TensorEntry] = {}
    payloads: dict[str, bytes] = {}
    embedded: dict[str, bytes] = {}
    probes: dict[tuple[str, int], np.ndarray] = {}
    since: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    vs_base = vs_parent = 0
    for name, arr in arrays.items():
        chunks = []
        for j in layout[name]:
            off, n, fields, payload, now, costs, since_base = results[j]
            uploaded = payload is not None and fields["chunk"] not in known
            if payload is not None and len(payload) <= embed_max:
                embedded[fields["chunk"]] = payload
            elif uploaded:
                payloads[fields["chunk"]] = payload
            chunks.append(ChunkEntry(offset=off, nbytes=n, uploaded=uploaded, **fields))
            if now is not None:
                probes[(name, off)] = now
            if costs is not None:
                vs_base, vs_parent = vs_base + costs[0], vs_parent + costs[1]
            if since_base is not None:
                since[(name, off)] = since_base
        entries[name] = TensorEntry(
            dtype=arr.dtype.str, shape=list(arr.shape), nbytes=arr.nbytes, logical_dtype=logical.get(name),
            chunks=chunks,
        )
    return EncodedVersion(entries, payloads, embedded, probes, (vs_parent / vs_base if vs_base else None), since)
