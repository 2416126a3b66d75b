"""Sessions of the env service: each holds a batch of envs of one task on the env hosts, and checks every request
against what it holds before any host sees it.

A session starts empty; its first reset places its envs (`EnvHostPool.place`), a reset naming another task or size
replaces them, a reset with a seed rebuilds them, and a plain reset starts every env's next episode. A session
addresses only its own shards (keys carry its unguessable id), so no request can reach another session's envs.
Refusals are `ServeError`s with an HTTP status: 404 unknown session, 409 out of order (step before reset, after an
episode's end), 422 a bad value (shape, NaN, unknown task), 429 over the server's limits, 503 a host died.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import numpy as np
from pydantic import ValidationError

from rl_core.runtime.serving.config import ServeConfig
from rl_core.runtime.serving.host_pool import EnvHostDied, EnvHostPool, Shard
from rl_core.runtime.serving.messages import ResetRequest, SessionState, action_model
from rl_core.runtime.serving.tasks import TaskKind, task_kind

Reply = tuple[dict[str, Any], float | None, bool]
"""(observation fields, reward, done): OpenEnv's serialized observation; field values may be numpy arrays."""


class ServeError(Exception):
    """A refused request: HTTP `status`, and a message saying what was expected, what was found, what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def validation_message(err: ValidationError) -> str:
    """A pydantic error as one line naming each bad field."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors(include_url=False))


class EnvSession:
    """One client's envs; its methods run one at a time (`lock`), on the server's event loop."""

    def __init__(self, session_id: str, table: SessionTable, over_http: bool) -> None:
        self.id, self.table, self.over_http = session_id, table, over_http
        self.lock = asyncio.Lock()
        self.task: str | None = None
        self.kind: TaskKind = "mujoco"
        self.num_envs = 0
        self.shards: list[Shard] = []
        self.spaces: dict[str, Any] = {}
        self.done = np.zeros(0, dtype=bool)  # per env, for sessions whose episodes end (one MuJoCo env, agent envs)
        self.step_count = 0
        self.episode_id: str | None = None
        self.closed = False
        self.last_active = time.monotonic()

    async def reset(self, data: dict[str, Any]) -> Reply:
        """Reset as `data` (a `ResetRequest`) asks: place, rebuild or restart the session's envs."""
        self._check_open()
        try:
            request = ResetRequest.model_validate(data)
        except ValidationError as err:
            raise ServeError(422, f"reset: {validation_message(err)}") from None
        cfg = self.table.cfg
        task = request.task or self.task or cfg.tasks[0]
        if task not in cfg.tasks:
            raise ServeError(422, f"reset: task {task!r} is not served here; this server serves "
                                  f"{', '.join(cfg.tasks)} (gymflow serve-envs --task NAME adds one)")
        num_envs = request.num_envs or self.num_envs or cfg.num_envs
        if num_envs > cfg.max_session_envs:
            raise ServeError(422, f"reset: num_envs {num_envs} exceeds this server's max_session_envs "
                                  f"{cfg.max_session_envs}; open several sessions")
        seed = request.seed
        if task != self.task or num_envs != self.num_envs:
            first = await self._place(task, num_envs, seed or 0)
        else:
            first = await self._on_shards("reset", [seed] * len(self.shards))
        self.done[:] = False
        self.step_count, self.episode_id = 0, request.episode_id
        return self._first_observation(first)

    async def step(self, data: dict[str, Any] | None, actions: np.ndarray | None = None) -> Reply:
        """One step of every env: `data` is the action (JSON), or `actions` the binary frame's (num_envs, dim)."""
        self._check_open()
        if not self.shards:
            raise ServeError(409, "step before reset: this session holds no envs yet; reset first")
        if self.kind == "mujoco":
            batch = self._numeric_actions(data, actions)
            if self.num_envs == 1 and self.done[0]:
                raise ServeError(409, f"step after the episode's end (step {self.step_count}): reset to start the "
                                      "next episode")
            result = await self._on_shards("step", [batch[s.offset:s.offset + s.count] for s in self.shards])
        else:
            texts = self._text_actions(data, actions)
            result = await self._on_shards("step", [texts[s.offset:s.offset + s.count] for s in self.shards])
        self.step_count += 1
        return self._step_observation(result)

    def state(self) -> dict[str, Any]:
        """OpenEnv's state of the session."""
        return SessionState(episode_id=self.episode_id, step_count=self.step_count, task=self.task,
                            num_envs=self.num_envs, envs_done=int(self.done.sum())).model_dump()

    async def close(self) -> None:
        """Free the session's envs (idempotent); a request that waited for the session finds it closed."""
        self.closed = True
        await self._drop_shards()

    def _check_open(self) -> None:
        if self.closed:
            raise ServeError(404, f"session {self.id!r} was closed while this request waited for it")

    async def _place(self, task: str, num_envs: int, seed: int) -> dict[str, Any]:
        """Replace the session's envs by `num_envs` new envs of `task`."""
        self.table.reserve(num_envs, releasing=sum(s.count for s in self.shards))  # a 429 leaves the old envs be
        await self._drop_shards()
        kind = task_kind(task)
        shards = self.table.pool.place(self.id, num_envs, self.table.cfg.shard_envs)
        self.shards, self.task, self.kind, self.num_envs = shards, task, kind, num_envs
        self.done = np.zeros(num_envs, dtype=bool)
        try:
            opened = await self._on_shards("open", [(task, kind, s.count, seed, s.offset) for s in shards],
                                           spread=True)
        except BaseException:
            await self._drop_shards()  # no half-built batch: the session is empty again
            raise
        self.spaces = opened.pop("spaces")
        return opened

    async def _drop_shards(self) -> None:
        shards, self.shards = self.shards, []
        if not shards:
            return
        self.table.pool.release(shards)
        self.table.unreserve(sum(s.count for s in shards))
        self.task, self.num_envs = None, 0
        await asyncio.gather(*(self.table.pool.call(s, "close") for s in shards), return_exceptions=True)

    async def _on_shards(self, method: str, args: list[Any], spread: bool = False) -> dict[str, Any]:
        """`method` on every shard at once (`args[i]` for shard i, spread as arguments with `spread`); their
        results merged in env order. A dead host costs the session all its envs (the rest would be a partial
        batch): they are freed, and a reset places new ones."""
        calls = [self.table.pool.call(s, method, *(a if spread else (a,))) for s, a in zip(self.shards, args,
                                                                                             strict=True)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if any(isinstance(r, EnvHostDied) for r in failed):
            await self._drop_shards()
            died = next(r for r in failed if isinstance(r, EnvHostDied))
            raise ServeError(503, f"{died}: this session's envs are freed; reset to get new envs on a live host")
        if failed:
            if isinstance(failed[0], ValueError):  # an env refusing an action (raised in the host, sent back)
                raise ServeError(422, f"{method}: the env refused it: {failed[0]}")
            raise failed[0]
        return _merge(results, self.shards)

    def _numeric_actions(self, data: dict[str, Any] | None, actions: np.ndarray | None) -> np.ndarray:
        """(num_envs, action_dim) float64 actions, finite, of the session's shape."""
        dim, n = self.spaces["action_dim"], self.num_envs
        expected = f"({dim},) floats" if n == 1 else f"({n}, {dim}) floats"
        if actions is None:
            model = action_model(self.kind, n)
            try:
                action = model.model_validate(data)
            except ValidationError as err:
                raise ServeError(422, f"step: {validation_message(err)}; a {self.task} session of {n} env(s) "
                                      f"steps {model.__name__} with {expected}") from None
            rows = [action.action] if n == 1 else action.actions  # type: ignore[attr-defined]
            try:
                actions = np.asarray(rows, dtype=np.float64)
            except ValueError:
                raise ServeError(422, f"step: actions must be {expected}; found ragged rows") from None
        elif actions.dtype.kind != "f":
            raise ServeError(422, f"step: the actions array must be float32 or float64, found {actions.dtype}")
        if n == 1 and actions.ndim == 1:
            actions = actions[None]
        if actions.shape != (n, dim):
            found = actions.shape[1:] if n == 1 and actions.shape[:1] == (1,) else actions.shape
            raise ServeError(422, f"step: a {self.task} session of {n} env(s) takes {expected}; found shape "
                                  f"{tuple(found)}")
        if not np.isfinite(actions).all():
            bad = np.argwhere(~np.isfinite(actions))[0].tolist()
            raise ServeError(422, f"step: actions must be finite; found {actions[tuple(bad)]} at {bad}")
        return actions

    def _text_actions(self, data: dict[str, Any] | None, actions: np.ndarray | None) -> list[str | None]:
        """One text per env, None exactly for envs whose episode has ended."""
        model = action_model(self.kind, self.num_envs)
        if actions is not None:
            raise ServeError(422, f"step: {self.task} steps text ({model.__name__} as JSON), not a binary frame")
        try:
            action = model.model_validate(data)
        except ValidationError as err:
            raise ServeError(422, f"step: {validation_message(err)}; a {self.task} session of {self.num_envs} "
                                  f"env(s) steps {model.__name__}") from None
        if self.num_envs == 1:
            if self.done[0]:
                raise ServeError(409, f"step after the episode's end (step {self.step_count}): reset to start the "
                                      "next episode")
            return [action.text]  # type: ignore[attr-defined]
        texts = action.texts  # type: ignore[attr-defined]
        if len(texts) != self.num_envs:
            raise ServeError(422, f"step: texts must hold {self.num_envs} entries, one per env; found {len(texts)}")
        ended = [i for i, text in enumerate(texts) if text is not None and self.done[i]]
        if ended:
            raise ServeError(409, f"step: envs {ended[:8]} have ended their episodes; send null for them, or reset")
        running = [i for i, text in enumerate(texts) if text is None and not self.done[i]]
        if running:
            raise ServeError(422, f"step: envs {running[:8]} are mid-episode; send their text (null is for envs "
                                  "whose episode has ended)")
        return texts

    def _first_observation(self, first: dict[str, Any]) -> Reply:
        if self.kind == "mujoco":
            obs = first["obs"]
            if self.num_envs == 1:
                return {"obs": obs[0]}, 0.0, False
            n = self.num_envs
            return ({"obs": obs, "rewards": np.zeros(n), "terminated": np.zeros(n, bool),
                     "truncated": np.zeros(n, bool), "ended": np.zeros(0, np.int64),
                     "final_obs": np.zeros((0, obs.shape[1])), "episode_returns": np.zeros(0)}, None, False)
        texts = first["texts"]
        if self.num_envs == 1:
            return {"text": texts[0], "info": {}}, 0.0, False
        n = self.num_envs
        return {"texts": texts, "rewards": [0.0] * n, "dones": [False] * n, "infos": [{}] * n}, None, False

    def _step_observation(self, result: dict[str, Any]) -> Reply:
        if self.kind == "mujoco":
            if self.num_envs > 1:
                return result, None, False
            ended = bool(result["ended"].size)
            self.done[0] = ended
            obs = result["final_obs"][0] if ended else result["obs"][0]
            return ({"obs": obs, "terminated": bool(result["terminated"][0]),
                     "truncated": bool(result["truncated"][0])}, float(result["rewards"][0]), ended)
        self.done |= np.array(result["dones"], dtype=bool)
        if self.num_envs > 1:
            return result, None, bool(self.done.all())
        return {"text": result["texts"][0], "info": result["infos"][0]}, result["rewards"][0], bool(self.done[0])


def _merge(results: list[dict[str, Any]], shards: list[Shard]) -> dict[str, Any]:
    """The shards' results as one batch's: arrays and lists concatenated, `ended` indices made session-wide,
    `spaces` taken from the first."""
    if len(results) == 1:
        return results[0]
    merged: dict[str, Any] = {}
    for name, first in results[0].items():
        if name == "spaces":
            merged[name] = first
        elif name == "ended":
            merged[name] = np.concatenate([r[name] + s.offset for r, s in zip(results, shards, strict=True)])
        elif isinstance(first, np.ndarray):
            merged[name] = np.concatenate([r[name] for r in results])
        else:
            merged[name] = [item for r in results for item in r[name]]
    return merged


class SessionTable:
    """The server's sessions by id, and the envs they hold together."""

    def __init__(self, cfg: ServeConfig, pool: EnvHostPool) -> None:
        self.cfg, self.pool = cfg, pool
        self.sessions: dict[str, EnvSession] = {}
        self.envs = 0
        self._reaper: asyncio.Task | None = None

    def open(self, over_http: bool) -> EnvSession:
        """A new, empty session, or 429 when the server holds `max_sessions`."""
        if len(self.sessions) >= self.cfg.max_sessions:
            raise ServeError(429, f"this server holds its limit of {self.cfg.max_sessions} sessions; close one "
                                  "(or wait for idle ones to be closed) and retry")
        session = EnvSession(secrets.token_urlsafe(16), self, over_http)
        self.sessions[session.id] = session
        if over_http and self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())
        return session

    def get(self, session_id: str) -> EnvSession:
        """The open HTTP session `session_id`, or 404 (a WebSocket's session is its connection's alone)."""
        session = self.sessions.get(session_id)
        if session is None or not session.over_http:
            raise ServeError(404, f"session {session_id!r} is not open: it was never opened over HTTP, was closed, "
                                  f"or was idle for {self.cfg.idle_timeout_s:g} s; POST /reset opens a new one")
        session.last_active = time.monotonic()
        return session

    async def close(self, session: EnvSession) -> None:
        """Forget `session` and free its envs once its request in flight, if any, is answered."""
        self.sessions.pop(session.id, None)
        async with session.lock:
            await session.close()

    def forget_all(self) -> None:
        """Drop every session without asking the hosts (for a server whose hosts are gone with it)."""
        self.sessions.clear()
        self.envs = 0

    def reserve(self, num_envs: int, releasing: int = 0) -> None:
        """Count `num_envs` more envs (a session about to free `releasing` of its own), or 429 past `max_envs`."""
        if self.envs - releasing + num_envs > self.cfg.max_envs:
            raise ServeError(429, f"{num_envs} more envs would exceed this server's max_envs {self.cfg.max_envs} "
                                  f"({self.envs} held); ask for fewer or close other sessions")
        self.envs += num_envs

    def unreserve(self, num_envs: int) -> None:
        self.envs -= num_envs

    async def _reap_idle(self) -> None:
        """Close HTTP sessions idle for `idle_timeout_s`, checking a few times per timeout."""
        while True:
            await asyncio.sleep(min(self.cfg.idle_timeout_s / 4, 5.0))
            cutoff = time.monotonic() - self.cfg.idle_timeout_s
            for session in [s for s in self.sessions.values() if s.over_http and s.last_active < cutoff]:
                if not session.lock.locked():  # a session answering a request is not idle
                    await self.close(session)
