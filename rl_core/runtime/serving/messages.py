"""The env service's typed messages, in OpenEnv's shapes: an action is an `Action` (a `metadata` dict plus its
fields), an observation an `Observation{done, reward, metadata}` plus its fields; on the wire an observation travels
as OpenEnv serializes it, `{"observation": <its fields>, "reward": ..., "done": ...}`.

Which model a session takes depends on its task's kind and size: one MuJoCo env steps `VectorAction`, N of them
`BatchVectorAction` (all N in one message); one agent env steps `TextAction`, N of them `BatchTextAction`. A batch
session's top-level reward is None (the per-env rewards are fields); its `done` is True only when no env can step on
(agent envs, which end; MuJoCo envs reset themselves when an episode ends, so a MuJoCo batch is never done).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rl_core.config.common import MAX_SEED
from rl_core.runtime.serving.tasks import TaskKind

MAX_TEXT_CHARS = 65536
"""The longest text action; an agent env's answer is a few lines."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ResetRequest(_Message):
    """A reset: OpenEnv's seed and episode_id, gymflow's session shape (task, num_envs), and, over HTTP, the
    session to reset (none: open a new one)."""

    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Seeds the envs anew (MuJoCo: reset noise of env "
                             "i's episode e from (seed, i, e); agent env i: problem seed + i); None: next episodes.")
    episode_id: str | None = Field(None, max_length=255, description="A name for the episode, echoed by state.")
    task: str | None = Field(None, max_length=200, description="One of the server's tasks (default: the session's, "
                             "else the server's first).")
    num_envs: int | None = Field(None, ge=1, description="Envs in the session (default: the session's, else the "
                                "server's num_envs).")
    session_id: str | None = Field(None, max_length=64, description="HTTP only: the session to reset.")


class StepRequest(_Message):
    """An HTTP step, as OpenEnv posts it, naming its session."""

    action: dict[str, Any]
    session_id: str = Field(max_length=64)
    timeout_s: float | None = Field(None, gt=0, description="Accepted for OpenEnv's sake; steps are not cut short.")
    request_id: str | None = Field(None, max_length=255)


class SessionRequest(_Message):
    """An HTTP request that names only its session (close)."""

    session_id: str = Field(max_length=64)


class Action(_Message):
    """OpenEnv's action base."""

    metadata: dict[str, Any] = Field(default_factory=dict)


class VectorAction(Action):
    """One MuJoCo env's action, (action_dim,) floats (clipped to the task's range)."""

    action: list[float]


class BatchVectorAction(Action):
    """N MuJoCo envs' actions, (num_envs, action_dim) floats."""

    actions: list[list[float]]


class TextAction(Action):
    """One agent env's action: the text the agent wrote."""

    text: str = Field(max_length=MAX_TEXT_CHARS)


class BatchTextAction(Action):
    """N agent envs' actions; null for an env whose episode has ended (reset to start new ones)."""

    texts: list[str | None]


class Observation(_Message):
    """OpenEnv's observation base."""

    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class VectorObservation(Observation):
    """One MuJoCo env: its observation; done = terminated or truncated (then reset before stepping on)."""

    obs: list[float]
    terminated: bool = False
    truncated: bool = False


class BatchVectorObservation(Observation):
    """N MuJoCo envs. An env whose episode ended in this step is listed in `ended` with its last observation
    (`final_obs`, same order) and return (`episode_returns`); its `obs` row is already its next episode's first."""

    obs: list[list[float]]
    rewards: list[float]
    terminated: list[bool]
    truncated: list[bool]
    ended: list[int] = Field(default_factory=list)
    final_obs: list[list[float]] = Field(default_factory=list)
    episode_returns: list[float] = Field(default_factory=list)


class TextObservation(Observation):
    """One agent env: the prompt (after a reset) or the env's answer, and what its info says."""

    text: str
    info: dict[str, Any] = Field(default_factory=dict)


class BatchTextObservation(Observation):
    """N agent envs; an env whose episode has ended answers "" with done True."""

    texts: list[str]
    rewards: list[float]
    dones: list[bool]
    infos: list[dict[str, Any]]


class SessionState(_Message):
    """OpenEnv's state (episode_id, step_count) plus the session's shape."""

    episode_id: str | None = None
    step_count: int = 0
    task: str | None = None
    num_envs: int = 0
    envs_done: int = 0


def action_model(kind: TaskKind, num_envs: int) -> type[Action]:
    """The action a session of `num_envs` envs of a `kind` task steps."""
    if kind == "mujoco":
        return VectorAction if num_envs == 1 else BatchVectorAction
    return TextAction if num_envs == 1 else BatchTextAction


def observation_model(kind: TaskKind, num_envs: int) -> type[Observation]:
    """The observation such a session answers with."""
    if kind == "mujoco":
        return VectorObservation if num_envs == 1 else BatchVectorObservation
    return TextObservation if num_envs == 1 else BatchTextObservation
