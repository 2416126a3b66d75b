"""Reading committed versions back: manifests (cached: a committed manifest never changes) and every tensor's
bytes, each object checked against its sha256 on read and each decoded chunk against the manifest's hash. A fork's
borrowed version (manifest.py) reads its objects from the store that holds them."""
from __future__ import annotations

import base64
import binascii
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .chunks import raw_hash_matches, sha256_hex
from .codec import decode_full, get_codec
from .errors import (
    ChunkCorruptError,
    ChunkMissingError,
    ManifestCorruptError,
    RestoreError,
    VersionNotFoundError,
)
from .manifest import MARKER_DIGEST_KEY, ChunkEntry, Manifest, TensorEntry
from .objects import StoreObjects

logger = logging.getLogger("rl_core.checkpoint")

MANIFESTS_CACHED = 32
"""Parsed manifests a reader keeps (the most recently used): a writer that lives for a whole run reads or writes one
per commit, so an unbounded cache would grow with the run."""

JobRunner = Callable[[Callable[..., Any], list[Any], int], list[Any]]
"""Runs ``fn(*item)`` for each item (``nbytes`` of data in all), in order: the store's worker threads."""


class VersionReader:
    """Restores versions of one store; errors name the store's (redacted) URL, the version and what to do."""

    def __init__(self, objects: StoreObjects, url: str, run_jobs: JobRunner) -> None:
        self._objects = objects
        self._url = url
        self._run_jobs = run_jobs
        self._manifests: OrderedDict[int, Manifest] = OrderedDict()

    def remember(self, manifest: Manifest) -> None:
        """Cache a manifest this process committed."""
        self._cache(manifest)

    def forget(self, version: int) -> None:
        """Drop a deleted version's manifest."""
        self._manifests.pop(version, None)

    def is_cached(self, version: int) -> bool:
        return version in self._manifests

    def manifest(self, version: int, requested: int) -> Manifest:
        """Parse a committed version's manifest; ``requested`` is the version being restored, for errors."""
        cached = self._manifests.get(version)
        if cached is not None:
            self._manifests.move_to_end(version)
            return cached
        path = self._objects.manifest_path(version)

        def corrupt(detail: str) -> ManifestCorruptError:
            return ManifestCorruptError(url=self._url, version=requested, source_version=version, detail=detail)

        try:
            data = self._objects.read(path)
        except FileNotFoundError:
            raise corrupt(f"manifest {path} does not exist") from None
        self._check_against_marker(version, path, data, corrupt)
        try:
            manifest = Manifest.from_json_bytes(data)
        except ValueError as exc:
            raise corrupt(f"manifest {path} is not a valid schema 2, 3 or 4 manifest (or a fork's schema 5) "
                          f"({str(exc)[:300]})") from None
        if manifest.version != version:
            raise corrupt(f"manifest {path} says it is version {manifest.version}")
        self._cache(manifest)
        return manifest

    def _cache(self, manifest: Manifest) -> None:
        self._manifests[manifest.version] = manifest
        self._manifests.move_to_end(manifest.version)
        while len(self._manifests) > MANIFESTS_CACHED:
            self._manifests.popitem(last=False)

    def digest(self, version: int) -> str:
        """The sha256 of a committed version's manifest, as its commit marker records it (computed from the manifest
        for a marker written before markers held it): what a fork's lineage names."""
        marker = self._objects.read(self._objects.marker_path(version))
        if marker:
            return json.loads(marker)[MARKER_DIGEST_KEY]
        return sha256_hex(self._objects.read(self._objects.manifest_path(version)))

    def _check_against_marker(self, version: int, path: str, data: bytes,
                              corrupt: Callable[[str], ManifestCorruptError]) -> None:
        """A manifest edited in storage can stay a valid manifest (another dtype, shape or name, other meta) and
        would then restore the verified chunk bytes as something else; the commit marker records the manifest's
        sha256, so any change is caught. An empty marker was written before markers held it: nothing to check."""
        marker_path = self._objects.marker_path(version)
        try:
            marker = self._objects.read(marker_path)
        except FileNotFoundError:
            raise corrupt(f"commit marker {marker_path} is gone (deleted while reading?)") from None
        if not marker:
            return
        try:
            recorded = json.loads(marker)[MARKER_DIGEST_KEY]
        except (ValueError, KeyError, TypeError):
            raise corrupt(f"commit marker {marker_path} is damaged ({marker[:80]!r})") from None
        if recorded != sha256_hex(data):
            raise corrupt(f"manifest {path} is not the one committed: its sha256 differs from the one its commit "
                          "marker recorded (edited or damaged in storage)")

    def restore(self, version: int) -> tuple[Manifest, dict[str, np.ndarray]]:
        """Verified raw bytes (read-only flat uint8) of every tensor of ``version``, chunks decoded on the
        worker threads; the first failing chunk in manifest order is raised."""
        manifest = self.manifest(version, version)
        home = self._objects if manifest.borrowed is None else self._objects.at(manifest.borrowed.store)
        raws = {name: np.empty(e.nbytes, dtype=np.uint8) for name, e in manifest.tensors.items()}
        jobs = [
            (version, name, e, c, raws[name][c.offset : c.offset + c.nbytes], manifest.embedded, home)
            for name, e in manifest.tensors.items()
            for c in e.chunks
        ]
        self._run_jobs(self._restore_chunk, jobs, sum(e.nbytes for e in manifest.tensors.values()))
        for raw in raws.values():
            raw.flags.writeable = False
        return manifest, raws

    def restore_newest(self, committed: list[int]) -> tuple[Manifest, dict[str, np.ndarray]]:
        """Newest version that verifies; each failing newer one is logged as a warning."""
        errors: list[RestoreError] = []
        for i in reversed(range(len(committed))):
            try:
                return self.restore(committed[i])
            except RestoreError as exc:
                errors.append(exc)
                target = f"version {committed[i - 1]}" if i else "nothing: no older version exists"
                logger.warning("%s Falling back to %s.", exc, target)
        if not errors:
            raise VersionNotFoundError(self._url, None, [])
        raise errors[0].with_fallback(None)

    def newest_loadable_before(self, version: int, committed: Iterable[int], exc: RestoreError) -> int | None:
        """Newest older version that restores, for error messages. Versions that need the bad object are
        skipped without decoding anything."""
        for older in sorted((v for v in committed if v < version), reverse=True):
            try:
                if exc.chunk is not None and exc.chunk in self.manifest(older, older).objects():
                    continue
                self.restore(older)
            except RestoreError:
                continue
            return older
        return None

    def _restore_chunk(self, requested: int, name: str, entry: TensorEntry, c: ChunkEntry, out: np.ndarray,
                       embedded: dict[str, str], home: StoreObjects) -> None:
        """Decode one chunk into ``out``: object hash(es) checked on read, decoded bytes against raw_xxh3.
        ``embedded``: the version's embedded objects (see manifest.py), read instead of storage; ``home``: the store
        holding its stored objects (this one, or for a borrowed version the one it borrows from)."""
        codec = get_codec(c.codec)
        own_version = requested if codec.encode is not None else c.ref_version  # "same" names the ref's object

        def read(version: int | None, chunk: str) -> bytes:
            return self._read_chunk(requested, name, version, chunk, embedded, home)

        payload = read(own_version, c.chunk)

        def corrupt(detail: str) -> ChunkCorruptError:
            return ChunkCorruptError(
                url=self._url, version=requested, tensor=name, chunk=c.chunk, source_version=own_version, detail=detail
            )

        itemsize = np.dtype(entry.dtype).itemsize
        try:
            ref = None
            if codec.needs_ref:  # a reference object is always a "full" one (see manifest.py)
                ref = decode_full(read(c.ref_version, c.ref_chunk), itemsize)
            for link in c.via:  # a chained chunk: each link's delta applies to the bytes decoded so far
                link_payload = read(link.version, link.chunk)
                try:
                    ref = get_codec(link.codec).decode(link_payload, ref, itemsize, link.row_bytes, None)
                except ValueError as exc:
                    raise ChunkCorruptError(url=self._url, version=requested, tensor=name, chunk=link.chunk,
                                            source_version=link.version,
                                            detail=f"chain link does not decode ({exc})") from None
            codec.decode(payload, ref, itemsize, c.row_bytes, out)
        except ValueError as exc:
            raise corrupt(f"payload does not decode ({exc})") from None
        if not raw_hash_matches(c, out):
            raise corrupt(f"decoded bytes at offset {c.offset} do not match the manifest's hash of them")

    def _read_chunk(self, requested: int, name: str, version: int | None, chunk: str,
                    embedded: dict[str, str], home: StoreObjects) -> bytes:
        fields: dict[str, Any] = dict(
            url=self._url, version=requested, tensor=name, chunk=chunk, source_version=version
        )
        if chunk in embedded:
            where = f"the object embedded in version {requested}'s manifest"
            try:
                data = base64.b64decode(embedded[chunk], validate=True)
            except binascii.Error as exc:
                raise ChunkCorruptError(detail=f"{where} is not base64 ({exc})", **fields) from None
        else:
            path = home.chunk_path(chunk)
            where = f"object {path}"
            try:
                data = home.read(path)
            except FileNotFoundError:
                raise ChunkMissingError(detail=f"{where} does not exist", **fields) from None
        actual = sha256_hex(data)
        if actual != chunk:
            raise ChunkCorruptError(detail=f"{where} hashes to {actual}", **fields)
        return data
