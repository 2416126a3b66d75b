"""A `RAY_ADDRESS` where nothing answers fails at once with the address named, instead of Ray's minutes of retries."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_core.runtime.local_ray import check_ray_address_answers

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_address_nothing_listens_on_is_refused_at_once_naming_it() -> None:
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"RAY_ADDRESS=127.0.0.1:{port}: nothing accepts connections at "
                                           rf"127.0.0.1:{port} .*unset RAY_ADDRESS"):
        check_ray_address_answers(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 5


def test_an_address_something_listens_on_passes() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        check_ray_address_answers(f"127.0.0.1:{server.getsockname()[1]}")  # this session keeps Ray on loopback


def test_a_loopback_ray_joined_without_the_loopback_switch_is_named() -> None:
    """Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, Ray dials the machine's address for 127.0.0.1, where a Ray that
    was started with it does not listen: the error says so (on a machine that has an address besides loopback)."""
    code = (
        "import socket\n"
        "from ray._private.services import get_node_ip_address\n"
        "from rl_core.runtime.local_ray import check_ray_address_answers\n"
        "if get_node_ip_address().startswith('127.'):\n"
        "    print('NO-OTHER-ADDRESS')\n"
        "else:\n"
        "    with socket.create_server(('127.0.0.1', 0)) as server:\n"
        "        check_ray_address_answers(f'127.0.0.1:{server.getsockname()[1]}')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    if "NO-OTHER-ADDRESS" in done.stdout:
        pytest.skip("this machine has no address besides loopback: Ray dials 127.0.0.1 either way")
    assert done.returncode != 0
    assert "unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set" in done.stderr, done.stderr[-2000:]


def test_the_command_line_fails_fast_on_an_address_nothing_listens_on(tmp_path) -> None:
    port = _closed_port()
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--iterations", "1",
                           "--store", f"file://{tmp_path}/runs"], check=False, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode != 0
    assert f"RAY_ADDRESS=127.0.0.1:{port}: nothing accepts connections" in done.stdout + done.stderr
    assert time.monotonic() - started < 120, "it failed, but only after a long wait"
