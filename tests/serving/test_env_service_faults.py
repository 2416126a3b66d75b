"""The env service under faults: a client that disconnects mid-episode has its envs freed within a second, an idle
HTTP session after idle_timeout_s; an env host killed under a live session is a clear 503 to that session (its envs
are lost, not restored), and a reset brings it new envs on the replacement host; a server stopped under connected
clients closes their connections, so their next call fails at once instead of hanging."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from openenv.core import GenericEnvClient

from rl_core.runtime.serving import BatchClient, EnvService
from rl_core.runtime.serving.client import ServedEnvError
from tests.serving.conftest import serve_config

pytestmark = pytest.mark.slow
FREED_WITHIN_S = 1.0
"""How soon a disconnected client's envs are freed: the server sees the connection end at once on loopback (a peer
that vanishes without closing is found by uvicorn's WebSocket pings, 20 s apart with a 20 s timeout)."""


@pytest.fixture
def own_service(local_ray: None) -> Iterator[EnvService]:
    """A service of the test's own, which it may break."""
    with EnvService(serve_config()) as running:
        yield running


def seconds_until_freed(service: EnvService, timeout_s: float = 10.0) -> float:
    start = time.monotonic()
    while sum(service.pool.held_envs()) or service.sessions.envs:
        assert time.monotonic() - start < timeout_s, "the envs were never freed"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_client_that_drops_its_connection_mid_episode_has_its_envs_freed(own_service: EnvService) -> None:
    async def drop() -> None:
        env = await BatchClient(own_service.base_url, own_service.token).connect()
        await env.reset(num_envs=64)
        await env.step(np.zeros((64, 6)))
        assert sum(own_service.pool.held_envs()) == 64
        env._ws.transport.abort()  # no close frame: the TCP connection just ends, as when a process is killed

    asyncio.run(drop())
    assert seconds_until_freed(own_service) < FREED_WITHIN_S
    with GenericEnvClient(base_url=own_service.client_url).sync() as env:  # and an OpenEnv client's close frees too
        env.reset(num_envs=3)
    assert seconds_until_freed(own_service) < FREED_WITHIN_S


def test_a_killed_env_host_is_a_clear_error_and_a_reset_recovers(own_service: EnvService) -> None:
    async def drill() -> str:
        async with BatchClient(own_service.base_url, own_service.token) as env:
            await env.reset(num_envs=64, seed=1)  # over both hosts (shard_envs 32)
            await env.step(np.zeros((64, 6)))
            os.kill(own_service.pool.pids()[0], signal.SIGKILL)
            with pytest.raises(ServedEnvError) as err:
                await env.step(np.zeros((64, 6)))
            assert (await env.state())["num_envs"] == 0  # the session's envs on the live host were freed too
            again = await env.reset(num_envs=64, seed=1)
            assert again["observation"]["obs"].shape == (64, 17)
            await env.step(np.zeros((64, 6)))
            assert sum(own_service.pool.held_envs()) == 64
            return f"{err.value.status} {err.value}"

    message = asyncio.run(drill())
    assert message.startswith("503") and "env host" in message and "died" in message and "reset" in message


def test_stopping_the_server_fails_connected_clients_instead_of_hanging(own_service: EnvService) -> None:
    openenv_client = GenericEnvClient(base_url=own_service.client_url, message_timeout_s=60).sync()
    openenv_client.connect()
    openenv_client.reset(num_envs=2)

    async def batch_client_sees_the_end() -> float:
        async with BatchClient(own_service.base_url, own_service.token) as env:
            await env.reset(num_envs=2)
            stopper = threading.Thread(target=own_service.stop)
            start = time.monotonic()
            stopper.start()
            with pytest.raises(Exception) as err:  # the connection closes: websockets' ConnectionClosed
                while True:
                    await env.step(np.zeros((2, 6)))
            assert "ConnectionClosed" in type(err.value).__name__
            elapsed = time.monotonic() - start
            await asyncio.to_thread(stopper.join)
            return elapsed

    assert asyncio.run(batch_client_sees_the_end()) < 10
    start = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - whichever error OpenEnv's client raises, it raises, and soon
        openenv_client.step({"actions": [[0.0] * 6] * 2})
    assert time.monotonic() - start < 10
    openenv_client.close()


def test_an_idle_http_session_is_closed_and_its_envs_freed(local_ray: None) -> None:
    with EnvService(serve_config(idle_timeout_s=1.0)) as service:
        headers = {"Authorization": f"Bearer {service.token}"}
        opened = httpx.post(service.base_url + "/reset", json={"num_envs": 8}, headers=headers).json()
        assert sum(service.pool.held_envs()) == 8
        freed_s = seconds_until_freed(service)
        assert 0.5 < freed_s < 1.0 + FREED_WITHIN_S
        answer = httpx.post(service.base_url + "/step", headers=headers,
                            json={"action": {"actions": [[0.0] * 6] * 8}, "session_id": opened["session_id"]})
        assert answer.status_code == 404 and "idle" in answer.json()["detail"]
