"""The env service's configuration: data, checked once where the service starts (`ServeConfig.check` needs the task
registries, so it is a preflight, not a validator)."""
from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rl_core.config.common import ConfigError


class ServeConfig(BaseModel):
    """What `gymflow serve-envs` serves and the limits it keeps."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tasks: list[str] = Field(min_length=1, description="Tasks a session may ask for (MuJoCo tasks or agent envs); "
                             "the first is the default.")
    num_envs: int = Field(1, ge=1, description="Envs of a session whose reset names no num_envs; 1 speaks "
                          "OpenEnv's single-env shapes.")
    host: str = Field("127.0.0.1", description="Interface to listen on: loopback unless told otherwise.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    workers: int = Field(default_factory=lambda: len(os.sched_getaffinity(0)), ge=1,
                         description="Ray env-host actors (one CPU each); default: one per core.")
    shard_envs: int = Field(512, ge=1, description="A session larger than this is split over several env hosts, "
                            "in shards of at most about this many envs (never more shards than hosts).")
    max_session_envs: int = Field(65536, ge=1, description="The most envs one session may hold.")
    max_envs: int = Field(131072, ge=1, description="The most envs all sessions together may hold (~180 KiB of "
                          "memory each for a MuJoCo task).")
    max_sessions: int = Field(1024, ge=1, description="The most sessions open at once.")
    idle_timeout_s: float = Field(300.0, gt=0, description="A session that sends nothing for this long is closed "
                                  "and its envs freed (HTTP sessions have no connection whose end would say so).")
    max_body_bytes: int = Field(64 << 20, ge=1024, description="A larger HTTP body is refused (413) before it is "
                                "parsed; WebSocket messages stop at uvicorn's 16 MiB.")

    @model_validator(mode="after")
    def _sizes_agree(self) -> ServeConfig:
        if self.num_envs > self.max_session_envs:
            raise ValueError(f"num_envs {self.num_envs} exceeds max_session_envs {self.max_session_envs}")
        if self.max_session_envs > self.max_envs:
            raise ValueError(f"max_session_envs {self.max_session_envs} exceeds max_envs {self.max_envs}")
        return self

    def check(self) -> ServeConfig:
        """Raise ConfigError naming each task that is neither a registered MuJoCo task nor an agent env."""
        from rl_core.runtime.serving.tasks import task_kind

        unknown = []
        for name in self.tasks:
            try:
                task_kind(name)
            except ValueError as err:
                unknown.append(str(err))
        if unknown:
            raise ConfigError("; ".join(unknown))
        return self
