"""An env host's step lane: a MuJoCo shard's step (actions out, the step's arrays back) over a local socket between
the server and the host that holds the shard, instead of a Ray actor call.

Why: a Ray call's round trip wakes a chain of threads in the caller's and the actor's core workers, which on a small
machine is a sizeable part of a batch step; a socket between the two processes wakes one thread on each side
(figures in docs/benchmarks.md). Ray still starts, places, replaces and reaches the hosts for everything else
(open, reset, close, agent envs), and a host on another node is stepped by Ray calls as before: the lane is a Linux
abstract socket, which exists on its host's node only and leaves no file behind when the host dies.

Wire: each message is an 8-byte little-endian length, then a binary frame (`frames.py`). A connection's first message
is a "hello" frame whose data holds the host's token (a connection without it is closed unanswered); then each "step"
frame, data {"key": shard key} and an "actions" array, is answered by a "result" frame of the step's arrays or an
"error" frame, data {"type": exception class name, "message": str}.
"""
from __future__ import annotations

import asyncio
import hmac
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from rl_core.runtime.serving.frames import FrameError, decode_frame, encode_frame

MAX_MESSAGE_BYTES = 1 << 31
"""A length past this is not one of ours: the connection is closed (a 2 GiB frame is far past any shard's step)."""

Step = Callable[[str, np.ndarray], dict[str, np.ndarray]]


class LaneClosed(ConnectionError):
    """The lane's connection ended: its host died or was stopped."""


class StepLane:
    """The host's side: an abstract Unix socket, a thread accepting on it and a thread per connection, each calling
    `step(key, actions)` for the frames it reads."""

    def __init__(self, step: Step) -> None:
        self.name = f"\0gymflow-env-host-{secrets.token_hex(16)}"
        self.token = secrets.token_urlsafe(32)
        self._step = step
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.name)
        self._listener.listen()
        threading.Thread(target=self._accept, name="gymflow-step-lane", daemon=True).start()

    def _accept(self) -> None:
        while True:
            connection, _ = self._listener.accept()
            threading.Thread(target=self._serve, args=(connection,), name="gymflow-step-lane-conn",
                             daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as incoming:
            try:
                kind, data, _ = decode_frame(_read(incoming))
                if kind != "hello" or not hmac.compare_digest(str(data.get("token", "")).encode(),
                                                              self.token.encode()):
                    return
                while True:
                    _, data, arrays = decode_frame(_read(incoming))
                    try:
                        reply = encode_frame("result", {}, self._step(data["key"], arrays["actions"]))
                    except Exception as err:  # noqa: BLE001 - the caller raises it (a ValueError is the request's)
                        reply = encode_frame("error", {"type": type(err).__name__, "message": str(err)}, {})
                    connection.sendall(_message(reply))
            except (LaneClosed, FrameError, OSError):
                return


class LaneClient:
    """The server's side: one connection to a host's lane, one step at a time (a session steps a shard in turn),
    on the server's event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def connect(cls, name: str, token: str) -> LaneClient:
        try:
            reader, writer = await asyncio.open_unix_connection(name)
        except OSError as err:
            raise LaneClosed(f"the step lane cannot be reached: {err}") from None
        writer.write(_message(encode_frame("hello", {"token": token}, {})))
        return cls(reader, writer)

    async def step(self, key: str, actions: np.ndarray) -> dict[str, np.ndarray]:
        """Shard `key`'s step; the error the host's step raised (a ValueError as itself), or LaneClosed."""
        try:
            self._writer.write(_message(encode_frame("step", {"key": key}, {"actions": actions})))
            size = int.from_bytes(await self._reader.readexactly(8), "little")
            kind, data, arrays = decode_frame(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, OSError) as err:
            raise LaneClosed(f"the step lane closed ({type(err).__name__})") from None
        if kind == "error":
            raise (ValueError if data.get("type") == "ValueError" else RuntimeError)(data.get("message", ""))
        return arrays

    def close(self) -> None:
        self._writer.close()


def _message(frame: bytes) -> bytes:
    return len(frame).to_bytes(8, "little") + frame


def _read(incoming: Any) -> bytes:
    """One message's frame from a buffered reader; LaneClosed at the end of the stream or past the size limit."""
    head = incoming.read(8)
    if len(head) < 8:
        raise LaneClosed("the connection ended")
    size = int.from_bytes(head, "little")
    if size > MAX_MESSAGE_BYTES:
        raise LaneClosed(f"a message of {size} bytes is past the lane's limit")
    frame = incoming.read(size)
    if len(frame) < size:
        raise LaneClosed("the connection ended mid-message")
    return frame
