"""What resume relies on when storage misbehaves: a corrupt newest version is set aside and the run continues from
the one before it; local writes are durable in the commit protocol's order; an unreachable store or a truncated
run.json is a clear error naming it."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from rl_core.checkpoint import CheckpointError, CheckpointStore, StorageError, objects
from rl_core.runtime.commits import newest_valid_version
from tests.checkpoint.store_helpers import (
    chunk_path,
    fs_root,
    optimizer_step,
    policy_state,
)


def _versions(url: str, n: int) -> tuple[CheckpointStore, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(3)
    # the objects in storage, not embedded: this test is about them
    store = CheckpointStore(url, full_every=8, embed_bytes=0)
    states = [policy_state(3)]
    for _ in range(n - 1):
        states.append(optimizer_step(states[-1], rng))
    for state in states:
        store.commit(state, {"n": len(states)})
    return store, states


def _corrupt(store: CheckpointStore, url: str, version: int, tensor: str) -> str:
    fs = fs_root(url)[0]
    path = chunk_path(store, url, version, tensor)
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    return path.rsplit("/", 1)[-1]


def test_a_corrupt_newest_version_is_set_aside_and_its_number_reused(url: str) -> None:
    store, states = _versions(url, 3)
    sha = _corrupt(store, url, 2, "w")
    latest, messages = newest_valid_version(CheckpointStore(url))
    assert latest == 1 and len(messages) == 1
    assert "version 2" in messages[0] and "'w'" in messages[0] and sha[:12] in messages[0] and "from version 1" in messages[0]
    again = CheckpointStore(url)
    assert again.versions() == [0, 1] and fs_root(url)[0].ls(f"{fs_root(url)[1]}/set-aside")
    again.load(1)
    assert again.commit(states[2], {"n": 3}) == 2  # the number is reused, the corrupt object written again
    assert CheckpointStore(url).verify()["errors"] == {}
    assert np.array_equal(CheckpointStore(url).load(2).tensors["w"], states[2]["w"])


def test_only_the_newest_version_can_be_set_aside(url: str) -> None:
    store, _ = _versions(url, 3)
    with pytest.raises(CheckpointError, match="only the newest"):
        store.set_aside(1)
    assert newest_valid_version(store) == (2, [])


def test_local_writes_are_flushed_chunks_then_manifest_then_marker(tmp_path, monkeypatch) -> None:
    """Each write the commit protocol orders reaches the disk before the next: the chunks (flushed together with
    syncfs where Linux has it, else one fsync each), then the manifest, then the commit marker."""
    synced: list[str] = []
    real_fsync, real_flush = os.fsync, objects._flush_filesystem

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def recording_flush(directory: str) -> None:
        synced.extend(str(p) for p in Path(directory, "chunks").rglob("*") if p.is_file())  # all it makes durable
        real_flush(directory)

    store = CheckpointStore(f"file://{tmp_path}/ck", workers=1)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(objects, "_flush_filesystem", recording_flush)
    store.commit(policy_state(1), {})
    files = [p for p in synced if not os.path.isdir(p)]
    kinds = ["marker" if p.endswith(".commit") else "manifest" if p.endswith(".json") else "chunk"
             for p in (f.split(".tmp-")[0] for f in files)]
    assert kinds[-2:] == ["manifest", "marker"] and set(kinds[:-2]) == {"chunk"}, kinds
    assert f"{tmp_path}/ck/versions" in synced  # the directory that holds the marker
    assert synced.index(f"{tmp_path}/ck/versions") > max(i for i, p in enumerate(synced) if p.endswith(".json"))
    if objects._SYNCFS is None:  # one fsync per chunk and per directory it lands in
        assert any(p.startswith(f"{tmp_path}/ck/chunks/") and os.path.isdir(p) for p in synced)
    else:  # the whole commit's chunks: written, flushed, renamed, flushed again
        assert kinds.count("chunk") == 2 * len(list(Path(tmp_path, "ck", "chunks").rglob("*/*")))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_store_is_a_clear_error_naming_it() -> None:
    pytest.importorskip("s3fs")
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"}, "key": "k", "secret": "s",
               "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
    store = CheckpointStore("s3://nowhere/run", storage_options=options)
    for call in (store.versions, store.load, store.latest):
        with pytest.raises(StorageError, match=r"s3://nowhere/run: could not (list versions|load)"):
            call()


def test_a_truncated_run_json_is_a_clear_error_naming_the_file(tmp_path) -> None:
    from rl_core.config.presets import build_control_config
    from rl_core.data.run_info import RunInfoError, load_run_config, open_run
    from rl_core.data.run_listing import list_runs

    cfg = build_control_config("tiny", run_name="cut", store=f"file://{tmp_path}")
    open_run(cfg)
    run_json = tmp_path / "cut" / "run.json"
    run_json.write_bytes(run_json.read_bytes()[:40])
    for call in (lambda: open_run(cfg), lambda: load_run_config(f"file://{tmp_path}", "cut"),
                 lambda: list_runs(f"file://{tmp_path}")):
        with pytest.raises(RunInfoError, match=f"{tmp_path}/cut/run.json is not a readable run.json"):
            call()
    run_json.write_text("[]")
    with pytest.raises(RunInfoError, match="incarnation"):
        open_run(cfg)
