"""An ASGI app served by uvicorn on a background thread, on 127.0.0.1 by default: what gymflow's servers share (the
agent programs' OpenAI endpoint, the env service). Kept free of torch and Ray, so a server starts without them."""
from __future__ import annotations

import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING

import uvicorn
from starlette.types import ASGIApp

if TYPE_CHECKING:
    from typing_extensions import Self


def new_token() -> str:
    """A random token for a server's clients (checked in constant time by the apps)."""
    return secrets.token_urlsafe(32)


class LoopbackServer:
    """Serves `app` with uvicorn on a background thread, on 127.0.0.1 and a free port unless told otherwise; a context
    manager that stops it on exit. `name` says which server it is, in its thread's name and its errors."""

    def __init__(self, app: ASGIApp, *, name: str, host: str = "127.0.0.1", port: int = 0,
                 start_timeout: float = 10.0) -> None:
        self.app, self.name, self.host, self.start_timeout = app, name, host, start_timeout
        self._socket = socket.create_server((host, port))
        # Accepted connections inherit TCP_NODELAY (Linux). asyncio sets it only on sockets made with proto
        # IPPROTO_TCP, which create_server's are not: without it a reply's second write waits on the client's
        # delayed ACK, and every request-reply exchange takes tens of milliseconds.
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port: int = self._socket.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                     timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name=f"{name}-{self.port}", daemon=True)

    def start(self) -> Self:
        """Start serving; returns once uvicorn accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} on {self.host}:{self.port} did not start within "
                                   f"{self.start_timeout} s; see uvicorn's log above")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread (in-flight requests get uvicorn's graceful shutdown)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
