"""A client for the env service's binary frames: numpy actions in, numpy observations out, one session per client.
OpenEnv's own clients speak the JSON messages; this one is for batches where JSON text would cost more than the
envs' step."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from rl_core.runtime.serving.frames import decode_frame, encode_frame

if TYPE_CHECKING:
    from typing_extensions import Self

MAX_MESSAGE_BYTES = 1 << 30
"""The largest answer the client reads: a 100,000-env batch's observations are tens of MB."""


class ServedEnvError(RuntimeError):
    """The server refused a message; `status` is the HTTP status it would have answered with."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


class BatchClient:
    """A session of the service at `base_url` (http://host:port), authenticated with `token`:

        async with BatchClient(service.base_url, service.token) as env:
            first = await env.reset(num_envs=1024, seed=0)        # {"observation": {"obs": array, ...}, ...}
            result = await env.step(np.zeros((1024, env_action_dim)))
    """

    def __init__(self, base_url: str, token: str, open_timeout_s: float = 30.0) -> None:
        self.url = base_url.replace("http://", "ws://", 1).rstrip("/") + "/ws"
        self.token, self.open_timeout_s = token, open_timeout_s
        self._ws: ClientConnection | None = None

    async def connect(self) -> BatchClient:
        # No per-message deflate: compressing raw floats costs more time than the bytes it saves on a fast link.
        self._ws = await connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"},
                                 compression=None, max_size=MAX_MESSAGE_BYTES, open_timeout=self.open_timeout_s)
        return self

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        """Reset with OpenEnv's keyword arguments (seed, episode_id) and gymflow's (task, num_envs)."""
        return await self._call("reset", kwargs, {})

    async def step(self, actions: np.ndarray) -> dict[str, Any]:
        """One step of every env with (num_envs, action_dim) float actions."""
        return await self._call("step", {}, {"actions": np.asarray(actions)})

    async def state(self) -> dict[str, Any]:
        return await self._call("state", {}, {})

    async def close(self) -> None:
        """End the session (its envs are freed) and the connection."""
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    async def _call(self, kind: str, data: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        if self._ws is None:
            await self.connect()
        assert self._ws is not None
        await self._ws.send(encode_frame(kind, data, arrays))
        answer, payload, received = decode_frame(await self._ws.recv(decode=False))
        if answer == "error":
            raise ServedEnvError(payload.get("status", 500), payload.get("code", ""), payload.get("message", ""))
        if answer == "observation":
            payload["observation"] = {**payload.get("observation", {}), **received}
        return payload

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
