"""The servers' shared uvicorn thread: loopback by default, and replies not held back by Nagle's algorithm (a
request-reply exchange on a socket without TCP_NODELAY waits on the peer's delayed ACK, tens of milliseconds)."""
from __future__ import annotations

import socket

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from rl_core.runtime.loopback_server import LoopbackServer


async def _hello(request) -> JSONResponse:
    return JSONResponse({"hello": request.client.host})


def test_it_listens_on_loopback_with_tcp_nodelay_for_every_connection() -> None:
    with LoopbackServer(Starlette(routes=[Route("/", _hello)]), name="test server") as server:
        assert server.host == "127.0.0.1" and server._socket.getsockname()[0] == "127.0.0.1"
        # accepted connections inherit the listening socket's TCP_NODELAY on Linux; asyncio sets it only for
        # sockets created with proto IPPROTO_TCP, which socket.create_server's are not
        assert server._socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert httpx.get(f"http://127.0.0.1:{server.port}/").json() == {"hello": "127.0.0.1"}
