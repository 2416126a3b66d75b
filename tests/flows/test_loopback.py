"""Every process a run starts listens on loopback only: Prefect's temporary API, Ray (GCS, raylet, workers, the
dashboard agent), the trainer group's gloo rendezvous and connections, the agent programs' OpenAI endpoint. Polls the listening sockets of the whole
process tree of a real `gymflow train` / `train-agent` command while it runs."""
from __future__ import annotations

import ipaddress
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.slow


def _listening(root: psutil.Process) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket in `root`'s tree now."""
    found = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((proc.name(), conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback  # ::ffff:127.0.0.1 is 127.0.0.1


@pytest.mark.parametrize("command", [
    ["train"], pytest.param(["train-agent"], marks=pytest.mark.chaos),
    ["train-agent", "--agent", "rl_core.envs.agent.programs:step_env"],  # the agent programs' OpenAI endpoint too
], ids=["train", "train-agent", "train-agent-programs"])
def test_a_run_opens_no_port_beyond_loopback(tmp_path, command: list[str]) -> None:
    cmd = [sys.executable, "-m", "flows.tooling.cli", *command, "--preset", "tiny", "--iterations", "3", "--store",
           f"file://{tmp_path}/runs"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    root, seen = psutil.Process(proc.pid), set()
    try:
        while proc.poll() is None:
            seen |= _listening(root)
            time.sleep(0.2)
        output = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    exposed = {s for s in seen if not _loopback(s[1])}
    assert not exposed, f"listening beyond loopback: {sorted(exposed)}"
    names = {name for name, _, _ in seen}
    assert len(seen) >= 3 and any("gcs" in n or "raylet" in n for n in names), sorted(seen)  # it did look
