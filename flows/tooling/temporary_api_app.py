"""The app of a command's temporary Prefect API: Prefect's own, which answers a request that SQLite refused for a
lock again, after a short wait, instead of handing the client a 503.

Why: SQLite lets one writer at a time, and a transaction that read before another connection committed fails at once
with "database is locked" (its busy timeout does not apply to that case). Prefect's server answers those with a 503
without Retry-After, and its client backs off 2, 4, 8, 16 s. Sweep members creating their runs together then began up
to 30 s apart, one after another (docs/benchmarks.md). Answered again here, the request waits tens of milliseconds.

Only the 503 of Prefect's handler for retryable errors is retried. The failed transaction was rolled back, so the
request is repeated as Prefect's client would repeat it. After `RETRY_WAITS_S` the 503 goes to the client as before.
Responses are buffered until their status is known. The API's HTTP answers are small JSON. WebSockets and lifespan
pass through untouched. Starlette sends an error's answer and then raises the error again for the server to log: a
retried one is not logged (Prefect's server filters those from its log too), any other is, as uvicorn would.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("uvicorn.error")

RETRY_WAITS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""Waits before each new attempt: about 3 s in all, against the client's 2 + 4 + 8 + 16 s."""
RETRYABLE = {"exception_message": "Service Unavailable"}
"""The body of Prefect's 503 for an error a client may retry (`custom_internal_exception_handler`)."""


class RetryLocked:
    """ASGI middleware: an HTTP request answered with Prefect's retryable 503 is answered again after each wait."""

    def __init__(self, app: ASGIApp, waits_s: Sequence[float] = RETRY_WAITS_S) -> None:
        self.app, self.waits_s = app, tuple(waits_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await _whole_body(receive)
        for wait_s in (*self.waits_s, None):
            fresh = {**scope, "state": dict(scope.get("state", {}))}  # the app writes into its scope: never reused
            answer = await self._attempt(fresh, body, receive)
            if wait_s is None or not _retryable(answer):
                break
            await asyncio.sleep(wait_s)
        for message in answer:
            await send(message)

    async def _attempt(self, scope: Scope, body: bytes, receive: Receive) -> list[Message]:
        """The app's answer to the request, held back: its messages."""
        answer: list[Message] = []
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # afterwards the app may only wait for the client to go

        async def hold(message: Message) -> None:
            answer.append(message)

        try:
            await self.app(scope, replay, hold)
        except Exception:
            # Starlette's ServerErrorMiddleware sends the handler's answer (Prefect's 503 here), then raises the error
            # again for the server to log. A whole answer stands, as it would have at the server.
            if not _whole(answer):
                raise
            if not _retryable(answer):
                log.exception("Exception in ASGI application")  # what uvicorn would have logged
        return answer


async def _whole_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: the app sees an empty request
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _whole(answer: list[Message]) -> bool:
    """Whether the held messages are a whole answer: a start, and a last body."""
    return bool(answer) and answer[0]["type"] == "http.response.start" and any(
        m["type"] == "http.response.body" and not m.get("more_body", False) for m in answer)


def _retryable(answer: list[Message]) -> bool:
    start = next((m for m in answer if m["type"] == "http.response.start"), None)
    if start is None or start["status"] != 503:
        return False
    body = b"".join(m.get("body", b"") for m in answer if m["type"] == "http.response.body")
    try:
        return json.loads(body) == RETRYABLE
    except ValueError:
        return False


def create_app() -> Any:
    """The temporary API's app (`uvicorn --factory`)."""
    from prefect.server.api.server import create_app as prefect_app

    return RetryLocked(prefect_app())
