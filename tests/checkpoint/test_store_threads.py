"""Small work on a local store runs inline, large work on the store's threads: the same versions either way."""
from __future__ import annotations

import numpy as np

from rl_core.checkpoint import CheckpointStore
from rl_core.checkpoint.store import INLINE_MAX_BYTES


def _states(seed: int) -> list[dict[str, np.ndarray]]:
    """Three versions of a state just above the inline limit: one large tensor drifting, small ones changing."""
    rng = np.random.default_rng(seed)
    big = rng.standard_normal(INLINE_MAX_BYTES // 4 + 1024).astype(np.float32)
    states = []
    for step in range(3):
        big = big + rng.standard_normal(big.size).astype(np.float32) * 1e-3
        states.append({"big": big, "small": rng.standard_normal(64), "step": np.array(step, dtype=np.int64)})
    return states


def _commit_all(url: str, workers: int, states: list[dict[str, np.ndarray]]) -> CheckpointStore:
    store = CheckpointStore(url, workers=workers, chunk_bytes=1 << 20)  # several chunks: several jobs per batch
    for state in states:
        store.commit(state, {})
    return store


def test_threaded_and_inline_commits_write_the_same_versions(tmp_path) -> None:
    states = _states(0)
    threaded = _commit_all(f"file://{tmp_path}/threaded", 2, states)  # above the limit: the thread pool
    inline = _commit_all(f"file://{tmp_path}/inline", 1, states)
    for version, state in enumerate(states):
        a, b = threaded.manifest(version)["tensors"], inline.manifest(version)["tensors"]
        assert [c["chunk"] for c in a["big"]["chunks"]] == [c["chunk"] for c in b["big"]["chunks"]]
        assert len(a["big"]["chunks"]) > 1
        for store in (threaded, CheckpointStore(f"file://{tmp_path}/threaded")):  # a fresh reader too
            loaded = store.load(version).tensors
            assert all(loaded[k].tobytes() == np.asarray(v).tobytes() for k, v in state.items())


def test_small_state_on_a_local_store_restores_exactly_inline(tmp_path) -> None:
    rng = np.random.default_rng(1)
    state = {f"t{i}": rng.standard_normal(100).astype(np.float32) for i in range(69)}  # a learner's many small tensors
    store = CheckpointStore(f"file://{tmp_path}/s")
    store.commit(state, {})
    store.commit({k: v + 1 for k, v in state.items()}, {})
    assert store._pool is None  # nothing needed the threads
    loaded = CheckpointStore(f"file://{tmp_path}/s").load(1).tensors
    assert all(loaded[k].tobytes() == (v + 1).tobytes() for k, v in state.items())
