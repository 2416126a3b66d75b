"""gymflow's env service: its tasks served over OpenEnv's HTTP/WebSocket protocol, one session = a batch of envs.

`EnvService(ServeConfig(tasks=["HalfCheetah-v5"], num_envs=64)).start()` (or `gymflow serve-envs`) serves on
127.0.0.1; an OpenEnv client connects to `service.client_url` (the per-server token rides in it as the URL's
password) and calls `reset(num_envs=..., seed=...)`, `step(action)`, `state()`. A session of one env speaks OpenEnv's
scalar shapes; a session of N envs steps all N in one message, auto-resetting ended episodes; `BatchClient` speaks
the compact binary frames (`frames`) for large batches. Envs live on Ray env-host actors (`EnvHostPool`), a large
session split over several. docs/guides/env-service.md is the guide.
"""
from rl_core.runtime.serving.client import BatchClient
from rl_core.runtime.serving.config import ServeConfig
from rl_core.runtime.serving.service import EnvService

__all__ = ["BatchClient", "EnvService", "ServeConfig"]
