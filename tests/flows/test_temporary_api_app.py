"""The temporary API answers again a request Prefect's server refused for a locked SQLite database: the client gets
the answer after milliseconds, not a 503 and its 2-16 s back-off. Other answers, and a lock that stays, reach the
client as Prefect's server gave them."""
from __future__ import annotations

import json

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from flows.tooling.temporary_api_app import RETRYABLE, RetryLocked


class FlakyApp:
    """Answers the first `locked` requests with Prefect's retryable 503, then echoes the body it read."""

    def __init__(self, locked: int, status: int = 503, body: dict | None = None, raise_after: bool = False) -> None:
        self.locked, self.status, self.body, self.raise_after = locked, status, body or RETRYABLE, raise_after
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        if len(self.bodies) <= self.locked:
            status, payload = self.status, json.dumps(self.body).encode()
        else:
            status, payload = 201, b"created:" + message["body"]
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": payload})
        if self.raise_after and status >= 500:  # as Starlette's ServerErrorMiddleware does, for the server to log
            raise RuntimeError("database is locked")


async def _post(app: RetryLocked, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://api") as client:
        return await client.post("/api/flow_runs/", content=body)


@pytest.mark.anyio
@pytest.mark.parametrize("raise_after", [False, True])
async def test_a_locked_request_is_answered_again_with_its_body(raise_after: bool) -> None:
    app = FlakyApp(locked=3, raise_after=raise_after)
    response = await _post(RetryLocked(app, waits_s=(0.001,) * 5), b'{"name": "member-3"}')
    assert response.status_code == 201 and response.content == b'created:{"name": "member-3"}'
    assert app.bodies == [b'{"name": "member-3"}'] * 4  # the same body each time


@pytest.mark.anyio
async def test_a_lock_that_stays_reaches_the_client_as_prefect_answered() -> None:
    app = FlakyApp(locked=100)
    response = await _post(RetryLocked(app, waits_s=(0.001, 0.001)), b"{}")
    assert response.status_code == 503 and response.json() == RETRYABLE
    assert len(app.bodies) == 3  # first try and one per wait


@pytest.mark.anyio
@pytest.mark.parametrize(("status", "body"), [(503, {"detail": "maintenance"}), (500, RETRYABLE), (409, {"x": 1})])
async def test_other_answers_pass_at_once(status: int, body: dict) -> None:
    app = FlakyApp(locked=1, status=status, body=body)
    response = await _post(RetryLocked(app, waits_s=(0.001,) * 3), b"{}")
    assert response.status_code == status and response.json() == body and len(app.bodies) == 1


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
