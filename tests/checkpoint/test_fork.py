"""Zero-copy forks (CheckpointStore.fork): what a fork writes, what it reads, how the stores' gc treats it, and gc
racing a fork (rl_core/checkpoint/gc.py holds the argument these tests check)."""

from __future__ import annotations

import threading
import time

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import CheckpointError, CheckpointStore, VersionNotFoundError
from rl_core.checkpoint.cli import main
from tests.checkpoint.store_helpers import assert_same_tensors


def _files(url: str) -> dict[str, int]:
    """Every file under ``url`` with its size: what the store holds in storage."""
    fs, root = fsspec.core.url_to_fs(url)
    return {p: info["size"] for p, info in fs.find(root, detail=True).items()} if fs.exists(root) else {}


def _parent(url: str, n: int = 6, full_every: int = 4) -> tuple[CheckpointStore, list[dict[str, np.ndarray]]]:
    """A run's checkpoints at ``url``/p/checkpoints: ``n`` versions of a state that changes a little each time, with
    tensors large enough to be stored (not embedded in the manifests)."""
    rng = np.random.default_rng(0)
    store = CheckpointStore(f"{url}/p/checkpoints", full_every=full_every)
    x = rng.standard_normal(50_000).astype(np.float32)
    states = []
    for i in range(n):
        x = x.copy()
        x[rng.choice(x.size, 500, replace=False)] += 1.0
        states.append({"x": x, "steps": np.array(i)})
        store.commit(states[-1], {"iteration": i})
    return store, states


def _chunks(url: str) -> set[str]:
    return {p for p in _files(url) if "/chunks/" in p}


def test_a_fork_writes_no_chunk_and_restores_the_parents_version_exactly(url: str) -> None:
    parent, states = _parent(url)
    before = _files(url)
    assert parent.fork(f"{url}/f/checkpoints", [4], meta={"note": "lr 1e-4"}, lineage={"run": "p"}) == [4]
    added = {p: n for p, n in _files(url).items() if p not in before}
    assert _chunks(url) == {p for p in before if "/chunks/" in p}  # not one object more
    assert sorted(p.rsplit("/", 2)[-2] for p in added) == ["pins", "versions", "versions"]  # a pin, manifest, marker
    manifest_bytes = len(parent._objects.read(parent._objects.manifest_path(4)))
    assert sum(added.values()) < 2 * manifest_bytes + 2000  # the manifest's copy, its marker and the pin

    fork = CheckpointStore(f"{url}/f/checkpoints")
    assert fork.versions() == [4] and fork.verify()["errors"] == {}
    snap = fork.load()
    assert_same_tensors(snap.tensors, states[4])
    digest = parent._reader.digest(4)
    assert snap.meta == {"iteration": 4, "note": "lr 1e-4",
                         "forked_from": {"run": "p", "version": 4, "manifest_sha256": digest}}
    report = fork.size_report(4)
    assert report["encoded_bytes"] == 0 and report["borrowed"] == "../../p/checkpoints"
    stored = len(parent._reader.manifest(4, 4).stored_objects())
    assert list(parent.pins().values()) == [{"fork": "../../f/checkpoints", "version": 4, "objects": stored}]


def test_a_forks_later_versions_write_their_own_objects_in_its_folder(url: str) -> None:
    parent, states = _parent(url)
    parent.fork(f"{url}/f/checkpoints", [5])
    parent_files = _files(f"{url}/p")
    fork = CheckpointStore(f"{url}/f/checkpoints", full_every=4, sole_writer=True)
    snap = fork.load()
    assert_same_tensors(snap.tensors, states[5])
    x = snap.tensors["x"]
    later = []
    for i in range(3):
        x = x.copy()
        x[:100] += 1
        later.append({"x": x, "steps": np.array(6 + i)})
        assert fork.commit(later[-1], {"iteration": 6 + i}) == 6 + i
    assert _files(f"{url}/p") == parent_files  # the parent is untouched
    manifests = [fork._reader.manifest(v, v) for v in (6, 7, 8)]
    assert manifests[0].base is None and manifests[0].parent == 5  # a full base here, built on the borrowed version
    assert [m.base for m in manifests[1:]] == [6, 6]
    own = {p.rsplit("/", 1)[-1] for p in _chunks(f"{url}/f")}
    assert set().union(*(m.stored_objects() for m in manifests)) <= own
    reader = CheckpointStore(f"{url}/f/checkpoints")
    assert reader.verify()["errors"] == {}
    for v, state in zip((6, 7, 8), later):
        assert_same_tensors(reader.load(v).tensors, state)


def test_the_parents_gc_keeps_what_a_fork_reads_until_the_fork_lets_go(url: str) -> None:
    parent, states = _parent(url, n=6)
    parent.fork(f"{url}/f/checkpoints", [2])  # a delta on base 0
    for i in range(6, 12):
        parent.commit({"x": states[-1]["x"] + i, "steps": np.array(i)}, {"iteration": i})
    report = parent.gc(keep_last=1, grace_s=0)
    assert report["pinned_versions"] == [2] and report["kept_versions"] == [0, 2, 8, 11]  # 2, its base 0; 11's base
    fork = CheckpointStore(f"{url}/f/checkpoints", sole_writer=True)
    assert fork.verify()["errors"] == {}
    assert_same_tensors(fork.load().tensors, states[2])

    fork.commit({"x": states[2]["x"] * 2, "steps": np.array(3)}, {"iteration": 3})
    released = fork.gc(keep_last=1, grace_s=0)  # the borrowed version goes, and with it the pin
    assert released["deleted_versions"] == [2] and len(released["released_pins"]) == 1 and parent.pins() == {}
    after = parent.gc(keep_last=1, grace_s=0)
    assert after["kept_versions"] == [8, 11] and after["deleted_chunks"] > 0
    assert CheckpointStore(f"{url}/f/checkpoints").verify()["errors"] == {}


def test_a_fork_of_a_fork_pins_the_objects_where_they_are(url: str) -> None:
    parent, states = _parent(url)
    parent.fork(f"{url}/f1/checkpoints", [3], lineage={"run": "p"})
    f1 = CheckpointStore(f"{url}/f1/checkpoints")
    f1.fork(f"{url}/f2/checkpoints", [3], lineage={"run": "f1"})
    f2 = CheckpointStore(f"{url}/f2/checkpoints")
    assert f2.manifest(3)["borrowed"]["store"] == "../../p/checkpoints"  # where the objects are, not f1
    assert f2.meta(3)["forked_from"]["run"] == "f1" and f1.pins() == {}
    assert sorted(p["fork"] for p in parent.pins().values()) == ["../../f1/checkpoints", "../../f2/checkpoints"]

    f1.commit({"x": states[3]["x"] + 1, "steps": np.array(4)}, {})
    f1.gc(keep_last=1, grace_s=0)  # f1 lets go of p's version 3; f2 still holds it
    parent.commit({"x": states[-1]["x"] + 9, "steps": np.array(9)}, {})
    assert parent.gc(keep_last=1, grace_s=0)["pinned_versions"] == [3]
    assert f2.verify()["errors"] == {}
    assert_same_tensors(CheckpointStore(f"{url}/f2/checkpoints").load(3).tensors, states[3])


def test_a_fork_needs_an_empty_target_on_the_same_filesystem_and_committed_versions(url: str, tmp_path) -> None:
    parent, _ = _parent(url, n=3)
    with pytest.raises(VersionNotFoundError, match="no version 7"):
        parent.fork(f"{url}/f/checkpoints", [7])
    parent.fork(f"{url}/f/checkpoints", [2])
    with pytest.raises(CheckpointError, match="holds versions 2; a fork starts a store of its own"):
        parent.fork(f"{url}/f/checkpoints", [1])
    elsewhere = f"memory://{tmp_path}/f" if url.startswith("file://") else f"file://{tmp_path}/f"
    with pytest.raises(ValueError, match="is not on the filesystem of"):
        parent.fork(elsewhere, [2])
    assert len(parent.pins()) == 1  # the refused forks left nothing


def test_a_fork_whose_version_gc_deletes_before_the_check_fails_and_leaves_nothing(url: str, monkeypatch) -> None:
    """A gc that listed the pins before the fork pinned deletes the version (its step c) between the pin and the
    fork's check (step 3 of fork.py): the fork must fail and take its pin back."""
    parent, _ = _parent(url, n=6)
    real = parent._objects.exists_or_none
    fs, root = fsspec.core.url_to_fs(f"{url}/p/checkpoints")

    def gc_first(path: str) -> bool | None:
        fs.rm_file(f"{root}/versions/00000002.commit")  # marker first, as gc deletes a version
        fs.rm_file(f"{root}/versions/00000002.json")
        return real(path)

    monkeypatch.setattr(parent._objects, "exists_or_none", gc_first)
    with pytest.raises(CheckpointError, match="version 2 was deleted .* nothing was forked"):
        parent.fork(f"{url}/f/checkpoints", [2])
    assert parent.pins() == {} and CheckpointStore(f"{url}/f/checkpoints").versions() == []
    assert not _files(f"{url}/f")


def test_a_gc_that_dooms_the_version_after_the_check_still_keeps_its_objects(url: str, monkeypatch) -> None:
    """gc listed the pins before the fork pinned, so it deletes the version; the fork checked before that deletion,
    so gc's second reading of the pins (after the manifests) finds the pin and keeps the objects."""
    parent, states = _parent(url, n=6)
    gc_store = CheckpointStore(f"{url}/p/checkpoints")
    real_read_pins = gc_store._objects.list_pins
    calls = []

    def listing(*args):  # gc's first listing (step b) sees no pin; the fork is made right after it
        calls.append(1)
        pins = real_read_pins(*args)
        if len(calls) == 1:
            parent.fork(f"{url}/f/checkpoints", [2])
        return pins

    monkeypatch.setattr(gc_store._objects, "list_pins", listing)
    report = gc_store.gc(keep_last=1, grace_s=0)
    assert 2 in report["deleted_versions"] and report["deleted_chunks"] > 0  # the version went, its objects stayed
    fork = CheckpointStore(f"{url}/f/checkpoints")
    assert fork.verify()["errors"] == {}
    assert_same_tensors(fork.load(2).tensors, states[2])


def test_a_gc_reading_while_another_deletes_the_version_keeps_a_forks_objects(url: str, monkeypatch) -> None:
    """Two collectors: one (simulated) deletes version 2 after the fork checked it, while the other is between its
    reading of the manifests and of the pins (gc.py's step d). The manifests came first, so it saw version 2's."""
    parent, states = _parent(url, n=6)
    collector = CheckpointStore(f"{url}/p/checkpoints")
    fs, root = fsspec.core.url_to_fs(f"{url}/p/checkpoints")
    real = collector._objects.list_pins
    calls = []

    def listing() -> list[str]:
        calls.append(1)
        names = real()
        if len(calls) == 2:  # step d's listing (no pin yet): the fork is made, then the other gc deletes version 2
            parent.fork(f"{url}/f/checkpoints", [2])
            fs.rm_file(f"{root}/versions/00000002.commit")
            fs.rm_file(f"{root}/versions/00000002.json")
        return names

    monkeypatch.setattr(collector._objects, "list_pins", listing)
    collector.gc(keep_last=6, grace_s=0)  # keeps every version it saw; the other gc removed 2
    monkeypatch.undo()
    assert CheckpointStore(f"{url}/f/checkpoints").verify()["errors"] == {}
    assert_same_tensors(CheckpointStore(f"{url}/f/checkpoints").load(2).tensors, states[2])
    assert collector.gc(keep_last=1, grace_s=0)["pinned_versions"] == []  # version 2 is gone from the parent ...
    assert CheckpointStore(f"{url}/f/checkpoints").verify()["errors"] == {}  # ... and the pin keeps its objects


def test_pins_are_listed_again_when_one_vanishes_before_it_is_read(url: str, monkeypatch) -> None:
    """A pin created after a listing, just before another pin's removal, is missing from that listing: reading the
    removed pin fails, and the pins are listed again (pins.py)."""
    from rl_core.checkpoint.pins import read_pins

    parent, _ = _parent(url, n=3)
    parent.fork(f"{url}/f1/checkpoints", [1])
    objects = parent._objects
    (first,) = objects.list_pins()
    real = objects.read_fresh
    done = []

    def read(path: str) -> bytes:
        if path == objects.pin_path(first) and not done:
            done.append(1)
            parent.fork(f"{url}/f2/checkpoints", [2])  # a new pin ...
            objects.remove(path)  # ... then the listed one goes (its fork's gc released it)
        return real(path)

    monkeypatch.setattr(objects, "read_fresh", read)
    pins = read_pins(objects, parent.url, grace_s=3600)
    assert [p.version for p in pins.values()] == [2]


def test_gc_racing_forks_never_deletes_what_a_fork_committed(url: str) -> None:
    """A parent commits and collects with the tightest policy (keep 1, no grace) in one thread while two others fork
    its newest version again and again; short random pauses inside both (between a fork's pin and its check, between
    gc's reading of the pins and its deletions) make every interleaving of gc.py's argument happen. Every fork that
    committed restores exactly, after a last gc with nothing beside it; every fork that lost left no version."""
    _parent(url, n=2, full_every=3)
    rounds, stop = 30, threading.Event()
    made: dict[str, int] = {}
    failed: list[str] = []
    errors: list[BaseException] = []

    def paused(fn, rng: np.random.Generator, most_s: float):
        def call(*args):
            time.sleep(rng.uniform(0, most_s))
            out = fn(*args)
            time.sleep(rng.uniform(0, most_s))
            return out
        return call

    def parent_side() -> None:
        store = CheckpointStore(f"{url}/p/checkpoints", full_every=3, sole_writer=True)
        rng = np.random.default_rng(1)
        store._objects.list_pins = paused(store._objects.list_pins, rng, 0.01)
        try:
            while not stop.is_set():
                store.commit({"x": rng.standard_normal(50_000).astype(np.float32), "steps": np.array(0)}, {})
                store.gc(keep_last=1, grace_s=0)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    def fork_side(side: int) -> None:
        store = CheckpointStore(f"{url}/p/checkpoints")
        rng = np.random.default_rng(10 + side)
        for step in ("scan", "create_exclusive", "exists_or_none"):  # the fork's first reading, its pin, its check
            setattr(store._objects, step, paused(getattr(store._objects, step), rng, 0.02))
        try:
            for i in range(rounds):
                name = f"f{side}-{i}"
                try:
                    version = store.latest()
                    store.fork(f"{url}/{name}/checkpoints", [version])
                except (CheckpointError, VersionNotFoundError):  # gc won the race: nothing was forked
                    failed.append(name)
                    continue
                made[name] = version
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    forks = [threading.Thread(target=fork_side, args=(side,)) for side in range(2)]
    collector = threading.Thread(target=parent_side)
    for t in (collector, *forks):
        t.start()
    for t in forks:
        t.join(timeout=600)
    stop.set()
    collector.join(timeout=600)
    assert not errors, errors
    assert len(made) + len(failed) == 2 * rounds and made and failed  # both outcomes happened
    final = CheckpointStore(f"{url}/p/checkpoints")
    final.commit({"x": np.zeros(50_000, dtype=np.float32), "steps": np.array(1)}, {})
    final.gc(keep_last=1, grace_s=0)  # and once more with nothing running beside
    for name, version in made.items():
        fork = CheckpointStore(f"{url}/{name}/checkpoints")
        assert fork.versions() == [version] and fork.verify()["errors"] == {}, name
    for name in failed:
        assert CheckpointStore(f"{url}/{name}/checkpoints").versions() == [], name
    assert len(final.pins()) == len(made)


def test_ls_and_show_tell_a_borrowed_version_and_the_pins(url: str, capsys) -> None:
    import io

    parent, _ = _parent(url, n=3)
    parent.fork(f"{url}/f/checkpoints", [2], lineage={"run": "p"})
    out = io.StringIO()
    assert main(["show", f"{url}/f/checkpoints", "2"], out=out) == 0
    text = out.getvalue()
    assert "forked from run p version 2 (manifest sha256 " in text and "objects are in ../../p/checkpoints" in text
    out = io.StringIO()
    assert main(["ls", f"{url}/f/checkpoints"], out=out) == 0
    assert out.getvalue().splitlines()[1].split()[:2] == ["2", "fork"]
    out = io.StringIO()
    assert main(["ls", f"{url}/p/checkpoints"], out=out) == 0
    assert "version 2 is pinned by the fork ../../f/checkpoints" in out.getvalue()


def test_a_fork_on_s3_writes_manifests_only(s3_endpoint: str) -> None:
    """On a real S3 endpoint (moto), every write goes through the filesystem's pipe_file: a fork's are a pin, a
    manifest and a marker, none under chunks/."""
    options = {"client_kwargs": {"endpoint_url": s3_endpoint}, "key": "testing", "secret": "testing"}
    fs = fsspec.filesystem("s3", **options)
    fs.mkdir("fork-bucket")
    parent = CheckpointStore("s3://fork-bucket/runs/p/checkpoints", storage_options=options)
    x = np.random.default_rng(3).standard_normal(100_000).astype(np.float32)
    for i in range(3):
        parent.commit({"x": x + i}, {"iteration": i})
    written: list[tuple[str, int]] = []
    real = parent._objects.fs.pipe_file

    def counting(path, data, *args, **kwargs):
        written.append((path, len(data)))
        return real(path, data, *args, **kwargs)

    parent._objects.fs.pipe_file = counting  # the instance both stores share (fsspec caches it)
    try:
        parent.fork("s3://fork-bucket/runs/f/checkpoints", [2], lineage={"run": "p"})
    finally:
        del parent._objects.fs.pipe_file
    assert [p.split("/")[-2] for p, _ in written] == ["pins", "versions", "versions"]
    assert sum(n for _, n in written) < 4000
    parent.commit({"x": x * 0}, {})
    parent.gc(keep_last=1, grace_s=0)
    fork = CheckpointStore("s3://fork-bucket/runs/f/checkpoints", storage_options=options)
    assert fork.verify()["errors"] == {} and fork.load().tensors["x"].tobytes() == (x + 2).tobytes()
