"""K trainer ranks on Ray actors joined in one torch.distributed group that lives across iterations.

The K train_shard tasks of an iteration succeed or fail together: the first call for an (iteration,
version) starts all K ranks and every task waits for its own rank. When any rank fails, the group is
killed (so no rank waits in a collective for a dead peer) and the next call — a retry of any one of
the tasks, even if its siblings had already completed — starts a fresh group for all K ranks, which
restore the newest checkpoint and continue from there.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile
import threading

import numpy as np
import ray

from rl_core.config.agent import AnyRunConfig
from rl_core.data.run_lease import pid_runs
from rl_core.runtime.local_ray import actor_cpus, ensure_ray, is_local_ray, wait_until_names_free
from rl_core.runtime.trainer import TrainerRank
from rl_core.runtime.warm_actors import park, start_actor

RENDEZVOUS_PREFIX = "gymflow-"
"""A local group's FileStore folder is `<tmp>/gymflow-<run>-ranks-<pid of the process that made it>-<random>`."""


def remove_orphaned_rendezvous_dirs() -> list[str]:
    """Remove the FileStore folders whose process is gone (a killed or OOM-killed run cannot remove its own); the
    folders removed. A folder of a live process, or of an unknown layout, is left alone."""
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{RENDEZVOUS_PREFIX}*-ranks-*-*")):
        pid = path.rsplit("-ranks-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not pid_runs(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class TrainerGroupBroken(RuntimeError):
    """A rank died or a collective failed; the group is rebuilt on the next use."""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TrainerGroup:
    """The run's trainer ranks; `train(k, ...)` runs rank k's share of one iteration's update."""

    def __init__(self, cfg: AnyRunConfig, master_addr: str = "127.0.0.1") -> None:
        ensure_ray(actor_cpus(cfg))
        self.cfg = cfg
        self.master_addr = master_addr
        self._ranks: list[ray.actor.ActorHandle] = []
        self._lock = threading.Lock()  # the K train_shard tasks call in from K threads at once
        self._launch: tuple[tuple[int, int], list[ray.actor.ActorHandle], list[ray.ObjectRef]] | None = None
        self._booting: list[ray.actor.ActorHandle] = []  # created by `start`, not yet joined into a group
        self._rendezvous_dir: str | None = None  # the FileStore's folder of the live group, on a local Ray

    def start(self) -> None:
        """Create the ranks without waiting: their start-up (Python, torch) then overlaps whatever the caller
        does next; the first use joins them into the group."""
        with self._lock:
            if not self._ranks and not self._booting:
                self._booting = self._create_ranks()

    def _names(self) -> list[str]:
        """Ranks are named after the run, so a group created ahead (the command line starts the actors while
        Prefect's API starts) is the one the flow's steps find."""
        return [f"gymflow-{self.cfg.run_name}-rank-{k}-of-{self.cfg.num_ranks}" for k in range(self.cfg.num_ranks)]

    def _create_ranks(self) -> list[ray.actor.ActorHandle]:
        config = self.cfg.model_dump_json()
        return [start_actor(TrainerRank, self.cfg.run_name, name, (config, k, self.cfg.num_ranks))
                for k, name in enumerate(self._names())]

    def _ensure(self) -> list[ray.actor.ActorHandle]:
        with self._lock:
            return self._ensure_locked()

    def _ensure_locked(self) -> list[ray.actor.ActorHandle]:
        """The live ranks, starting and connecting a new group if there is none (caller holds the lock)."""
        if not self._ranks:
            ranks, self._booting = self._booting or self._create_ranks(), []
            init_method = self._rendezvous()
            ray.get([r.connect.remote(init_method) for r in ranks])
            self._ranks = ranks
        return self._ranks

    def _rendezvous(self) -> str:
        """Where a new group's ranks meet. On a machine-local Ray, a FileStore: torch's TCPStore listens on every
        interface whatever host it is given, and a file opens no port (its folder, named after this process, is
        removed with the group, or by a later group once this process is gone). On a cluster, TCP at `master_addr`."""
        if is_local_ray():
            remove_orphaned_rendezvous_dirs()
            prefix = f"{RENDEZVOUS_PREFIX}{self.cfg.run_name}-ranks-{os.getpid()}-"
            self._rendezvous_dir = tempfile.mkdtemp(prefix=prefix)
            return f"file://{self._rendezvous_dir}/store"
        return f"tcp://{self.master_addr}:{_free_port(self.master_addr)}"

    def initial_state(self) -> dict[str, np.ndarray]:
        """The seeded initial learner state (from rank 0)."""
        return ray.get(self._ensure()[0].initial_state.remote())

    def warm_start(self, uri: str) -> dict[str, float]:
        """Rank 0 runs the learner's warm start (GRPO: SFT) and writes the state a new run commits as version 0."""
        return ray.get(self._ensure()[0].warm_start.remote(uri))

    def train(self, rank: int, iteration: int, version: int) -> dict:
        """Rank `rank`'s part of iteration `iteration`, from checkpoint `version`; all ranks must be called."""
        with self._lock:
            ranks = self._ensure_locked()
            if self._launch is None or self._launch[0] != (iteration, version) or self._launch[1] is not ranks:
                self._launch = ((iteration, version), ranks, [r.train.remote(iteration, version) for r in ranks])
            refs = self._launch[2]
        try:
            return ray.get(refs[rank])
        except (ray.exceptions.RayActorError, RuntimeError) as err:
            self._discard(ranks)
            raise TrainerGroupBroken(f"trainer rank {rank} of run {self.cfg.run_name} failed: {err}; "
                                     "the group is rebuilt from the last checkpoint on retry") from err

    def _discard(self, ranks: list[ray.actor.ActorHandle]) -> None:
        """Kill a failed group unless another thread already replaced it."""
        with self._lock:
            if self._ranks is ranks:
                self._kill()

    def _kill(self) -> None:
        for r in self._ranks + self._booting:
            ray.kill(r, no_restart=True)
        self._forget()
        wait_until_names_free(self._names())  # the next group must be new actors, not the dying ones

    def _forget(self) -> None:
        """No group from here on: the next use starts or takes new ranks."""
        self._ranks, self._booting = [], []
        self._launch = None
        if self._rendezvous_dir is not None:  # a FileStore file is for one group only
            shutil.rmtree(self._rendezvous_dir, ignore_errors=True)
            self._rendezvous_dir = None

    def shutdown(self) -> None:
        """Stop the ranks (the process group goes with them)."""
        with self._lock:
            self._kill()

    def release(self) -> None:
        """The run is done with its ranks: park them for the next run (`warm_actors`: a parked rank leaves its group
        when reused), or stop them."""
        with self._lock:
            if park(self._ranks + self._booting):
                self._forget()
            else:
                self._kill()
