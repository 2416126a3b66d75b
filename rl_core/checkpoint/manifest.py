"""The JSON manifest of one checkpoint version (schema 3, or 4 with chained chunks or embedded objects, 5 for a
fork's borrowed version; schema 2 still reads), and how it is (de)serialized.

A manifest is the whole description of a version: which tensors it holds, how each chunk of each tensor's
bytes was encoded and which content-addressed object holds it, plus free-form JSON metadata. Tensor payloads
are raw bytes; dtype and shape live here, so nothing ever needs pickle. Schema 1 manifests (one object per
tensor, deltas chained to the parent) are not readable by this version of the store.

A tensor's raw bytes are cut into chunks of ``chunk_bytes`` (rounded to whole rows for 2-D and higher
tensors, so sparse-row deltas see whole rows; small tensors are one chunk). Codecs per chunk (the built-in
entries of codec.py's registry, which says for any codec which reference fields and ``row_bytes`` it carries):

* ``"full"``: ``chunk`` holds the chunk's own bytes (byte planes + zstd-1); no reference.
* ``"diff"``: ``chunk`` holds the wrap-around difference raw - reference raw per unsigned word (byte planes +
  zstd-1; see codec.py).
* ``"xor"``: ``chunk`` holds XOR(raw, reference raw) (byte planes + zstd-1).
* ``"rows"``: ``chunk`` holds the indices and XOR'd bytes of the rows that differ from the reference.
* ``"same"``: the raw bytes equal the reference's; ``chunk`` *is* the reference's object (a "full" object),
  so the version stores nothing new for it.

The reference of a chunk is the same chunk of the same tensor in the version's *base* (the last full version;
a tensor that appeared after the base references the version where it was first stored in full): ``ref_chunk``
names the reference's object, always a "full" one, and ``ref_version`` says which version that object came from
(kept for GC and messages). A delta may instead be *chained* (schema 4): ``via`` lists the delta objects of the
versions between the base and this one, oldest first, each applied to the bytes the one before it decoded, and
the chunk's own payload applies to the last. The store chains only sparse-row chunks, whose deltas against the
base grow with every version (see chunks.py), so a restore reads at most two objects per chunk, or one more per
link of a chain.

Small objects are *embedded* (schema 4): ``embedded`` maps the sha256 of each object of at most a few KiB that the
version names (its own payloads and those of the objects it references) to its bytes in base64, and the reader takes
them from there instead of from storage. A policy's biases, normalizer statistics and Adam steps are many tiny
chunks, and writing each as a file of its own cost more than encoding the whole state (most of a quick flow state's
objects are under 4 KiB, and its commit took longer onto a local disk than into memory). Every manifest embeds every
embedded object it names, so a writer finds the bytes of an object it references in the manifest of the version the
reference names. Schema 4 is written only when a chunk is chained or an object embedded (:func:`schema_for`),
so other stores stay readable by schema-3 readers.

``raw_xxh3`` is the XXH3-128 of the chunk's decoded bytes, checked on every restore (schema 2 wrote ``raw_sha256``
instead; both verify the decoder, not an adversary, and XXH3 runs many times faster than sha256, which matters
because every byte of every version is hashed); ``chunk`` is the sha256 of the stored object's bytes, checked on
every read (it names the object, so it must resist collisions). ``uploaded`` says whether the commit that wrote this
manifest uploaded the object (False: an identical object was already referenced by a version the writer knew), which
is what :meth:`Manifest.encoded_bytes` counts as "added by this version".

A *borrowed* version (schema 5) is the first version of a fork (fork.py): a copy of another store's committed
manifest whose objects stay where they are. ``borrowed.store`` is the path from this store's root to the store that
holds them (relative, so a store moved as a whole keeps its forks readable), and ``borrowed.pin`` names the pin in
that store that keeps its gc from deleting them (gc.py). Its number, base, references and chains are the other
store's, unchanged: a version keeps its number across a fork (version v is the state after v iterations), and
every number it references is older than v, so none names a version of this store. Its chunks record
``uploaded: false``: the fork added no object. Schema 5 is written only for borrowed versions.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, field_validator, model_validator

from .codec import available_codecs, get_codec

__all__ = [
    "BORROWED_SCHEMA_VERSION", "EXTENDED_SCHEMA_VERSION", "SCHEMA_VERSION", "Borrowed", "ChainLink", "ChunkEntry",
    "Manifest", "TensorEntry", "schema_for", "utc_now_iso",
]

SCHEMA_VERSION = 3
EXTENDED_SCHEMA_VERSION = 4
BORROWED_SCHEMA_VERSION = 5
MARKER_DIGEST_KEY = "manifest_sha256"


def commit_marker(manifest_bytes: bytes) -> bytes:
    """The commit marker's content: the sha256 of the manifest's exact bytes, which the reader checks."""
    return json.dumps({MARKER_DIGEST_KEY: hashlib.sha256(manifest_bytes).hexdigest()}).encode()

_SHA256_HEX = r"^[0-9a-f]{64}$"
_XXH3_128_HEX = r"^[0-9a-f]{32}$"


def utc_now_iso() -> str:
    """Creation timestamps are UTC so that manifests written on different machines compare directly."""
    return datetime.now(timezone.utc).isoformat()


class ChainLink(BaseModel):
    """One delta object on a chained chunk's way from its base: what the reader applies to the bytes decoded so
    far (the base's, then each earlier link's) to get that version's bytes of the chunk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=0, description="the version that stored this delta (for messages; gc need not keep it)")
    codec: str = Field(description="a registered delta codec (one that needs a reference)")
    chunk: str = Field(pattern=_SHA256_HEX, description="sha256 of the stored object's bytes")
    encoded_bytes: int = Field(ge=0)
    row_bytes: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _a_delta(self) -> ChainLink:
        codec = get_codec(self.codec)
        if codec.encode is None or not codec.needs_ref:
            raise ValueError(f"a chain link is a delta object; codec {self.codec!r} is not a delta codec")
        if codec.row_bytes != (self.row_bytes is not None):
            raise ValueError(f"a chain link records row_bytes exactly for row codecs (codec {self.codec!r})")
        return self


class ChunkEntry(BaseModel):
    """How one chunk (a byte range of one tensor) of one version is stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    offset: int = Field(ge=0, description="byte offset of this chunk in the tensor's raw bytes")
    nbytes: int = Field(ge=1)
    codec: str = Field(description="name of a registered codec (codec.py)")
    chunk: str = Field(pattern=_SHA256_HEX, description="sha256 of the stored object's bytes")
    raw_xxh3: str | None = Field(default=None, pattern=_XXH3_128_HEX, description="XXH3-128 of the decoded bytes")
    raw_sha256: str | None = Field(default=None, pattern=_SHA256_HEX, description="schema 2: sha256 of the same")
    encoded_bytes: int = Field(ge=0, description="size of the stored object")
    uploaded: bool = Field(description="whether this version's commit uploaded the object")
    ref_version: int | None = Field(default=None, ge=0)
    ref_chunk: str | None = Field(default=None, pattern=_SHA256_HEX)
    row_bytes: int | None = Field(default=None, ge=1, description="row size of a 'rows' chunk (a row codec's)")
    via: list[ChainLink] = Field(default_factory=list, description="schema 4: delta objects between the base and "
                                 "this chunk's reference, oldest first (empty: the reference is the base's object)")

    @field_validator("codec")
    @classmethod
    def _codec_is_registered(cls, value: str) -> str:
        """A codec this process cannot decode fails on parse, naming the codecs it knows."""
        get_codec(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChunkEntry:
        if (self.raw_xxh3 is None) == (self.raw_sha256 is None):
            raise ValueError(
                "a chunk records exactly one hash of its decoded bytes (raw_xxh3, or schema 2's raw_sha256)"
            )
        codec = get_codec(self.codec)
        if codec.encode is None:
            if self.ref_version is None or self.ref_chunk is not None or self.uploaded:
                raise ValueError(
                    f"codec {self.codec!r} needs a ref_version, no ref_chunk (chunk is the reference) and no upload"
                )
        elif codec.needs_ref and (self.ref_version is None or self.ref_chunk is None):
            raise ValueError(f"codec {self.codec!r} needs ref_version and ref_chunk")
        elif not codec.needs_ref and (self.ref_version is not None or self.ref_chunk is not None):
            raise ValueError(f"codec {self.codec!r} has no reference")
        if codec.row_bytes != (self.row_bytes is not None):
            rows = [c.name for c in available_codecs() if c.row_bytes]
            raise ValueError(f"row_bytes is set exactly for codecs {rows} (chunk codec {self.codec!r})")
        if self.row_bytes is not None and self.nbytes % self.row_bytes:
            raise ValueError(f"row_bytes {self.row_bytes} does not divide the chunk's {self.nbytes} bytes")
        if self.via and not codec.needs_ref:
            raise ValueError(f"only a delta chunk can be chained (codec {self.codec!r} has a chain)")
        for link in self.via:
            if link.row_bytes is not None and self.nbytes % link.row_bytes:
                raise ValueError(f"a chain link's row_bytes {link.row_bytes} does not divide the chunk's {self.nbytes}")
        links = [link.version for link in self.via]
        if links != sorted(set(links)) or (links and self.ref_version is not None and links[0] <= self.ref_version):
            raise ValueError(f"chain links must come from distinct versions after the reference's, oldest first "
                             f"(ref_version {self.ref_version}, links {links})")
        return self

    def objects(self) -> tuple[str, ...]:
        """Every object a restore of this chunk reads (stored, or embedded in the manifest)."""
        if self.ref_chunk is None:
            return (self.chunk,)
        return (self.chunk, self.ref_chunk, *(link.chunk for link in self.via))


class TensorEntry(BaseModel):
    """How one tensor of one version is stored: dtype, shape and its chunks in byte order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str = Field(description='numpy dtype string of the stored bytes, e.g. "<f4"')
    shape: list[StrictInt] = Field(description="strict: lax parsing would read true or \"7\" as a dimension, and an "
                                   "empty tensor's shape is covered by no chunk hash")
    nbytes: int = Field(ge=0)
    logical_dtype: str | None = Field(
        default=None, description='dtype the bytes mean when numpy has none, e.g. "bfloat16" stored as "<u2"'
    )
    chunks: list[ChunkEntry]

    @field_validator("dtype")
    @classmethod
    def _dtype_is_plain(cls, value: str) -> str:
        """Only dtypes whose string form round-trips exactly can be restored from the manifest."""
        try:
            dt = np.dtype(value)
        except TypeError as exc:
            raise ValueError(f"dtype {value!r} is not a numpy dtype string") from exc
        if dt.hasobject or dt.fields is not None or dt.itemsize == 0:
            raise ValueError(f"dtype {value!r} is not a fixed-size, non-structured numpy dtype")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TensorEntry:
        """Reject entries a restore could not follow, so a bad manifest fails on parse, not mid-restore."""
        if any(d < 0 for d in self.shape):
            raise ValueError(f"shape {self.shape} has a negative dimension")
        # numpy's own limits (at most 64 dimensions, sizes that fit), checked without allocating: np.empty of no
        # elements allocates nothing, and a non-empty tensor's size is its nbytes, which the restore allocates anyway
        try:
            np.empty(self.shape if math.prod(self.shape) == 0 else [0] * len(self.shape), dtype=self.dtype)
        except ValueError as exc:
            raise ValueError(f"shape {self.shape} is not one numpy can hold ({exc})") from None
        expected = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        if self.nbytes != expected:
            raise ValueError(f"nbytes {self.nbytes} != prod(shape {self.shape}) * itemsize ({expected})")
        offset = 0
        itemsize = np.dtype(self.dtype).itemsize
        for c in self.chunks:
            if c.offset != offset or c.nbytes % itemsize:
                raise ValueError("chunks must tile the tensor's bytes in order, in whole elements")
            offset += c.nbytes
        if offset != self.nbytes:
            raise ValueError(f"chunks cover {offset} bytes of {self.nbytes}")
        return self


def ref_versions_of(tensors: dict[str, TensorEntry]) -> set[int]:
    """The versions a version's tensor entries reference (see :meth:`Manifest.ref_versions`)."""
    return {c.ref_version for e in tensors.values() for c in e.chunks if c.ref_version is not None}


def _chained(tensors: dict[str, TensorEntry]) -> bool:
    return any(c.via for e in tensors.values() for c in e.chunks)


def schema_for(tensors: dict[str, TensorEntry], embedded: dict[str, str]) -> int:
    """The schema a version is written in: 4 only when it needs it (a chained chunk, an embedded object)."""
    return EXTENDED_SCHEMA_VERSION if embedded or _chained(tensors) else SCHEMA_VERSION


class Borrowed(BaseModel):
    """Where a borrowed version's objects are (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: str = Field(min_length=1, description="path from this store's root to the store holding the objects")
    pin: str = Field(pattern=r"^[0-9a-f]{32}$", description="the pin in that store that keeps them")


class Manifest(BaseModel):
    """One version: its lineage, its tensors and its metadata.

    ``parent`` is the version this one was built on (the version the writing store last committed or loaded),
    kept for lineage. ``base`` is the full version this one's deltas refer to (None: this version is itself a
    full base). ``depth`` counts versions since the base (0 = base).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[2, 3, 4, 5] = SCHEMA_VERSION
    version: int = Field(ge=0)
    parent: int | None = Field(default=None, ge=0)
    base: int | None = Field(default=None, ge=0)
    depth: int = Field(default=0, ge=0)
    chunk_bytes: int = Field(ge=1)
    created: str = Field(default_factory=utc_now_iso, description="ISO 8601 creation time, UTC")
    tensors: dict[str, TensorEntry]
    meta: dict[str, Any] = Field(default_factory=dict)
    embedded: dict[Annotated[str, StringConstraints(pattern=_SHA256_HEX)], str] = Field(
        default_factory=dict, description="schema 4: small objects' bytes, base64, by sha256")
    borrowed: Borrowed | None = Field(default=None, description="schema 5: a fork's version whose objects another "
                                      "store holds")

    @field_validator("created")
    @classmethod
    def _created_is_iso(cls, value: str) -> str:
        datetime.fromisoformat(value)
        return value

    @model_validator(mode="after")
    def _refs_point_back(self) -> Manifest:
        """References must point to older versions; anything else could make a restore cycle."""
        for what, v in (("parent", self.parent), ("base", self.base)):
            if v is not None and v >= self.version:
                raise ValueError(f"{what} {v} is not older than version {self.version}")
        if (self.base is None) != (self.depth == 0):
            raise ValueError("depth is 0 exactly for a full base (base None)")
        for name, entry in self.tensors.items():
            for c in entry.chunks:
                if c.ref_version is not None and c.ref_version >= self.version:
                    raise ValueError(f"tensor {name!r}: ref_version {c.ref_version} is not older than {self.version}")
                if c.via and (self.schema_version < EXTENDED_SCHEMA_VERSION or c.via[-1].version >= self.version):
                    raise ValueError(f"tensor {name!r}: a chained chunk needs schema {EXTENDED_SCHEMA_VERSION} and "
                                     f"links older than version {self.version}")
                if self.base is None and c.codec != "full":
                    raise ValueError(f"tensor {name!r}: a full base stores every chunk 'full', not {c.codec!r}")
        if self.embedded and self.schema_version < EXTENDED_SCHEMA_VERSION:
            raise ValueError(f"embedded objects need schema {EXTENDED_SCHEMA_VERSION}")
        if (self.borrowed is not None) != (self.schema_version == BORROWED_SCHEMA_VERSION):
            raise ValueError(f"schema {BORROWED_SCHEMA_VERSION} is exactly the schema of a borrowed version")
        return self

    def to_json_bytes(self) -> bytes:
        """Serialize with the stdlib json module so ``meta`` round-trips as Python wrote it (NaN included;
        pydantic's JSON mode would turn NaN into null)."""
        data = self.model_dump()
        for entry in data["tensors"].values():
            for chunk in entry["chunks"]:
                for unused in [k for k in ("raw_xxh3", "raw_sha256") if chunk[k] is None]:
                    del chunk[unused]  # one hash per chunk, named by its algorithm
                if not chunk["via"]:
                    del chunk["via"]  # a schema-3 chunk, byte for byte
        if not data["embedded"]:
            del data["embedded"]
        if data["borrowed"] is None:
            del data["borrowed"]  # a schema 3 or 4 manifest, byte for byte
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate; raises ValueError (pydantic's ValidationError included) on anything malformed."""
        return cls.model_validate(json.loads(data))

    def raw_bytes(self) -> int:
        return sum(e.nbytes for e in self.tensors.values())

    def encoded_bytes(self) -> int:
        """Bytes this version's commit added to storage (objects it uploaded, each counted once)."""
        seen: dict[str, int] = {}
        for e in self.tensors.values():
            for c in e.chunks:
                if c.uploaded:
                    seen[c.chunk] = c.encoded_bytes
        return sum(seen.values())

    def stored_bytes(self) -> int:
        """Bytes of the objects this version's chunks name, each once ("same" chunks name base objects; the
        ``ref_chunk`` objects of "diff"/"xor"/"rows" chunks and the objects of their chains are not counted: their
        sizes live in the manifests that first named them)."""
        sizes: dict[str, int] = {}
        for e in self.tensors.values():
            for c in e.chunks:
                sizes[c.chunk] = c.encoded_bytes
        return sum(sizes.values())

    def objects(self) -> set[str]:
        """Every object this version needs, stored or embedded."""
        return {o for e in self.tensors.values() for c in e.chunks for o in c.objects()}

    def stored_objects(self) -> set[str]:
        """The objects this version reads from storage (those it does not embed)."""
        return self.objects() - self.embedded.keys()

    def codec_counts(self) -> dict[str, int]:
        counts = dict.fromkeys((c.name for c in available_codecs()), 0)
        for e in self.tensors.values():
            for c in e.chunks:
                counts[c.codec] += 1
        return counts

    def ref_versions(self) -> set[int]:
        """Versions whose objects this version references (its base, and versions where late tensors began), which
        gc keeps with it. Not its chains' link versions: this manifest names their objects itself, and gc keeps every
        object a kept manifest names, so a kept chained version does not hold the dense deltas of the versions its
        chains pass through."""
        return ref_versions_of(self.tensors)

    def chained(self) -> bool:
        """Whether any chunk is chained (the manifest is then schema 4)."""
        return _chained(self.tensors)
