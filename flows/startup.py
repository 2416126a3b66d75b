"""Start-up work the command line overlaps: Prefect's temporary API and the run's Ray actors.

Run as a command with no Prefect API configured, a flow first waits for Prefect's temporary API server to
start (~6 s here), and only then starts Ray (~4 s) and the run's actors (~5 s: each imports torch and builds
its envs). None of these needs another, so the command starts the API on a thread while this thread starts
Ray and creates the actors; the flow then finds both running. A deployment run has its API already; its
flow starts Ray and the actors itself (`RunActors.start`, `AgentActors.start`). The actors are named after the run,
so the flow's own actors object finds the ones started here.
"""
from __future__ import annotations

import threading
from typing import Protocol, TypeVar

from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED


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
    if not PREFECT_API_URL.value() and PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        from prefect.server.api.server import SubprocessASGIServer

        api = threading.Thread(target=SubprocessASGIServer().start, name="prefect-api-start", daemon=True)
        api.start()
    actors.start()
    if api is not None:
        api.join()
    return actors
