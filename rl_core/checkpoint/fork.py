"""Zero-copy forks: a new store whose first versions are committed versions of another store, sharing their objects.

A fork copies manifests, never objects: each borrowed version (manifest.py) is the source's manifest with new meta,
``uploaded: false`` on every chunk and ``borrowed`` naming the store that holds its objects and the pin that keeps
them there. Every later commit to the fork starts with a full base in the fork's own store (writer.py).

The protocol (gc.py's docstring holds the argument that a concurrent gc of the source never deletes what a fork
commits):

1. Check that the fork's store is empty and read each source version's manifest, verified against its commit
   marker (nothing is written yet).
2. For each version, create a pin in the store holding its objects (pins.py): the source itself, or, when the source
   version is itself borrowed, the store it borrows from, so a fork of a fork pins the objects where they are.
3. Then check that what protected those objects before the pin still exists: the source version's commit marker, or
   the pin of the borrowed source version. If a gc removed it first, the fork fails and commits nothing.
4. Commit each borrowed manifest in the fork's store as any version is committed (manifest created exclusively,
   then its commit marker holding the manifest's sha256), newest first: the fork's newest version is where it
   stands from its first marker on.

On any failure the fork removes what it wrote (markers, manifests, pins) and raises. The versions keep their
numbers: version v is the state after v iterations, in a fork as in its source.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError, VersionNotFoundError, _fmt_versions
from .manifest import BORROWED_SCHEMA_VERSION, Borrowed, Manifest, commit_marker, utc_now_iso
from .objects import StoreObjects
from .pins import create_pin, new_pin_id, pin_record
from .restore import VersionReader


@dataclass(frozen=True)
class _Source:
    """One version to borrow: its manifest and digest, the store holding its objects and what protects them there."""

    version: int
    manifest: Manifest
    digest: str
    home: StoreObjects
    protector: str


def fork_versions(source: StoreObjects, reader: VersionReader, url: str, target: StoreObjects, target_url: str,
                  versions: list[int], meta: Mapping[str, Any], lineage: Mapping[str, Any]) -> list[int]:
    """Borrow ``versions`` of the store ``source`` (``url``) into the empty store ``target`` (``target_url``).
    Each borrowed version's meta is the source's with ``meta`` over it and ``forked_from``: ``lineage`` plus the
    source version and its manifest's sha256. Returns the versions, now committed in ``target``."""
    committed = source.scan()[0]
    for v in versions:
        if v not in committed:
            raise VersionNotFoundError(url, v, sorted(committed))
    there, claimed = target.scan()
    if there or claimed:
        raise CheckpointError(f"checkpoint store {target_url} holds versions {_fmt_versions(sorted(there | claimed))}"
                              "; a fork starts a store of its own: choose another place for it")
    sources = [_source(source, reader, v) for v in versions]
    pins: list[tuple[StoreObjects, str]] = []
    written: list[str] = []
    try:
        for s in sources:  # steps 2 and 3
            pin_id = new_pin_id()
            create_pin(s.home, pin_id, pin_record(target, s.home, s.version, s.manifest))
            pins.append((s.home, pin_id))
            if s.home.exists_or_none(s.protector) is not True:
                raise CheckpointError(f"checkpoint store {url}: version {s.version} was deleted (by gc?) or cannot be "
                                      f"checked while it was being forked to {target_url}; nothing was forked. Fork a "
                                      "version the source's gc keeps")
        for s, (_, pin_id) in reversed(list(zip(sources, pins))):  # step 4, newest first
            borrowed = Borrowed(store=s.home.relative_to(target), pin=pin_id)
            forked_from = {**lineage, "version": s.version, "manifest_sha256": s.digest}
            data = _borrowed_manifest(s.manifest, borrowed, {**s.manifest.meta, **meta, "forked_from": forked_from})
            for path, content in ((target.manifest_path(s.version), data),
                                  (target.marker_path(s.version), commit_marker(data))):
                target.create_exclusive(path, content)
                written.append(path)
    except BaseException:
        for path in reversed(written):  # each marker before its manifest
            target.discard(path)
        for home, pin_id in pins:
            home.discard(home.pin_path(pin_id))
        raise
    return versions


def _source(source: StoreObjects, reader: VersionReader, version: int) -> _Source:
    manifest = reader.manifest(version, version)
    if manifest.borrowed is None:
        return _Source(version, manifest, reader.digest(version), source, source.marker_path(version))
    home = source.at(manifest.borrowed.store)
    return _Source(version, manifest, reader.digest(version), home, home.pin_path(manifest.borrowed.pin))


def _borrowed_manifest(manifest: Manifest, borrowed: Borrowed, meta: dict[str, Any]) -> bytes:
    """The fork's copy of ``manifest`` (validated like any manifest read back)."""
    data = manifest.model_dump()
    for entry in data["tensors"].values():
        for chunk in entry["chunks"]:
            chunk["uploaded"] = False
    data.update(schema_version=BORROWED_SCHEMA_VERSION, borrowed=borrowed.model_dump(), meta=meta,
                created=utc_now_iso())
    return Manifest.model_validate(data).to_json_bytes()
