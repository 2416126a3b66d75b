"""The env service as one object: its env hosts on Ray, its sessions, and the app served on a uvicorn thread."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rl_core.runtime.loopback_server import LoopbackServer, new_token
from rl_core.runtime.serving.app import env_app
from rl_core.runtime.serving.config import ServeConfig
from rl_core.runtime.serving.host_pool import EnvHostPool
from rl_core.runtime.serving.sessions import SessionTable

if TYPE_CHECKING:
    from typing_extensions import Self


class EnvService:
    """Serves `cfg.tasks` on `cfg.host`:`cfg.port` to clients holding `token` (a new random one by default); a context
    manager that stops the server and frees every env on exit."""

    def __init__(self, cfg: ServeConfig, token: str | None = None) -> None:
        self.cfg = cfg.check()
        self.token = token or new_token()
        self.pool = EnvHostPool(cfg.workers)
        self.sessions = SessionTable(cfg, self.pool)
        self.server = LoopbackServer(env_app(self.sessions, self.token, cfg.max_body_bytes), name="env service",
                                     host=cfg.host, port=cfg.port)

    @property
    def base_url(self) -> str:
        """http://host:port, for clients that send the token as a header."""
        return f"http://{self.server.host}:{self.server.port}"

    @property
    def client_url(self) -> str:
        """The base_url an OpenEnv client takes: the token rides in it as the password of HTTP Basic auth."""
        return f"http://gymflow:{self.token}@{self.server.host}:{self.server.port}"

    def start(self) -> EnvService:
        """Start the env hosts (and Ray), then serve; returns once both are up."""
        self.pool.start()
        self.server.start()
        return self

    def stop(self) -> None:
        """Stop serving (connected clients see their connection close), then kill the hosts and their envs."""
        self.server.stop()
        self.pool.shutdown()
        self.sessions.forget_all()

    def __enter__(self) -> Self:
        return self.start()  # type: ignore[return-value]

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
