"""The env service under test: a real server on 127.0.0.1 with real env hosts on the session's local Ray, one per test
module (its hosts hold 2 of Ray's CPUs only while the module runs), shared by the tests that leave it as they found
it (the fault drills start their own)."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from rl_core.runtime.serving import EnvService, ServeConfig

TASKS = ["HalfCheetah-v5", "InvertedPendulum-v5", "Arithmetic-v0", "CalcTool-v0", "LookupCalc-v0",
         "PendulumGains-v0"]
LIMITS = {"workers": 2, "shard_envs": 32, "max_session_envs": 512, "max_envs": 1024, "max_sessions": 64,
          "max_body_bytes": 65536}
"""Small limits, so that a test reaches each of them: a session over 32 envs is split over both hosts."""


def serve_config(**overrides: object) -> ServeConfig:
    return ServeConfig(**{"tasks": TASKS, "num_envs": 1, "port": 0, **LIMITS, **overrides})


@pytest.fixture(scope="module")
def service(local_ray: None) -> Iterator[EnvService]:
    with EnvService(serve_config()) as running:
        yield running


@pytest.fixture
def http(service: EnvService) -> Iterator[httpx.Client]:
    """An HTTP client of the service holding its token; every HTTP session a test opened is closed after it."""
    with httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {service.token}"},
                      timeout=30) as client:
        yield client
        for session_id in [s.id for s in service.sessions.sessions.values() if s.over_http]:
            client.post("/close", json={"session_id": session_id})
