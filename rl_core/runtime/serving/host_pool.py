"""The env service's Ray actors: W env hosts (`EnvHost`, one CPU each) started with the server, and where each
session's envs go.

A session's envs are split in env order (`env_split`, as the flows split a run's envs over env workers) into at most
one shard per host, each of about `shard_envs` envs or fewer, on the hosts holding the fewest envs. A host that dies
is replaced at once by a new, empty one; the sessions that had envs on it get `EnvHostDied` at their next call (their
envs there are gone: gymflow does not checkpoint served envs) and may reset to get new envs on live hosts.

A MuJoCo shard on a host of the server's own node is stepped through the host's step lane (`step_lane.py`), one
connection per shard, opened at its first step; every other call is a Ray actor call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from rl_core.runtime.control.env_pool import env_split
from rl_core.runtime.local_ray import actor_options, ensure_ray
from rl_core.runtime.serving.env_host import EnvHost
from rl_core.runtime.serving.step_lane import LaneClient, LaneClosed


class EnvHostDied(RuntimeError):
    """An env host's process died; the envs it held are lost."""


@dataclass(frozen=True)
class Shard:
    """Envs [offset, offset + count) of a session, on host `host` as it was in `generation` (a replaced host is
    another generation: its shards are not this one)."""

    host: int
    generation: int
    key: str
    offset: int
    count: int


class EnvHostPool:
    """W env-host actors of one server, and the envs each holds."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._hosts: list[Any] = []
        self._generations = [0] * workers
        self._envs = [0] * workers  # envs placed on each host (its shards' counts)
        self._lane_of: list[dict[str, str] | None] = [None] * workers  # each host's lane, once asked
        self._lanes: dict[str, LaneClient] = {}  # by shard key: the connection stepping it

    def start(self) -> None:
        """Start Ray (a local one on 127.0.0.1 unless RAY_ADDRESS names a cluster) and every host; returns once
        each answers."""
        ensure_ray(self.workers)
        self._hosts = [self._new_host() for _ in range(self.workers)]
        ray.get([host.ping.remote() for host in self._hosts])

    def place(self, session: str, num_envs: int, shard_envs: int) -> list[Shard]:
        """Shards for `num_envs` envs of `session` on the least-loaded hosts (counted as held from now on)."""
        count = min(self.workers, math.ceil(num_envs / shard_envs))
        hosts = sorted(range(self.workers), key=lambda h: self._envs[h])[:count]
        shards = []
        for index, (host, (offset, envs)) in enumerate(zip(hosts, env_split(num_envs, count), strict=True)):
            self._envs[host] += envs
            shards.append(Shard(host, self._generations[host], f"{session}/{index}", offset, envs))
        return shards

    def release(self, shards: list[Shard]) -> None:
        """Stop counting `shards` (on a host replaced since, they were never the new host's) and close their lanes."""
        for shard in shards:
            if (lane := self._lanes.pop(shard.key, None)) is not None:
                lane.close()
            if shard.generation == self._generations[shard.host]:
                self._envs[shard.host] -= shard.count

    async def call(self, shard: Shard, method: str, *args: Any) -> Any:
        """`EnvHost.<method>(shard.key, *args)` on the shard's host; EnvHostDied when that host is gone."""
        if shard.generation != self._generations[shard.host]:
            raise EnvHostDied(f"env host {shard.host} died earlier; its envs are lost")
        actor = self._hosts[shard.host]
        try:
            if method == "step" and isinstance(args[0], np.ndarray) and (lane := await self._lane(shard, actor)):
                return await lane.step(shard.key, args[0])
            return await getattr(actor, method).remote(shard.key, *args)
        except (ray.exceptions.RayActorError, LaneClosed) as err:
            self._replace(shard.host, actor)
            raise EnvHostDied(f"env host {shard.host} died ({type(err).__name__}); its envs are lost") from None

    async def _lane(self, shard: Shard, actor: Any) -> LaneClient | None:
        """The connection stepping `shard`, opened now if need be; None for a host on another node."""
        if (lane := self._lanes.get(shard.key)) is not None:
            return lane
        where = self._lane_of[shard.host]
        if where is None:
            where = await actor.lane.remote()
            if self._hosts[shard.host] is actor:  # not replaced meanwhile
                self._lane_of[shard.host] = where
        if where["node"] != ray.get_runtime_context().get_node_id():
            return None
        lane = self._lanes[shard.key] = await LaneClient.connect(where["name"], where["token"])
        return lane

    def held_envs(self) -> list[int]:
        """Envs each host actually holds (asked of the hosts): for checks that freed envs are freed."""
        return [info["envs"] for info in ray.get([host.ping.remote() for host in self._hosts])]

    def pids(self) -> list[int]:
        """Each host's process id."""
        return [info["pid"] for info in ray.get([host.ping.remote() for host in self._hosts])]

    def shutdown(self) -> None:
        """Kill every host (their envs with them)."""
        for host in self._hosts:
            ray.kill(host, no_restart=True)
        self._hosts = []
        self._lanes.clear()  # their connections end with the hosts (and the server's event loop with the server)

    def _new_host(self) -> Any:
        return ray.remote(num_cpus=1)(EnvHost).options(max_concurrency=1, **actor_options()).remote()

    def _replace(self, index: int, dead: Any) -> None:
        """A new, empty host in slot `index`, unless a concurrent call replaced `dead` already."""
        if self._hosts[index] is not dead:
            return
        ray.kill(dead, no_restart=True)
        self._hosts[index] = self._new_host()
        self._generations[index] += 1
        self._envs[index] = 0
        self._lane_of[index] = None
