"""Start-up work the command line overlaps: Prefect's temporary API and the run's Ray actors.

Run as a command with no Prefect API configured, a flow first waits for Prefect's temporary API server to
start (~6 s here), and only then starts Ray (~4 s) and the run's actors (~5 s: each imports torch and builds
its envs). None of these needs another, so the command starts the API on a thread while this thread starts
Ray and creates the actors; the flow then finds both running. A deployment run has its API already; its
flow starts Ray and the actors itself (`RunActors.start`, `AgentActors.start`). The actors are named after the run,
so the flow's own actors object finds the ones started here.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Protocol, TypeVar

from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_LOGGING_TO_API_ENABLED,
    PREFECT_SERVER_EPHEMERAL_ENABLED,
    PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED,
    PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED,
    PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED,
    temporary_settings,
)

UNREAD_RECORDS_OFF = {
    PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED: False,
    PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED: False,
    PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED: False,
    PREFECT_LOGGING_TO_API_ENABLED: False,
}
"""What a temporary API would record for nobody: its database is deleted when the command ends, it serves no UI,
and no automation can exist in it. Writing each task run's states, every event and every log line into it took
0.28 of this machine's two cores while a quick HalfCheetah run iterated (0.43 s an iteration with them, 0.39 s
without). The command prints its progress; the run's report, metrics and checkpoints are in its store."""


def uses_temporary_api() -> bool:
    """Whether a flow run here would start Prefect's temporary API (no API configured)."""
    return not PREFECT_API_URL.value() and PREFECT_SERVER_EPHEMERAL_ENABLED.value()


@contextlib.contextmanager
def lean_temporary_api() -> Iterator[None]:
    """Within: a temporary API started by this thread (or by `start_api_and_actors`) records nothing nobody can
    read (`UNREAD_RECORDS_OFF`); a configured API (a server, a deployment's) is left as it is."""
    with temporary_settings(updates=UNREAD_RECORDS_OFF) if uses_temporary_api() else contextlib.nullcontext():
        yield


class Startable(Protocol):
    """A run's actors (`RunActors`, `AgentActors`): `start` creates them without waiting."""

    def start(self) -> None: ...


A = TypeVar("A", bound=Startable)


def start_api_and_actors(actors: A) -> A:
    """Return once the API answers (if it is a temporary one) and the run's actors are created (not yet ready);
    the caller releases them when the command ends (the flow releases what it used; these may never be used).

    Ray is started on this thread: `ray.init` from another thread lost its connection to Ray's control store
    here. A temporary API that fails to start on the thread is started again, with its error, by the flow.
    """
    api = None
    if uses_temporary_api():
        from prefect.server.api.server import SubprocessASGIServer

        # in this thread's settings (`lean_temporary_api`): the server process is started with them
        api = threading.Thread(target=contextvars.copy_context().run, args=(SubprocessASGIServer().start,),
                               name="prefect-api-start", daemon=True)
        api.start()
    actors.start()
    if api is not None:
        api.join()
    return actors
