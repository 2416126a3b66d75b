"""Garbage collection of a checkpoint store: versions outside a retention policy, then unreferenced objects.

Safe while a writer commits. Order of work: (a) list chunk objects with their modification times; (b) list versions
and choose those outside the policy, never one that a retained version references (its base); (c) delete each such
version, marker first (it disappears atomically for readers), then manifest; (d) list every manifest again,
committed *and* claimed (in-flight), and collect the objects they reference; (e) delete an object from (a) only if
it is referenced by none of them AND its modification time, re-read just before deleting, is older than ``grace_s``
(default 1 h). Claims (manifests without a marker) are deleted once older than ``claim_grace_s`` (1 h). Why this is
safe: an object uploaded by an in-flight commit is either newer than listing (a) or younger than the grace period,
until its manifest claim exists, after which (d) sees it. An object the writer reuses without uploading belongs to a
version it checks in step 4 (writer.py) after its claim: if gc removed that version's marker before the check, the
commit fails; if after, the claim already existed for listing (d). The remaining window is a writer re-uploading an
*orphaned* object between gc's re-read of its mtime and the delete (milliseconds, and only for objects no committed
version references); a claim left by a crashed writer is deleted once older than ``grace_s`` (a sole writer, see
writer.py, withdraws it at its next commit).

Forks (fork.py, pins.py). (b) also keeps every version a fork pins, and (d) reads the pins *after* the manifests and
keeps every object a pin lists. A fork borrowing version v creates its pin, then checks that v's protector still
exists (v's commit marker; or, when v is itself a borrowed version of another fork, that fork's pin), and only then
commits its copy of v's manifest; when the check fails it removes its pin and commits nothing. Why no object a fork
commits is deleted: if the check came after gc removed v's marker, the fork fails. Otherwise the pin existed before
the check, the check came before the marker's removal and that before the manifest's: a gc whose (d) read v's
manifest keeps v's objects through it, and a gc that read the manifests after the removal reads the pins later
still, so finds the pin. With a pin as the protector the argument is the same with its removal in place of the
marker's; and since a pin created before another's removal could be missing from a listing taken before that
removal, pins are listed again whenever one vanishes between the listing and its read (pins.py). A fork's own gc
removes the pin of a borrowed version after deleting that version's marker and manifest: the fork's writer never
builds on a borrowed version's objects (writer.py), so nothing of the fork reads them afterwards.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .errors import ManifestCorruptError, RestoreError
from .manifest import Borrowed, Manifest
from .objects import StoreObjects, mtime
from .pins import claimed_by_fork, read_pins, release_pin
from .restore import VersionReader

logger = logging.getLogger("rl_core.checkpoint")


def collect_garbage(
    objects: StoreObjects,
    reader: VersionReader,
    url: str,
    *,
    keep_last: int,
    keep_every: int | None,
    grace_s: float,
    claim_grace_s: float,
    dry_run: bool,
    forget_version: Callable[[int], None],
    forget_object: Callable[[str], None],
) -> dict[str, Any]:
    """What ``CheckpointStore.gc`` documents. ``forget_version`` / ``forget_object`` are called for each deleted
    version and object, so the store drops what it remembered of them."""
    chunks = objects.list_chunks()  # (a) before anything else: later uploads are not candidates
    committed, claimed = objects.scan()
    ordered = sorted(committed)
    pinned = {p.version for p in read_pins(objects, url, claim_grace_s).values()} & committed
    keep = set(ordered[-keep_last:]) | pinned
    if keep_every:
        keep |= {v for v in ordered if v % keep_every == 0}
    needed = set(keep)
    for v in sorted(keep):  # (b) a kept version's base (and late-tensor versions) stay
        try:
            manifest = reader.manifest(v, v)
        except RestoreError as exc:
            logger.warning("gc: %s; keeping it, and keeping everything it may reference", exc)
            needed |= {u for u in committed if u < v}
            continue
        if manifest.borrowed is None:  # a borrowed version's references are numbers of the store it borrows from
            needed |= manifest.ref_versions() & committed
    doomed = sorted(set(ordered) - needed)
    borrowed = _borrowed(reader, doomed)
    now = time.time()
    stale_claims = []
    for v in sorted(claimed - committed):
        info = objects.info_or_none(objects.manifest_path(v))
        t = None if info is None else mtime(info)
        if t is not None and now - t > claim_grace_s:
            stale_claims.append(v)
    if not dry_run:  # (c) marker first: the version vanishes for readers in one step
        for v in doomed:
            objects.remove(objects.marker_path(v))
            objects.discard(objects.manifest_path(v))
            forget_version(v)
        for b in borrowed:  # nothing of this fork reads them any more: the store they came from may collect them
            release_pin(objects, b)
        for v in stale_claims:
            objects.discard(objects.manifest_path(v))
    referenced = _referenced_objects(objects, url, exclude=set(doomed) if dry_run else set())  # (d)
    pins = read_pins(objects, url, claim_grace_s)  # after the manifests: see the module docstring
    for pin in pins.values():
        referenced.update(pin.objects)
    deleted, freed, young = [], 0, 0
    for sha, (path, info) in sorted(chunks.items()):
        if sha in referenced:
            continue
        fresh = objects.info_or_none(path) if not dry_run else info  # (e) re-read just before deleting
        if fresh is None:
            continue
        t = mtime(fresh)
        if grace_s > 0 and (t is None or time.time() - t <= grace_s):
            young += 1
            continue
        if not dry_run:
            objects.discard(path)
            forget_object(sha)
        deleted.append(sha)
        freed += int(fresh.get("size") or 0)
    return {
        "kept_versions": sorted(needed),
        "deleted_versions": doomed,
        "deleted_claims": stale_claims,
        "deleted_chunks": len(deleted),
        "freed_bytes": freed,
        "young_unreferenced_chunks": young,
        "pinned_versions": sorted(pinned),
        "released_pins": [b.pin for b in borrowed] if not dry_run else [],
        "unclaimed_pins": sorted(i for i, p in pins.items() if not claimed_by_fork(objects, i, p)),
        "dry_run": dry_run,
    }


def _borrowed(reader: VersionReader, doomed: list[int]) -> list[Borrowed]:
    """Where the doomed versions that a fork borrowed keep their objects. A fork's borrowed versions are its oldest
    (it is made in an empty store), so reading stops at the first doomed version that is not one."""
    found = []
    for v in doomed:
        try:
            manifest = reader.manifest(v, v)
        except RestoreError:  # unreadable: if it was borrowed its pin stays, which only keeps objects
            break
        if manifest.borrowed is None:
            break
        found.append(manifest.borrowed)
    return found


def _referenced_objects(objects: StoreObjects, url: str, exclude: set[int]) -> set[str]:
    """Objects referenced by any manifest present now, committed or claimed (in flight). A claim that does
    not parse (still being written, or half written by a crash) protects nothing, but its objects are
    young and protected by the grace period."""
    committed, claimed = objects.scan()
    refs: set[str] = set()
    for v in sorted((committed | claimed) - exclude):
        try:
            refs |= Manifest.from_json_bytes(objects.read_fresh(objects.manifest_path(v))).objects()
        except FileNotFoundError:
            continue
        except ValueError:
            if v in committed:
                raise ManifestCorruptError(
                    url=url, version=v, detail="gc cannot tell what it references; nothing deleted"
                ) from None
    return refs
