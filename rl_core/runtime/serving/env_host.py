"""An env host: the env shards of many sessions in one process, run as a Ray actor by `EnvHostPool`.

Unlike the flows' `EnvWorker` (one run's envs and policy, restored from its checkpoints), a host holds no run: its
shards come and go with sessions, so opening a session costs building its envs, not starting a process. A shard is
envs [offset, offset + count) of one session, numbered in the session's order, so a session computes the same
numbers however its envs are split over hosts (MuJoCo reset noise is drawn from (seed, env index, episode)).
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np
import ray

from rl_core.envs import make_batch
from rl_core.envs.agent import make_agent_env
from rl_core.runtime.serving.step_lane import StepLane
from rl_core.runtime.serving.tasks import TaskKind


class MujocoShard:
    """`count` envs of a MuJoCo task, stepped as one batch; ended episodes reset themselves (`BatchedMujocoEnv`)."""

    def __init__(self, task: str, count: int, seed: int, offset: int) -> None:
        self.task, self.offset = task, offset
        self.env = make_batch(task, count, seed, offset)

    def spaces(self) -> dict[str, Any]:
        """What the session checks actions against."""
        return {"obs_dim": self.env.obs_dim, "action_dim": self.env.action_dim}

    def reset(self, seed: int | None) -> dict[str, np.ndarray]:
        """First observations: of envs built anew from `seed`, or (None) of every env's next episode."""
        if seed is None:
            self.env.start_new_episodes()
        else:
            self.env = make_batch(self.task, self.env.num_envs, seed, self.offset)
        return {"obs": self.env.observe()}

    def first(self) -> dict[str, np.ndarray]:
        """The first observations of the envs as built."""
        return {"obs": self.env.observe()}

    def step(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        """One step of every env; `ended` holds shard-local indices."""
        result = self.env.step(actions)
        ended = np.flatnonzero(result.terminated | result.truncated)
        return {"obs": result.obs, "rewards": result.reward, "terminated": result.terminated,
                "truncated": result.truncated, "ended": ended, "final_obs": result.final_obs[ended],
                "episode_returns": result.finished_returns}


class AgentShard:
    """`count` agent envs, one object each; env i of the session plays problem seed + i."""

    def __init__(self, task: str, count: int, seed: int, offset: int) -> None:
        self.offset = offset
        self.envs = [make_agent_env(task) for _ in range(count)]
        self.seed = seed  # the session's: its env i plays problem seed + i

    def spaces(self) -> dict[str, Any]:
        return {"max_turns": self.envs[0].max_turns, "stop": list(self.envs[0].stop)}

    def first(self) -> dict[str, Any]:
        """The prompts of the first problems, seed + i."""
        return {"texts": [env.reset(self.seed + self.offset + i) for i, env in enumerate(self.envs)]}

    def reset(self, seed: int | None) -> dict[str, Any]:
        """Prompts of problems seed + i (None: the problems after the last reset's, seed + num_envs on)."""
        self.seed = self.seed + len(self.envs) if seed is None else seed
        return self.first()

    def step(self, texts: list[str | None]) -> dict[str, Any]:
        """Each env with a text steps; one with None (its episode over) answers "" and done."""
        out: dict[str, list] = {"texts": [], "rewards": [], "dones": [], "infos": []}
        for env, text in zip(self.envs, texts, strict=True):
            answer, reward, done, info = ("", 0.0, True, {}) if text is None else env.step(text)
            out["texts"].append(answer)
            out["rewards"].append(float(reward))
            out["dones"].append(bool(done))
            out["infos"].append(json.loads(json.dumps(info, default=str)))  # JSON-safe, whatever an env put there
        return out


class EnvHost:
    """The shards of many sessions, by key. Ray calls come one at a time (a Ray actor of max_concurrency 1); MuJoCo
    steps may also come through the host's step lane (`step_lane.py`), on its threads: a lock keeps them in turn."""

    def __init__(self) -> None:
        self.shards: dict[str, MujocoShard | AgentShard] = {}
        self._lock = threading.Lock()
        self._lane = StepLane(self.step)

    def lane(self) -> dict[str, str]:
        """Where the server reaches the step lane from this host's node: the node's id, the socket's name and the
        token a connection starts with."""
        return {"node": ray.get_runtime_context().get_node_id(), "name": self._lane.name, "token": self._lane.token}

    def open(self, key: str, task: str, kind: TaskKind, count: int, seed: int, offset: int) -> dict[str, Any]:
        """Build shard `key`; returns its spaces and first observations."""
        shard_type = MujocoShard if kind == "mujoco" else AgentShard
        shard = shard_type(task, count, seed, offset)
        with self._lock:
            self.shards[key] = shard
        return {"spaces": shard.spaces(), **shard.first()}

    def reset(self, key: str, seed: int | None) -> dict[str, Any]:
        with self._lock:
            return self.shards[key].reset(seed)

    def step(self, key: str, actions: Any) -> dict[str, Any]:
        with self._lock:
            return self.shards[key].step(actions)

    def close(self, key: str) -> None:
        """Free shard `key` (a key already gone is fine: closing is idempotent)."""
        with self._lock:
            self.shards.pop(key, None)

    def ping(self) -> dict[str, int]:
        """The host's process and how many envs it holds: for the pool's checks and the tests."""
        with self._lock:
            return {"pid": os.getpid(), "envs": sum(_count(shard) for shard in self.shards.values())}


def _count(shard: MujocoShard | AgentShard) -> int:
    return shard.env.num_envs if isinstance(shard, MujocoShard) else len(shard.envs)
