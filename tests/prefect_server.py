"""A real `prefect server start` on a free loopback port, and the `prefect` CLI against it: what the deployment and
browser tests share. Every command is the real CLI, run from the repository root as an operator would."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prefect_server(root: Path) -> Iterator[dict]:
    """A server with its own PREFECT_HOME and results under `root`; yields the environment that reaches it
    (PREFECT_API_URL, a 2 s worker poll). Stopped, with its whole process group, on exit."""
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(root / "results"),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", None)
    start_server(env)
    try:
        yield env
    finally:
        stop_server(env)


def start_server(env: dict) -> subprocess.Popen:
    """`prefect server start` at env's PREFECT_API_URL, its database under env's PREFECT_HOME; returns once healthy."""
    port = urllib.parse.urlsplit(env["PREFECT_API_URL"]).port
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                os.killpg(server.pid, signal.SIGKILL)
                raise AssertionError("prefect server did not start") from None
            time.sleep(0.5)
    env["GYMFLOW_TEST_SERVER_PID"] = str(server.pid)
    _SERVERS[server.pid] = server
    return server


def stop_server(env: dict) -> None:
    """Stop the server `start_server` started for env (its whole process group), if it still runs."""
    server = _SERVERS.pop(int(env.pop("GYMFLOW_TEST_SERVER_PID", 0)), None)
    if server is None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


_SERVERS: dict[int, subprocess.Popen] = {}


def prefect(args: list[str], env: dict, timeout: float = 120) -> str:
    """`prefect ARGS` from the repository root; its stdout, or a failed assertion showing its output."""
    done = subprocess.run([PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def run_deployment(name: str, params: dict[str, object], env: dict) -> str:
    """`prefect deployment run NAME --param k=v ...`; the new flow run's id."""
    args = ["deployment", "run", name]
    for key, value in params.items():
        args += ["--param", f"{key}={value}"]
    return re.search(r"UUID:\s*([0-9a-f-]{36})", prefect(args, env)).group(1)


def flow_run_state(flow_run_id: str, env: dict) -> str:
    return json.loads(prefect(["flow-run", "inspect", flow_run_id, "--output", "json"], env))["state"]["type"]


def api_post(env: dict, path: str, body: dict) -> object:
    """POST `body` to the server's REST API (`path` under /api) and return the decoded answer."""
    request = urllib.request.Request(f"{env['PREFECT_API_URL']}/{path.lstrip('/')}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    return api_call(request)


def api_call(request: urllib.request.Request | str, attempts: int = 6) -> object:
    """The decoded answer to `request`, retrying a 503 as Prefect's own client does: the server answers 503 to a
    write that met SQLite's lock (here, 1 of 20 runs created in a row on a pool with a concurrency limit)."""
    for attempt in range(attempts - 1):
        try:
            return _answer(request)
        except urllib.error.HTTPError as err:
            if err.code != 503:
                raise
        time.sleep(0.5 * 2 ** attempt)
    return _answer(request)


def _answer(request: urllib.request.Request | str) -> object:
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)
