"""The writing side of a CheckpointStore: what the next commit encodes against, and the commit protocol.

store.py's docstring says what a version is made of (gc.py's, how gc stays safe beside a writer); this module holds
the writer's state and runs the commit. The state is a cache of what storage holds, kept so that a commit need not
read it back: the base's tensors (what every delta is encoded against), the head (the version the next commit
follows), what the last commit measured (probes of its chunks, the rows its sparse-row chunks changed since the
base), and the objects known to be stored (those are not uploaded again). Whatever is missing is read back from
storage (``_prepare_reference``). Not thread-safe: the store calls it under its lock.

A fork's borrowed version (manifest.py) is a head but never a base: the commit after it is a full base in this
store, and its objects are not known as stored here. So a fork's own versions name only objects of its own store,
and once gc has collected its borrowed versions nothing of the fork needs the store it borrowed from.

Commit protocol (why each step is there):

1. Encode every chunk (nothing is written yet, so an encoding error leaves no trace).
2. Upload every chunk object the writer does not know to be referenced by a committed version (an existing
   object of that name is overwritten, not trusted: see gc.py). Each object appears whole or not at all
   (object stores publish on upload completion; local files are written under a temp name and renamed).
3. Claim the version by creating its manifest *exclusively*. A loser of a race learns it lost before it writes
   anything a reader could see and gets :class:`VersionConflictError`.
4. Check that the versions whose objects this commit reuses without uploading (its base, normally) still have
   their commit markers; a concurrent ``gc`` may have deleted them. If one is gone the claim is withdrawn and
   the commit fails with :class:`CheckpointError` (the next commit writes a new full base).
5. Create the commit marker exclusively. Readers list markers only, so the version becomes visible in one step.

A claim whose writer died before step 5 is invisible to readers; writers skip its number. A writer that is the
store's only one (``sole_writer``: it holds the run's lease, say) instead withdraws such claims newer than the
newest committed version: no live writer can own them, and skipping their numbers would break a caller that
expects version v+1 to follow v (a run whose iteration i commits version i+1).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .chunks import BaseTensor, RowsSinceBase, encode_version, raw_view
from .errors import CheckpointError, RestoreError, StorageError, VersionConflictError
from .manifest import Manifest, TensorEntry, commit_marker, ref_versions_of, schema_for
from .objects import StoreObjects
from .restore import VersionReader

logger = logging.getLogger("rl_core.checkpoint")

JobRunner = Callable[[Callable[..., Any], list[Any], int], list[Any]]


@dataclass(frozen=True)
class _Probes:
    """Probes (see chunks.probe) of the version this writer last committed, by (tensor, chunk offset), that
    commit's estimate of a fresh delta's cost relative to its delta against the base, and what the next commit
    needs to chain that version's sparse-row chunks (see chunks.RowsSinceBase)."""

    version: int | None = None
    by_chunk: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    fresh_ratio: float | None = None
    rows_since_base: dict[tuple[str, int], RowsSinceBase] = field(default_factory=dict)


def _delta_bytes(manifest: Manifest) -> int:
    """Bytes of the objects a delta version stores itself (its non-"same" chunks, each object once)."""
    stored = {c.chunk: c.encoded_bytes for e in manifest.tensors.values() for c in e.chunks if c.codec != "same"}
    return sum(stored.values())


class VersionWriter:
    """The commits of one CheckpointStore (see the module docstring). ``run_jobs`` runs chunk jobs on the store's
    threads; ``storage_call(what, fn)`` runs a storage operation, turning a backend failure into a StorageError;
    ``storage_error(what, exc)`` makes one; ``versions()`` lists the committed versions; ``sole_writer``: see the
    module docstring."""

    def __init__(
        self, objects: StoreObjects, reader: VersionReader, url: str, *, run_jobs: JobRunner,
        storage_call: Callable[[str, Callable[[], Any]], Any],
        storage_error: Callable[[str, BaseException], StorageError], versions: Callable[[], list[int]],
        full_every: int, chunk_bytes: int, rebase_ratio: float, embed_bytes: int, sole_writer: bool = False,
    ) -> None:
        self._objects, self._reader, self._url, self._sole_writer = objects, reader, url, sole_writer
        self._map, self._call, self._error, self._versions = run_jobs, storage_call, storage_error, versions
        self._full_every, self._chunk_bytes = full_every, chunk_bytes
        self._rebase_ratio, self._embed_bytes = rebase_ratio, embed_bytes
        # the tensors deltas are encoded against, and the version the next commit builds on
        self._refs: dict[str, BaseTensor] | None = None
        self._base: Manifest | None = None
        self._head: Manifest | None = None
        self._pending_base: int | None = None
        self._probes = _Probes()  # of the version this writer last committed (see _rebase_due)
        # object sha -> a committed version referencing it, for objects this writer wrote or the store read and
        # verified: those are not uploaded again (anything else is, see _write_chunks)
        self._known: dict[str, int] = {}

    def commit(self, arrays: dict[str, np.ndarray], logical: dict[str, str], meta_json: dict[str, Any]) -> int:
        """Encode, upload and publish a new version of ``arrays`` (already validated); its number."""
        self._prepare_reference()
        head, refs = self._head, self._refs
        is_base = refs is None or head is None or self._rebase_due(head)
        depth = 0 if is_base else head.depth + 1
        use_refs = {} if is_base else refs
        parent = self._probes if head is not None and self._probes.version == head.version else _Probes()
        encoded = encode_version(arrays, logical, use_refs, parent.by_chunk, parent.rows_since_base,
                                 self._chunk_bytes, self._known, self._map, self._embed_bytes)
        entries = encoded.entries
        version = self._call("list versions", self._next_version)
        embedded = self._call("read manifests", lambda: self._embedded_table(entries, encoded.embedded))
        manifest = Manifest(
            schema_version=schema_for(entries, embedded),
            embedded=embedded,
            version=version,
            parent=None if head is None else head.version,
            base=None if is_base else self._base.version,
            depth=depth,
            chunk_bytes=self._chunk_bytes,
            tensors=entries,
            meta=meta_json,
        )
        # a version naming each stored object this commit names but does not upload (chain links included)
        reused = {self._known.get(sha) for sha in manifest.stored_objects() - encoded.payloads.keys()}
        reused = (reused - {None}) | manifest.ref_versions()
        self._call("upload chunks", lambda: self._write_chunks(encoded.payloads))
        self._publish(manifest, reused)
        self._reader.remember(manifest)
        self._head = manifest
        chunk_entries = {(name, c.offset): c for name, e in entries.items() for c in e.chunks}
        self._probes = _Probes(version, encoded.probes, encoded.fresh_ratio, {
            key: RowsSinceBase(version, chunk_entries[key], rows, xor)
            for key, (rows, xor) in encoded.since_base.items()
        })
        if is_base and self._base is not None:
            # forget objects from before the previous base's cycle: a writer kept for a whole run then remembers
            # two cycles' objects, not the whole run's
            self._known = {sha: v for sha, v in self._known.items() if v >= self._base.version}
        for sha in manifest.objects():  # the newest version naming each: the one gc is likeliest to keep
            self._known[sha] = version
        if is_base:
            self._base = manifest
            copies = self._map(self._private_copy, [(arrays[name],) for name in entries],
                               sum(arrays[name].nbytes for name in entries))
            self._refs = {name: BaseTensor(version, entry, raw) for (name, entry), raw in zip(entries.items(), copies)}
        else:
            for name, entry in entries.items():  # tensors new since the base: later deltas refer to this version
                if name not in refs and all(c.codec == "full" for c in entry.chunks):
                    self._refs[name] = BaseTensor(version, entry, self._private_copy(arrays[name]))
        return version

    def loaded(self, manifest: Manifest, raws: dict[str, np.ndarray]) -> None:
        """The store restored ``manifest`` (``raws``: its tensors' bytes): the next commit builds on it."""
        self._head = manifest
        if manifest.borrowed is not None:  # its objects are another store's: the next commit is a full base
            self._refs, self._base, self._pending_base = None, None, None
            return
        if manifest.base is None:
            self._base = manifest
            self._refs = {name: BaseTensor(manifest.version, e, raws[name]) for name, e in manifest.tensors.items()}
            self._pending_base = None
        elif self._base is None or self._base.version != manifest.base:
            self._refs, self._base, self._pending_base = None, None, manifest.base
        for sha in manifest.objects():
            self._known.setdefault(sha, manifest.version)

    def forget_version(self, version: int) -> None:
        """gc deleted ``version``: the reader drops its manifest, and the writer stops building on it or reusing its
        objects."""
        self._reader.forget(version)
        if self._head is not None and self._head.version == version:
            self._head = None
        if self._base is not None and self._base.version == version:
            self._refs, self._base = None, None
        self._known = {sha: v for sha, v in self._known.items() if v != version}
        if version == self._probes.version:  # its manifest named the chains' objects; nothing may build on it
            self._probes = replace(self._probes, rows_since_base={})

    def forget_object(self, sha: str) -> None:
        """gc deleted object ``sha``: the next commit that needs it uploads it again."""
        self._known.pop(sha, None)
        if any(sha in r.entry.objects() for r in self._probes.rows_since_base.values()):
            self._probes = replace(self._probes, rows_since_base={})

    @staticmethod
    def _private_copy(arr: np.ndarray) -> np.ndarray:
        """A read-only copy of a base tensor's bytes: the caller may change its array once commit returns."""
        raw = raw_view(arr).copy()
        raw.flags.writeable = False
        return raw

    def _rebase_due(self, head: Manifest) -> bool:
        """A new base after ``full_every - 1`` deltas, or after a delta that cost > rebase_ratio x its base,
        unless a new base is not expected to pay.

        Whether it pays depends on the workload, so it is estimated: the commit that wrote ``head`` also
        encoded a probe of each changed chunk against the version before it, i.e. what a delta right after a
        new base would cost (``fresh``). A new base pays when a cycle of it plus ``full_every - 1`` fresh
        deltas costs less per version than the aged delta does now. Measured (bench/checkpoint.py): Adam on a
        1M MLP, whose fresh deltas shrink as training slows, gains from rebasing at 0.7 (fewer bytes than without
        the rebase); a 25M transformer, whose fresh deltas cost as much as aged ones, loses (a base every
        other version). Without probes of ``head`` (a fresh process) the plain 0.7 rule applies."""
        if head.depth + 1 >= self._full_every:
            return True
        if head.base is None or self._base is None:
            return False
        full, delta = self._base.stored_bytes(), _delta_bytes(head)
        if not (full > 0 and delta > self._rebase_ratio * full):
            return False
        if self._probes.version != head.version or self._probes.fresh_ratio is None:
            return True
        fresh = delta * self._probes.fresh_ratio
        return (full + (self._full_every - 1) * fresh) / self._full_every < delta

    def _prepare_reference(self) -> None:
        """Make sure the writer knows what to encode against: nothing in memory (fresh store, or a loaded delta
        whose base is not restored yet) -> restore the base of the newest (or loaded) version, once. A borrowed head
        has nothing to encode against here: the commit is a full base."""
        if self._refs is not None or (self._head is not None and self._head.borrowed is not None):
            return
        base_version = self._pending_base
        if base_version is None:
            committed = self._versions()
            for v in reversed(committed):
                try:
                    head = self._reader.manifest(v, v)
                except RestoreError as exc:
                    logger.warning("%s Skipping it when choosing what to commit against.", exc)
                    continue
                self._head = head
                if head.borrowed is not None:  # a fork's borrowed version: build on it with a full base
                    return
                base_version = head.version if head.base is None else head.base
                break
            if base_version is None:
                self._head = None
                return
        try:
            base, raws = self._reader.restore(base_version)
        except RestoreError as exc:
            logger.warning("%s Committing a full snapshot instead of a delta.", exc)
            self._head, self._pending_base, self._known = None, None, {}
            return
        self._base, self._pending_base = base, None
        self._refs = {name: BaseTensor(base.version, e, raws[name]) for name, e in base.tensors.items()}
        for sha in base.objects():
            self._known.setdefault(sha, base.version)

    def _embedded_table(self, entries: dict[str, TensorEntry], own: dict[str, bytes]) -> dict[str, str]:
        """What a new version's manifest embeds: its own small payloads, and every embedded object it references,
        taken from the manifest of the version each reference names (which embeds it: see manifest.py), or of
        the head for chunks the version keeps as the head stored them."""
        table = {sha: base64.b64encode(payload).decode("ascii") for sha, payload in own.items()}
        named = {o for e in entries.values() for c in e.chunks for o in c.objects()} - table.keys()
        sources = ref_versions_of(entries) | ({self._head.version} if self._head is not None else set())
        for v in sorted(sources):
            if not named:
                break
            carried = self._reader.manifest(v, v).embedded
            for sha in named & carried.keys():
                table[sha] = carried[sha]
            named -= carried.keys()
        return table

    def _write_chunks(self, payloads: dict[str, bytes]) -> None:
        """Upload every object (always: an existing object of the same name may be an orphan that gc is
        about to delete; uploading refreshes it, see gc.py's docstring)."""
        self._objects.put_many([(self._objects.chunk_path(sha), data) for sha, data in payloads.items()], self._map)

    def _next_version(self) -> int:
        committed, claimed = self._objects.scan()
        if not self._sole_writer:
            return max(committed | claimed, default=-1) + 1
        following = max(committed, default=-1) + 1
        for v in sorted(v for v in claimed if v >= following):
            logger.warning("checkpoint store %s: withdrawing version %d's claim (a manifest without a commit marker, "
                           "left by a writer that stopped mid-commit); this sole writer commits version %d next",
                           self._url, v, following)
            with contextlib.suppress(FileNotFoundError):  # gc may remove a stale claim at the same time
                self._objects.remove(self._objects.manifest_path(v))
        return following

    def _publish(self, manifest: Manifest, reused: set[int]) -> None:
        """Claim the version with the manifest, check what it reuses still exists, then make it visible with
        the marker (steps 3-5 of the module docstring)."""
        version = manifest.version
        objects = self._objects
        manifest_path, marker_path = objects.manifest_path(version), objects.marker_path(version)
        data = manifest.to_json_bytes()
        try:
            objects.create_exclusive(manifest_path, data)
        except FileExistsError:
            raise VersionConflictError(self._url, version) from None
        except BaseException as exc:
            objects.discard_if_ours(manifest_path, data)
            if isinstance(exc, Exception) and not isinstance(exc, CheckpointError):
                raise self._error("write manifest", exc) from exc
            raise
        for v in sorted(reused):
            present = objects.exists_or_none(objects.marker_path(v))
            if not present:
                objects.discard(manifest_path)
                self._refs, self._base, self._head, self._known = None, None, None, {}
                what = "was deleted (by gc?)" if present is False else "could not be checked (storage unreachable?)"
                err = StorageError if present is None else CheckpointError
                raise err(
                    f"checkpoint store {self._url}: version {v}, whose chunks version {version} reuses, {what} "
                    "during the commit; nothing of this commit is visible. Commit again (it writes a full version)"
                )
        marker = commit_marker(data)
        try:
            objects.create_exclusive(marker_path, marker)
        except FileExistsError:
            objects.discard(manifest_path)
            raise VersionConflictError(self._url, version) from None
        except BaseException as exc:
            landed = objects.landed(marker_path, marker)
            if landed:  # our side saw an error but the marker reached storage: the version is committed
                logger.warning(
                    "commit marker %s was written despite %r; version %d is committed", marker_path, exc, version
                )
                return
            if landed is False:  # when unknown (None) keep the claim: an orphan claim only costs a number
                objects.discard(manifest_path)
            if isinstance(exc, Exception) and not isinstance(exc, CheckpointError):
                raise self._error("write commit marker", exc) from exc
            raise
