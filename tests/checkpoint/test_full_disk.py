"""A full disk under a local store: the commit that does not fit fails with a StorageError naming the store, leaves no
version and no half object behind, every earlier version still loads exactly, and once space is free again the next
commit succeeds. The disk is a 3 MiB tmpfs (mounted here when the machine allows it, skipped otherwise)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore, StorageError
from tests.small_disk import small_disk


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path) -> Iterator[Path]:
    with small_disk(tmp_path, "3m") as mount:
        yield mount


def _state(seed: int) -> dict[str, np.ndarray]:
    return {"w": np.random.default_rng(seed).standard_normal(150_000).astype(np.float32)}  # 600 kB, incompressible


def test_a_commit_that_does_not_fit_fails_cleanly_and_the_next_one_succeeds(small_disk: Path) -> None:
    url = f"file://{small_disk}/run"
    store = CheckpointStore(url, full_every=1)  # every version a full copy: the disk fills in a few
    committed = []
    with pytest.raises(StorageError) as failed:
        for seed in range(20):
            store.commit(_state(seed), {"seed": seed})
            committed.append(seed)
    message = str(failed.value)
    assert url in message and ("No space" in message or "ENOSPC" in message or "28" in message), message
    assert 1 <= len(committed) < 20
    reader = CheckpointStore(url)
    assert reader.versions() == list(range(len(committed)))
    assert not [p for p in small_disk.rglob("*") if ".tmp-" in p.name], "a half-written object was left behind"
    for version, seed in enumerate(committed):
        assert np.array_equal(reader.load(version).tensors["w"], _state(seed)["w"])
    reader.gc(keep_last=1, grace_s=0.0)  # free space: keep the newest version only
    assert store.commit(_state(99), {"seed": 99}) == len(committed)
    assert np.array_equal(CheckpointStore(url).load().tensors["w"], _state(99)["w"])
