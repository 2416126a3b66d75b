"""W env-worker Ray actors for one run, created once per process and reused across iterations.

Actors are named after the run so a retried step finds the same actors. A worker that died is
dropped, the step fails with a clear error, and its retry starts a replacement that restores its
envs from the last committed checkpoint.
"""
from __future__ import annotations

import ray

from rl_core.config import RunConfig
from rl_core.runtime.env_worker import EnvWorker
from rl_core.runtime.faults import gymflow_env_vars
from rl_core.runtime.local_ray import ensure_ray


class EnvWorkerDied(RuntimeError):
    """An env-worker actor died mid-step; a retry replaces it and restores from the checkpoint."""


class EnvWorkerPool:
    """The run's env workers: `simulate` fans one iteration out to all of them."""

    def __init__(self, cfg: RunConfig) -> None:
        ensure_ray(cfg.num_workers + cfg.num_ranks)
        self.cfg = cfg
        self._actors: dict[int, ray.actor.ActorHandle] = {}

    def _actor(self, index: int) -> ray.actor.ActorHandle:
        if index not in self._actors:
            remote = ray.remote(num_cpus=1)(EnvWorker).options(
                name=f"gymflow-{self.cfg.run_name}-env-{index}", get_if_exists=True, max_concurrency=1,
                runtime_env={"env_vars": gymflow_env_vars()},
            )
            self._actors[index] = remote.remote(self.cfg.model_dump_json(), index)
        return self._actors[index]

    def simulate(self, iteration: int, version: int) -> list[dict]:
        """One rollout per worker from checkpoint `version`; per-worker summaries in worker order."""
        refs = {w: self._actor(w).simulate.remote(iteration, version) for w in range(self.cfg.num_workers)}
        return [self._get(w, ref) for w, ref in refs.items()]

    def evaluate(self, version: int, episodes: int) -> dict:
        """Deterministic-policy and random-policy returns of `version`, on worker 0."""
        return self._get(0, self._actor(0).evaluate.remote(version, episodes))

    def _get(self, index: int, ref: ray.ObjectRef):
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            dead = self._actors.pop(index, None)
            if dead is not None:
                ray.kill(dead, no_restart=True)
            raise EnvWorkerDied(f"env worker {index} of run {self.cfg.run_name} died: {err}; "
                                "a retry starts a replacement from the last checkpoint") from err

    def shutdown(self) -> None:
        """Stop this pool's actors."""
        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        self._actors.clear()
