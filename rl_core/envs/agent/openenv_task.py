"""An OpenEnv text environment as an agent env: env name `openenv:<url>`, e.g.
`openenv:http://127.0.0.1:8000?task=CalcTool-v0` for a `gymflow serve-envs` server, or any OpenEnv server whose
actions and observations carry text.

Each episode opens its own session (OpenEnv's WebSocket client, `openenv-core`): `reset(seed)` resets it with that
seed and returns the observation's text, `step(text)` sends the text and returns (observation text, reward, done,
info). The session closes when the episode ends, or when the env object is dropped.

The query string configures the gymflow side; every key but these goes to the server's `reset` as is (`task=...`
picks a `serve-envs` task):
- `obs_field`, `action_field`: the observation's and the action's text field (default `text`, as `serve-envs`);
- `max_turns` (default: the task's, else 1) and `stop` (comma-separated stop strings; default: the task's, else none).
When `task` names an agent env registered here (the server runs gymflow's own code), its alphabet, turns and stop
strings are taken from it; for any other env the alphabet is unknown, so only a model with a real tokenizer
(`--model-path`) can play it.

The server's token comes from the environment variable `GYMFLOW_OPENENV_TOKEN` (sent as HTTP Basic auth, as
`serve-envs` prints it), never from the name: a run's env name is written into its configuration and logs.
A remote env has no demonstrations, so runs on it skip the SFT warm start (`--sft-steps 0`; the preflight says so).
Problems split by seed parity (`contract.split_seeds`); a `serve-envs` task also splits its problems by text.
"""
from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from rl_core.envs.agent.contract import Split, split_seeds

OPENENV_PREFIX = "openenv:"
TOKEN_VARIABLE = "GYMFLOW_OPENENV_TOKEN"
OWN_KEYS = ("obs_field", "action_field", "max_turns", "stop")
MISSING_PACKAGE = "openenv: envs need OpenEnv's client: pip install openenv-core (gymflow's dev extra has it)"


def is_openenv_name(name: str) -> bool:
    return name.startswith(OPENENV_PREFIX)


def parse_openenv_name(name: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """(the server's URL without query, gymflow's options, the server's reset options), or a ValueError saying what
    is wrong with `name`."""
    url = name.removeprefix(OPENENV_PREFIX)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise ValueError(f"agent env {name!r}: expected openenv:<http or ws URL>, e.g. "
                         "openenv:http://127.0.0.1:8000?task=CalcTool-v0")
    if parts.password or parts.username:
        raise ValueError(f"agent env {OPENENV_PREFIX}{urlunsplit(parts._replace(netloc=parts.hostname))}: leave the "
                         f"token out of the name (it would be written into the run's configuration); set "
                         f"{TOKEN_VARIABLE} instead")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    own = {key: query.pop(key) for key in OWN_KEYS if key in query}
    if "max_turns" in own and not own["max_turns"].isdigit():
        raise ValueError(f"agent env {name!r}: max_turns must be a whole number >= 1, found {own['max_turns']!r}")
    return urlunsplit(parts._replace(query="", fragment="")), own, query


def _client_url(url: str) -> str:
    """`url` with the token from the environment as its password (OpenEnv's client sends it as Basic auth)."""
    token = os.environ.get(TOKEN_VARIABLE)
    if not token:
        return url
    parts = urlsplit(url)
    netloc = f"gymflow:{token}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class OpenEnvTask:
    """One episode at a time of a remote OpenEnv text environment (see the module's docstring)."""

    def __init__(self, name: str, local: Callable[[], Any] | None = None) -> None:
        """`local`: what makes the agent env registered here under the server's `task`, if there is one."""
        self.name = name
        self._url, own, self._reset_options = parse_openenv_name(name)
        local = local() if local is not None else None
        self.alphabet: str = local.alphabet if local is not None else ""
        self.max_turns: int = int(own.get("max_turns") or (local.max_turns if local is not None else 1))
        self.stop: tuple[str, ...] = tuple(own["stop"].split(",")) if own.get("stop") else \
            (tuple(local.stop) if local is not None else ())
        self._obs_field, self._action_field = own.get("obs_field", "text"), own.get("action_field", "text")
        self._client: Any = None

    def reset(self, seed: int) -> str:
        """Reset the episode's session (opened on first use) to problem `seed`; returns its text."""
        if self._client is None:
            self._client = self._connect()
        return self._text(self._client.reset(seed=seed, **self._reset_options).observation)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Send the text; the session closes once the episode is done."""
        if self._client is None:
            raise RuntimeError(f"{self.name}: no episode is running; call reset(seed) first")
        result = self._client.step({self._action_field: action})
        observation = result.observation or {}
        info = dict(observation.get("info") or {})
        reward = float(result.reward or 0.0)
        if result.done:
            info.setdefault("correct", reward == 1.0)
            self.close()
        return self._text(observation), reward, bool(result.done), info

    def close(self) -> None:
        """Close the session (the server frees its env)."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def demonstration(self, seed: int) -> list[str]:
        raise ValueError(f"{self.name}: an OpenEnv env offers no demonstrations; run without the SFT warm start "
                         "(--sft-steps 0)")

    def problem_seeds(self, split: Split, count: int, start: int = 0) -> list[int]:
        """Seeds of `split` by parity: the server's env decides what each seed's problem is."""
        return split_seeds(split, count, start)

    def _connect(self) -> Any:
        try:
            from openenv.core import GenericEnvClient
        except ImportError:
            raise ImportError(MISSING_PACKAGE) from None
        client = GenericEnvClient(base_url=_client_url(self._url)).sync()
        client.connect()
        weakref.finalize(self, client.close)  # an episode cut short (max_turns) still frees its server env
        return client

    def _text(self, observation: dict[str, Any]) -> str:
        text = (observation or {}).get(self._obs_field)
        if not isinstance(text, str):
            raise ValueError(f"{self.name}: the observation has no text field {self._obs_field!r} (its fields: "
                             f"{sorted(observation or {})}); name it with ?obs_field=...")
        return text

