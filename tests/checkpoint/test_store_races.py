"""CheckpointStore's commit protocol under races and failures: one winner per version, no partial version or
object after a failed write, a marker that landed counts, a crashed writer's claim is skipped (or withdrawn by a
sole writer)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore, VersionConflictError
from tests.checkpoint.store_helpers import all_files, assert_same_tensors, chunk_files, fs_root


def test_two_stores_racing_for_the_same_version_exactly_one_wins(url: str, monkeypatch) -> None:
    CheckpointStore(url).commit({"x": np.zeros(100)}, {})
    winner, loser = CheckpointStore(url), CheckpointStore(url)
    winner_state, loser_state = {"x": np.full(100, 1.0)}, {"x": np.full(100, 2.0)}

    real_publish = loser._writer._publish

    def publish_after_the_winner(manifest, *args):  # the loser has picked version 1; the winner commits it first
        assert winner.commit(winner_state, {"who": "winner"}) == manifest.version == 1
        return real_publish(manifest, *args)

    monkeypatch.setattr(loser._writer, "_publish", publish_after_the_winner)
    with pytest.raises(VersionConflictError, match="version 1 of checkpoint store") as info:
        loser.commit(loser_state, {"who": "loser"})
    assert loser.url in str(info.value)

    reader = CheckpointStore(url)
    assert reader.versions() == [0, 1]
    snap = reader.load(1)
    assert snap.meta == {"who": "winner"}
    assert_same_tensors(snap.tensors, winner_state)


def test_concurrent_committers_get_distinct_versions_or_a_conflict(url: str) -> None:
    CheckpointStore(url).commit({"x": np.zeros(1000)}, {})
    n = 4
    barrier = threading.Barrier(n)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        store = CheckpointStore(url)
        store.load()
        barrier.wait()
        try:
            results[i] = store.commit({"x": np.full(1000, float(i))}, {"writer": i})
        except VersionConflictError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = {i: v for i, v in results.items() if isinstance(v, int)}
    assert len(results) == n and won and len(set(won.values())) == len(won)
    reader = CheckpointStore(url)
    assert reader.versions() == [0, *sorted(won.values())]
    for i, v in won.items():
        snap = reader.load(v)
        assert snap.meta == {"writer": i} and np.all(snap.tensors["x"] == i)


class _FailingWriteFile:
    """Stands in for a file object whose write dies halfway (disk full, connection reset)."""

    def __init__(self, real) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        self.real.write(bytes(data[: len(data) // 2]))
        raise OSError("injected write failure")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.real.close()


def _fail_writes_to(monkeypatch, fs, suffix: str) -> None:
    """Make every way this store writes an object ending in ``suffix`` fail after writing part of it."""
    real_open, real_pipe = fs.open, fs.pipe_file

    def open_(path, mode="rb", *a, **k):
        f = real_open(path, mode, *a, **k)
        return _FailingWriteFile(f) if path.endswith(suffix) and "r" not in mode else f

    def pipe_file(path, data, *a, **k):
        if path.endswith(suffix):
            if len(data) // 2:
                real_pipe(path, bytes(data[: len(data) // 2]), *a, **k)
            raise OSError("injected write failure")
        return real_pipe(path, data, *a, **k)

    monkeypatch.setattr(fs, "open", open_)
    monkeypatch.setattr(fs, "pipe_file", pipe_file)


@pytest.mark.parametrize("suffix", [".json", ".commit"])
def test_a_failed_manifest_or_marker_write_leaves_no_version(url: str, monkeypatch, suffix: str) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.zeros(10)}, {})
    with monkeypatch.context() as m:
        _fail_writes_to(m, store._objects.fs, suffix)
        with pytest.raises(OSError, match="injected"):
            store.commit({"x": np.ones(10)}, {"attempt": 1})
    assert store.versions() == [0]
    assert not any(p.endswith(("00000001.json", "00000001.commit")) for p in all_files(url))
    assert store.commit({"x": np.ones(10)}, {"attempt": 2}) == 1
    snap = CheckpointStore(url).load()
    assert snap.version == 1 and snap.meta == {"attempt": 2} and np.all(snap.tensors["x"] == 1)


def test_a_failed_chunk_write_leaves_no_version_and_no_partial_object(url: str, monkeypatch) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.zeros(10)}, {})
    chunks_before = chunk_files(url)
    with monkeypatch.context() as m:
        _fail_writes_to(m, store._objects.fs, "")  # every write fails; first up is the new chunk
        with pytest.raises(OSError, match="injected"):
            store.commit({"x": np.arange(10.0)}, {})
    assert store.versions() == [0]
    if url.startswith("file://"):  # temp file + rename: the partial write never reached the chunk's name
        assert chunk_files(url) == chunks_before
    # elsewhere the injected half-object sits at the chunk's name; the size check makes the next commit rewrite it
    assert not any(".tmp-" in p for p in all_files(url))
    assert store.commit({"x": np.arange(10.0)}, {}) == 1
    assert_same_tensors(CheckpointStore(url).load(1).tensors, {"x": np.arange(10.0)})


def test_a_marker_that_landed_despite_an_error_counts_as_committed(url: str, monkeypatch, caplog) -> None:
    store = CheckpointStore(url)
    real = store._objects.create_exclusive

    def create_then_lose_the_reply(path: str, data: bytes) -> None:
        real(path, data)
        if path.endswith(".commit"):
            raise TimeoutError("reply lost after the write reached storage")

    monkeypatch.setattr(store._objects, "create_exclusive", create_then_lose_the_reply)
    with caplog.at_level(logging.WARNING, logger="rl_core.checkpoint"):
        assert store.commit({"x": np.ones(3)}, {}) == 0
    assert "version 0 is committed" in caplog.text
    assert CheckpointStore(url).load().version == 0


def test_a_claim_left_by_a_crashed_writer_is_skipped(url: str) -> None:
    store = CheckpointStore(url)
    store.commit({"x": np.zeros(4)}, {})
    fs, root = fs_root(url)
    fs.pipe_file(f"{root}/versions/00000001.json", b'{"half a manif')  # crashed between manifest and marker
    assert store.versions() == [0]
    assert store.commit({"x": np.ones(4)}, {}) == 2
    assert CheckpointStore(url).versions() == [0, 2] and CheckpointStore(url).load().version == 2


def test_a_sole_writer_withdraws_claims_left_mid_commit_and_keeps_numbers_consecutive(url: str, caplog) -> None:
    """A run killed between claim and marker: its rerun (the run's only writer) commits the number it expects."""
    fs, root = fs_root(url)
    fs.makedirs(f"{root}/versions", exist_ok=True)
    fs.pipe_file(f"{root}/versions/00000000.json", b'{"half a manif')  # killed before version 0 was committed
    store = CheckpointStore(url, sole_writer=True)
    with caplog.at_level(logging.WARNING, logger="rl_core.checkpoint"):
        assert store.commit({"x": np.zeros(4)}, {}) == 0
    assert "withdrawing version 0's claim" in caplog.text
    for orphan in (1, 2):  # two commits killed mid-claim, by two earlier attempts
        fs.pipe_file(f"{root}/versions/{orphan:08d}.json", b'{"half a manif')
    assert CheckpointStore(url, sole_writer=True).commit({"x": np.ones(4)}, {"n": 1}) == 1
    assert not fs.exists(f"{root}/versions/00000002.json")
    reader = CheckpointStore(url)
    assert reader.versions() == [0, 1] and reader.load().meta == {"n": 1}
    assert reader.commit({"x": np.full(4, 2.0)}, {}) == 2
