"""AsyncSaver: copies on the caller's thread, commits in the background, bounded, failures never silent."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rl_core.checkpoint import AsyncSaveError, AsyncSaver, CheckpointStore


def test_saves_commit_in_order_and_the_caller_may_reuse_its_arrays(url: str) -> None:
    store = CheckpointStore(url)
    x = np.zeros(10_000, np.float32)
    expected = []
    with AsyncSaver(store, max_pending=2) as saver:
        futures = []
        for i in range(5):
            x[i * 10 : i * 10 + 10] = i + 1  # mutate right after save returns: the copy was taken
            futures.append(saver.save({"x": x}, {"i": i}))
            expected.append(x.copy())
        assert [f.result(timeout=30) for f in futures] == list(range(5))
    fresh = CheckpointStore(url)
    for v, exp in enumerate(expected):
        snap = fresh.load(v)
        assert snap.meta == {"i": v} and snap.tensors["x"].tobytes() == exp.tobytes()


def test_the_queue_is_bounded_and_save_blocks_when_full(url: str, monkeypatch) -> None:
    store = CheckpointStore(url)
    gate = threading.Event()
    real = store.commit
    monkeypatch.setattr(store, "commit", lambda *a, **k: (gate.wait(10), real(*a, **k))[1])
    saver = AsyncSaver(store, max_pending=2)
    saver.save({"x": np.zeros(4)}, {})
    saver.save({"x": np.ones(4)}, {})
    done = threading.Event()
    threading.Thread(target=lambda: (saver.save({"x": np.full(4, 2.0)}, {}), done.set()), daemon=True).start()
    assert not done.wait(0.3)  # third save waits for a free buffer set
    gate.set()
    assert done.wait(10)
    saver.close()
    assert store.versions() == [0, 1, 2]


def test_a_background_failure_is_raised_by_the_next_save_and_then_saving_works_again(url: str, monkeypatch) -> None:
    store = CheckpointStore(url)
    saver = AsyncSaver(store)
    real = store.commit
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk on fire")
        return real(*a, **k)

    monkeypatch.setattr(store, "commit", flaky)
    fut = saver.save({"x": np.zeros(4)}, {})
    with pytest.raises(OSError, match="disk on fire"):
        fut.result(timeout=10)
    with pytest.raises(AsyncSaveError, match="disk on fire") as info:
        saver.save({"x": np.ones(4)}, {})
    assert store.url in str(info.value) and isinstance(info.value.__cause__, OSError)
    assert saver.save({"x": np.ones(4)}, {}).result(timeout=10) == 0
    saver.close()


def test_flush_and_close_raise_a_pending_failure(url: str, monkeypatch) -> None:
    store = CheckpointStore(url)
    monkeypatch.setattr(store, "commit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    saver = AsyncSaver(store)
    saver.save({"x": np.zeros(4)}, {})
    with pytest.raises(AsyncSaveError, match="boom"):
        saver.flush()
    saver.save({"x": np.zeros(4)}, {})
    with pytest.raises(AsyncSaveError, match="boom"):
        saver.close()
    with pytest.raises(Exception, match="closed"):
        saver.save({"x": np.zeros(4)}, {})


def test_torch_tensors_including_bf16_and_noncontiguous(url: str) -> None:
    torch = pytest.importorskip("torch")
    w = torch.randn(32, 16).to(torch.bfloat16)
    t = torch.randn(8, 6).t()  # non-contiguous
    with AsyncSaver(CheckpointStore(url)) as saver:
        saver.save({"w": w, "t": t, "n": np.arange(3)}, {"k": 1}).result(timeout=30)
    back = CheckpointStore(url).load().to_torch()
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], w) and torch.equal(back["t"], t)


def test_save_blocks_only_for_the_copy(url: str, monkeypatch) -> None:
    store = CheckpointStore(url)
    real = store.commit
    monkeypatch.setattr(store, "commit", lambda *a, **k: (time.sleep(0.5), real(*a, **k))[1])
    with AsyncSaver(store) as saver:
        t0 = time.perf_counter()
        fut = saver.save({"x": np.zeros(1000)}, {})
        assert time.perf_counter() - t0 < 0.25 and not fut.done()
    assert fut.result() == 0


def test_host_buffers_are_reused_across_saves_bf16_included(url: str) -> None:
    """The pause is one copy into buffers allocated once per buffer set, not an allocation per save."""
    import torch

    store = CheckpointStore(url)
    seen: list[dict[str, int]] = []
    real = store.commit

    def commit_noting_addresses(arrays, meta, **kwargs):
        seen.append({name: a.ctypes.data for name, a in arrays.items()})
        return real(arrays, meta, **kwargs)

    store.commit = commit_noting_addresses  # type: ignore[method-assign]
    w = torch.randn(64, 8).to(torch.bfloat16)
    x = np.arange(100, dtype=np.float64)
    with AsyncSaver(store, max_pending=1) as saver:
        for i in range(3):
            saver.save({"w": w + i, "x": x + i}, {}).result(timeout=30)
    assert seen[0] == seen[1] == seen[2]
    back = CheckpointStore(url).load(2).to_torch()
    assert torch.equal(back["w"], w + 2) and np.array_equal(back["x"].numpy(), x + 2)
