"""Store URLs, fuzzed (issue 20, "Bad input, fuzzed"): an unknown scheme, an unreachable endpoint and a folder the
store may not write to each give a clear error naming the store, and nothing is written."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_core.checkpoint import CheckpointStore, StorageError
from rl_core.config.common import STORE_SCHEMES, ConfigError, StorageConfig
from rl_core.config.presets import build_agent_config, build_control_config
from tests.checkpoint.store_helpers import assert_same_tensors

#: any text before "://" but the schemes a run may use (and none: "://x" reads as a local path, like "x")
ANY_SCHEME = st.text(min_size=1, max_size=20).filter(lambda s: s not in STORE_SCHEMES)
#: schemes as URLs spell them (RFC 3986) that fsspec has no filesystem for (one letter is a Windows drive to it)
FSSPEC_UNKNOWN = st.from_regex(r"[a-z][a-z0-9+.-]{1,15}", fullmatch=True).filter(
    lambda s: s not in fsspec.available_protocols())


@given(scheme=ANY_SCHEME, rest=st.sampled_from(["bucket/prefix", "", "/abs/path", "user:pw@host:9/x"]))
def test_a_run_on_an_unknown_scheme_is_refused_naming_the_url(scheme: str, rest: str) -> None:
    url = f"{scheme}://{rest}"
    for build in (build_control_config, build_agent_config):
        with pytest.raises(ConfigError) as err:
            build("tiny", run_name="fuzz", store=url)
        assert "storage.url (--store): " in str(err.value) and repr(url) in str(err.value)
        assert f"allowed: {', '.join(STORE_SCHEMES)}" in str(err.value)
    with pytest.raises(ValueError, match="unknown store scheme"):
        StorageConfig(url=url)


@given(scheme=FSSPEC_UNKNOWN)
def test_a_store_on_a_scheme_fsspec_does_not_know_is_refused_writing_nothing(scheme: str) -> None:
    with tempfile.TemporaryDirectory() as here, contextlib.chdir(here):
        with pytest.raises(ValueError) as err:
            CheckpointStore(f"{scheme}://bucket/run")
        assert f"checkpoint store {scheme}://bucket/run: no storage backend for the scheme '{scheme}'" in str(err.value)
        assert not os.listdir(here)


@pytest.mark.parametrize("url", ["zz://bucket/run", "z://bucket/run"])
def test_a_store_on_an_unknown_scheme_names_its_url(url: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        CheckpointStore(url).commit({"x": np.zeros(3)}, {})
    assert url in str(err.value)


# ------------------------------------------------------------------------------------------- unreachable endpoint


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def unreachable() -> CheckpointStore:
    pytest.importorskip("s3fs")
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"}, "key": "k", "secret": "s",
               "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
    return CheckpointStore("s3://nowhere/run", storage_options=options)


_CALLS: dict[str, Callable[[CheckpointStore], object]] = {
    "commit": lambda store: store.commit({"w": np.arange(8, dtype=np.float32)}, {"step": 1}),
    "versions": CheckpointStore.versions,
    "load": CheckpointStore.load,
    "load(0)": lambda store: store.load(0),
    "verify": CheckpointStore.verify,
}


@pytest.mark.parametrize("call", _CALLS.values(), ids=_CALLS.keys())
def test_an_unreachable_endpoint_is_a_storage_error_naming_the_store(unreachable: CheckpointStore,
                                                                     call: Callable) -> None:
    with pytest.raises(StorageError) as err:
        call(unreachable)
    message = str(err.value)
    assert message.startswith("checkpoint store s3://nowhere/run: could not ") and "EndpointConnectionError" in message
    assert "nothing was read or changed" in message or "nothing of this commit is visible" in message


def test_gc_on_an_unreachable_endpoint_is_a_storage_error_naming_the_store(unreachable: CheckpointStore) -> None:
    with pytest.raises(StorageError, match="checkpoint store s3://nowhere/run"):
        unreachable.gc()


# ---------------------------------------------------------------------------------------- a folder it cannot write


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder holding one committed version (x = 0..9, meta {"v": 0}) that this process cannot write to: its
    folders chmod 0o500, or, for root (whom permissions do not stop), a read-only bind mount of it."""
    src = tmp_path / "run"
    CheckpointStore(f"file://{src}").commit({"x": np.arange(10.0)}, {"v": 0})
    if os.geteuid() != 0:
        folders = [src, *(p for p in src.rglob("*") if p.is_dir())]
        for folder in folders:
            folder.chmod(0o500)
        try:
            yield src
        finally:
            for folder in folders:
                folder.chmod(0o700)
        return
    view = tmp_path / "read-only"
    view.mkdir()
    for cmd in (["mount", "--bind", str(src), str(view)], ["mount", "-o", "remount,ro,bind", str(view)]):
        made = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if made.returncode != 0:
            subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)
            pytest.skip(f"root ignores permissions, and a read-only bind mount is not allowed here ({made.stderr})")
    try:
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def test_a_folder_it_may_not_write_is_a_storage_error_and_nothing_is_written(read_only: Path) -> None:
    url = f"file://{read_only}"
    before = _files(read_only)
    store = CheckpointStore(url)
    with pytest.raises(StorageError) as err:
        store.commit({"x": np.arange(10.0) + 1}, {"v": 1})
    message = str(err.value)
    assert message.startswith(f"checkpoint store {url}: could not ") and "nothing of this commit is visible" in message
    assert "Read-only file system" in message or "Permission denied" in message, message
    assert _files(read_only) == before
    snap = CheckpointStore(url).load()  # what was there still reads, exactly
    assert snap.version == 0 and snap.meta == {"v": 0}
    assert_same_tensors(snap.tensors, {"x": np.arange(10.0)})


def test_a_new_store_under_a_folder_it_may_not_write_is_a_storage_error(read_only: Path) -> None:
    url = f"file://{read_only}/new-run"
    with pytest.raises(StorageError, match=f"checkpoint store {url}: could not "):
        CheckpointStore(url).commit({"x": np.zeros(3)}, {})
    assert not (read_only / "new-run").exists()
