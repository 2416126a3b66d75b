"""A pytest plugin for `make vllm-cpu` (`-p tests.vllm_temp_leftovers`): its suite fails when it leaves in the temp
dir what vLLM and gymflow's vLLM backend make there.

The suite's generators run in the pytest process and in a Ray actor, in the temp dir every process on the machine
shares, so the check lists only those names, new since the session started: `gymflow-vllm-*` folders, vLLM's
FileStore files `vllm_dist_*` and its ZMQ IPC sockets (named by a uuid4). Where vLLM does not import it checks nothing.
"""
from __future__ import annotations

import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

IPC_SOCKET = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def vllm_leftovers(folder: Path) -> set[str]:
    """The names in `folder` of the kinds vLLM and gymflow's vLLM backend make."""
    found = set()
    for entry in folder.iterdir():
        try:
            socket = stat.S_ISSOCK(entry.lstat().st_mode)
        except FileNotFoundError:  # removed meanwhile, by whoever made it
            continue
        if entry.name.startswith(("gymflow-vllm-", "vllm_dist_")) or (socket and IPC_SOCKET.fullmatch(entry.name)):
            found.add(entry.name)
    return found


@pytest.fixture(scope="session", autouse=True)
def no_vllm_leftovers_in_the_temp_dir() -> Iterator[None]:
    """Set up before, torn down after every other session fixture: the generators are closed and Ray is stopped."""
    from rl_core.generation.vllm_generator import vllm_available

    if vllm_available():
        yield
        return
    folder = Path(tempfile.gettempdir())
    before = vllm_leftovers(folder)
    yield
    left = sorted(vllm_leftovers(folder) - before)
    assert not left, f"the vLLM suite left {left} in {folder}"
