"""Start-up work the command line overlaps: Prefect's temporary API and the run's Ray actors.

Run as a command with no Prefect API configured, a flow would first start Prefect's temporary API server and wait
for it, and only then start Ray and the run's actors (each imports torch and builds its envs): two slow starts, one
after the other. None of these needs another, so the command starts the API server process first, then Ray and the
actors, then imports the flow, and waits for the API only when the flow is about to run. A deployment run has its API
already; its flow starts Ray and the actors itself (`ControlActors.start`, `AgentActors.start`). The actors are named
after the run, so the flow's own actors object finds the ones started here.

The command starts the API server process itself (`TemporaryApi`), with the command line, the environment and the
settings Prefect's own temporary server gets (`prefect.server.api.server.SubprocessASGIServer`), and hands the flow
its address as the configured API. Why not Prefect's class: importing its module imports the whole server (its
app, routers and database layer) into the command, on the critical path of a start-up that keeps a small machine's
cores busy, for a server that runs in another process (the start-up figures are in docs/benchmarks.md).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    PREFECT_LOGGING_TO_API_ENABLED,
    PREFECT_SERVER_EPHEMERAL_ENABLED,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED,
    PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED,
    PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED,
    get_current_settings,
    temporary_settings,
)

UNREAD_RECORDS_OFF = {
    PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED: False,
    PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED: False,
    PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED: False,
    PREFECT_LOGGING_TO_API_ENABLED: False,
}
"""What a temporary API would record for nobody: its database is deleted when the command ends, it serves no UI,
and no automation can exist in it. Writing each task run's states, every event and every log line into it took a
sizable share of a 2-core machine while a quick HalfCheetah run iterated, and lengthened its iterations. The command
prints its progress; the run's report, metrics and checkpoints are in its store."""

NO_HEARTBEATS = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
"""The flow run's heartbeats, for a temporary API: a server detects a crashed run by its missing heartbeats, and this
one ends with the run. Prefect's heartbeat thread sleeps in whole seconds and the run's end joins it, waiting out
the rest of its sleep: half a second of every command's end on average. Client-side only, so not among the server's
settings."""

PORTS = range(8000, 9000)
"""Where the server listens: Prefect's own range for its temporary server, outside the kernel's ephemeral ports, so
an outgoing connection does not take the port between the check that it is free and the server binding it."""
PORT_IN_USE = 3  # uvicorn's exit status when it cannot bind (Prefect's class then retries on another port too)


def uses_temporary_api() -> bool:
    """Whether a flow run here would start Prefect's temporary API (no API configured)."""
    return not PREFECT_API_URL.value() and PREFECT_SERVER_EPHEMERAL_ENABLED.value()


class TemporaryApi:
    """Prefect's API server for one command: started by `start`, ready after `wait`, stopped at exit."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen | None = None
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        """Start the server process on a free loopback port, recording nothing nobody can read
        (`UNREAD_RECORDS_OFF`); it is stopped when the command exits."""
        self.port = _free_port()
        with temporary_settings(updates=UNREAD_RECORDS_OFF):
            settings = get_current_settings().to_environment_variables(exclude_unset=True)
        app_dir = Path(importlib.util.find_spec("flows").origin).parent.parent  # type: ignore[arg-type]
        self.process = subprocess.Popen(  # Prefect's app, locked-database answers retried (temporary_api_app)
            [sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), "--factory",
             "flows.tooling.temporary_api_app:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"],
            env={**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                 "PREFECT__SERVER_FINAL": "1", **settings})

    def wait(self) -> None:
        """Return once the server answers; on another port if this one was taken meanwhile. Raises RuntimeError
        when it exits otherwise or does not answer within PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS."""
        import httpx  # Prefect's own dependency; imported here, once the flow's imports have it loaded anyway

        timeout_s = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None, "start() first"
            status = self.process.poll()
            if status == PORT_IN_USE:
                self.stop()
                self.start()
                continue
            if status is not None:
                raise RuntimeError(f"Prefect's temporary API server exited with status {status} before it answered "
                                   f"on {self.url} (its error is above); set PREFECT_API_URL to use a running "
                                   "Prefect server instead")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"Prefect's temporary API server did not answer on {self.url} within {timeout_s} s "
                           "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); a busy machine may need more, or set "
                           "PREFECT_API_URL to use a running Prefect server")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s, as Prefect's class does); idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    """A port of `PORTS` nothing listens on now (the server may still lose it: `wait` handles that)."""
    for port in random.sample(PORTS, 50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1} on 127.0.0.1 for Prefect's temporary API; "
                       "set PREFECT_API_URL to use a running Prefect server")


def start_temporary_api() -> TemporaryApi | None:
    """The command's own API server, started without waiting for it, when no API is configured; else None."""
    if not uses_temporary_api():
        return None
    api = TemporaryApi()
    api.start()
    return api


@contextlib.contextmanager
def api_for_the_run(api: TemporaryApi | None) -> Iterator[None]:
    """Within: Prefect's clients use `api`, once it answers, in the settings it was started with
    (`UNREAD_RECORDS_OFF`: no logs sent to it), without heartbeats (`NO_HEARTBEATS`) and without events
    (`no_events`); with no temporary API, the configured one as it is."""
    if api is None:
        yield
        return
    api.wait()
    with temporary_settings(updates={**UNREAD_RECORDS_OFF, **NO_HEARTBEATS, PREFECT_API_URL: api.url}), no_events():
        yield


@contextlib.contextmanager
def no_events() -> Iterator[None]:
    """Within: Prefect's clients send no events, for a temporary API that records none (`UNREAD_RECORDS_OFF`: its
    task-run recorder and event persister are off). Each task run's state changes are events, built, sent and parsed
    only for the server to drop them: without them, the flow's process and the server each spend less CPU an
    iteration, and a quick HalfCheetah flow's iterations are shorter. Prefect's own switch: an events client that sends
    nothing, which `emit_event` checks before it builds an event."""
    from prefect.events.clients import NullEventsClient
    from prefect.events.worker import EventsWorker

    EventsWorker.set_client_override(NullEventsClient)
    try:
        yield
    finally:
        EventsWorker.set_client_override(None)
