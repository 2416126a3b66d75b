"""W env-worker Ray actors for one run, created once per process and reused across iterations.

Actors are named after the run and the pool's size, so a retried step finds the same actors. A worker
that died mid-step is dropped and the step fails with a clear error; its retry starts a replacement that
restores its envs from the last committed checkpoint. `health_check` does the same between steps without
a failed attempt, and `resize` re-splits the run's envs over another number of workers between iterations
(checkpoints hold every env's state in global env order, so any split restores from them).

Each env draws its own action noise (`rl_core.seeding.action_noise`), so a resized pool computes what the
original split does, bit for bit where the policy's forward pass gives each env's row the same bits at the new
batch size (torch's matmul here: yes at 4, 8, 32 and 64 rows; not at 1 or 2).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import ray

from rl_core.config.control import ControlRunConfig
from rl_core.runtime.control.env_worker import EnvWorker
from rl_core.runtime.local_ray import actor_cpus, ensure_ray, wait_until_names_free
from rl_core.runtime.warm_actors import park, start_actor


class EnvWorkerDied(RuntimeError):
    """An env-worker actor died mid-step; a retry replaces it and restores from the checkpoint."""


def env_split(total: int, workers: int) -> list[tuple[int, int]]:
    """(first env, count) per worker: contiguous, in env order, counts differing by at most one."""
    if not 1 <= workers <= total:
        raise ValueError(f"{workers} env workers cannot split {total} envs: use 1 to {total} workers")
    base, extra = divmod(total, workers)
    counts = [base + (w < extra) for w in range(workers)]
    return [(sum(counts[:w]), counts[w]) for w in range(workers)]


class EnvWorkerPool:
    """The run's env workers: `simulate` fans one iteration out to all of them."""

    def __init__(self, cfg: ControlRunConfig) -> None:
        ensure_ray(actor_cpus(cfg))
        self.cfg = cfg
        self.total_envs = cfg.env.num_envs
        self.num_workers = cfg.env.num_workers
        self._split = env_split(self.total_envs, self.num_workers)
        self._actors: dict[int, ray.actor.ActorHandle] = {}

    def _name(self, index: int) -> str:
        return f"gymflow-{self.cfg.run_name}-env-{index}-of-{self.num_workers}"

    def _actor(self, index: int) -> ray.actor.ActorHandle:
        if index not in self._actors:
            self._actors[index] = start_actor(EnvWorker, self.cfg.run_name, self._name(index),
                                              (self.cfg.model_dump_json(), index, self._split[index]),
                                              max_concurrency=1)
        return self._actors[index]

    def start(self) -> None:
        """Create every worker without waiting: their start-up (Python, torch, MuJoCo models) then overlaps
        whatever the caller does next instead of delaying the first step."""
        for w in range(self.num_workers):
            self._actor(w)

    def simulate(self, iteration: int, version: int) -> list[dict]:
        """One rollout per worker from checkpoint `version`; per-worker summaries in worker order."""
        refs = {w: self._actor(w).simulate.remote(iteration, version) for w in range(self.num_workers)}
        return [self._get(w, ref) for w, ref in refs.items()]

    def call_each(self, fn: Callable, *args) -> list:
        """`fn(worker, *args)` in every worker's process at once, results in worker order: for benchmarks and
        diagnostics that drive or inspect a worker's envs (`worker.env`) outside a rollout. Each call runs between
        the worker's other calls, as one of them."""
        refs = {w: self._actor(w).__ray_call__.remote(fn, *args) for w in range(self.num_workers)}
        return [self._get(w, ref) for w, ref in refs.items()]

    def evaluate(self, version: int, episodes: int) -> dict:
        """Deterministic-policy and random-policy returns of `version`, on worker 0."""
        return self._get(0, self._actor(0).evaluate.remote(version, episodes))

    def health_check(self, timeout_s: float = 300.0) -> list[int]:
        """Ping every worker (starting any not yet started); replace the dead or unresponsive ones.

        Call it between steps: a worker answers after its current call. Replacements restore their envs
        and policy from the checkpoint their next step names. Returns the indices replaced.
        """
        refs = {w: self._actor(w).ping.remote() for w in range(self.num_workers)}
        deadline = time.monotonic() + timeout_s
        replaced = []
        for w, ref in refs.items():
            try:
                ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                replaced.append(w)
        self._discard(replaced)
        for w in replaced:
            self._actor(w)
        return replaced

    def nodes(self) -> list[str]:
        """The Ray node id each worker runs on, in worker order (starting workers not yet started)."""
        return [info["node"] for info in ray.get([self._actor(w).ping.remote() for w in range(self.num_workers)])]

    def resize(self, num_workers: int, timeout_s: float = 600.0) -> float:
        """Between iterations: the same envs over `num_workers` new workers; returns seconds until all answer."""
        split = env_split(self.total_envs, num_workers)
        self.shutdown()
        self.num_workers, self._split = num_workers, split
        started = time.perf_counter()
        refs = [self._actor(w).ping.remote() for w in range(num_workers)]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if pending:
            cpus = ray.cluster_resources().get("CPU", 0)
            raise TimeoutError(f"only {len(ready)} of {num_workers} env workers of run {self.cfg.run_name} started "
                               f"within {timeout_s:.0f} s; each asks for 1 CPU and the cluster has {cpus:g}")
        ray.get(ready)  # surfaces a worker that failed to start
        return time.perf_counter() - started

    def _get(self, index: int, ref: ray.ObjectRef):
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            self._discard([index])
            raise EnvWorkerDied(f"env worker {index} of run {self.cfg.run_name} died: {err}; "
                                "a retry starts a replacement from the last checkpoint") from err

    def _discard(self, indices: list[int]) -> None:
        """Kill workers `indices` and wait until their names are free, so replacements are new actors."""
        names = [self._name(i) for i in indices if i in self._actors]
        for index in indices:
            actor = self._actors.pop(index, None)
            if actor is not None:
                ray.kill(actor, no_restart=True)
        wait_until_names_free(names)

    def shutdown(self) -> None:
        """Stop this pool's actors."""
        self._discard(list(self._actors))

    def release(self) -> None:
        """The run is done with its workers: park them for the next run (`warm_actors`), or stop them."""
        if park(list(self._actors.values())):
            self._actors = {}
        else:
            self.shutdown()
