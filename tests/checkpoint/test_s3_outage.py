"""An S3 outage in the middle of a save (moto's ThreadedMotoServer on 127.0.0.1, stopped mid-upload)."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import AsyncSaveError, AsyncSaver, CheckpointStore, StorageError

SECRET = "outage-s3cr3t-value"


def _options(endpoint: str) -> dict:
    return {
        "client_kwargs": {"endpoint_url": endpoint},
        "key": "AKIAOUTAGETEST",
        "secret": SECRET,
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 5},
    }


def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(200_000).astype(np.float32), "b": rng.standard_normal(100)}


def test_outage_during_a_save_fails_clearly_leaves_no_half_version_and_the_next_save_succeeds(s3_server) -> None:
    options = _options(s3_server.endpoint)
    fsspec.filesystem("s3", **options).mkdir("outage-bucket")
    url = "s3://outage-bucket/run"
    store = CheckpointStore(url, storage_options=options, chunk_bytes=64 << 10, workers=1)
    assert store.commit(_state(0), {"i": 0}) == 0

    real_put = store._objects.put_whole
    uploads = []

    def put_then_outage(path: str, data: bytes) -> None:
        uploads.append(path)
        if len(uploads) == 3:  # some chunks of version 1 are up; the endpoint goes away mid-save
            s3_server.stop()
        real_put(path, data)

    store._objects.put_whole = put_then_outage  # type: ignore[method-assign]
    with pytest.raises(StorageError) as info:
        store.commit(_state(1), {"i": 1})
    msg = str(info.value)
    assert url in msg and "nothing of this commit is visible" in msg and SECRET not in msg
    store._objects.put_whole = real_put  # type: ignore[method-assign]

    s3_server.start()
    reader = CheckpointStore(url, storage_options=options)
    assert reader.versions() == [0]
    fs = fsspec.filesystem("s3", **options)
    fs.invalidate_cache()
    assert not fs.exists("outage-bucket/run/versions/00000001.json")
    assert store.commit(_state(1), {"i": 1}) == 1
    snap = CheckpointStore(url, storage_options=options).load()
    assert snap.version == 1 and snap.meta == {"i": 1} and snap.tensors["w"].tobytes() == _state(1)["w"].tobytes()


def test_async_saver_surfaces_the_outage_and_recovers(s3_server) -> None:
    options = _options(s3_server.endpoint)
    fsspec.filesystem("s3", **options).mkdir("outage-async")
    url = "s3://outage-async/run"
    store = CheckpointStore(url, storage_options=options, workers=1)
    saver = AsyncSaver(store)
    assert saver.save(_state(0), {}).result(timeout=60) == 0
    s3_server.stop()
    failed = saver.save(_state(1), {})
    with pytest.raises(StorageError):
        failed.result(timeout=60)
    s3_server.start()
    with pytest.raises(AsyncSaveError, match="outage-async/run") as info:
        saver.save(_state(1), {})
    assert SECRET not in str(info.value)
    assert saver.save(_state(1), {}).result(timeout=60) == 1
    saver.close()
    assert CheckpointStore(url, storage_options=options).versions() == [0, 1]
