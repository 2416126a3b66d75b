"""Ray env workers for agent envs whose reward is a simulation (PendulumGains-v0): the plans an agent writes are
scored by the batched MuJoCo envs of `rl_core.envs`, on workers, not in the process that runs the episodes.

Such an env takes an `evaluator` (plans, problem seeds -> rewards) and keeps it as `.evaluator`; a worker calls the
env's own default evaluator, and the driver's envs get `SimulationPool.evaluate`, which hands each call to the next
worker. Episodes step their envs on `num_workers` threads at a time (`agent_rollout.run_agent_episodes`), so that many
simulations run at once.
"""
from __future__ import annotations

import itertools
import threading

import ray

from rl_core.config.agent import AgentRunConfig, parse_run_config
from rl_core.config.threads import ENV_WORKER_THREADS
from rl_core.envs.agent import make_agent_env
from rl_core.envs.registry import import_env_module
from rl_core.runtime.local_ray import actor_cpus, actor_options, ensure_ray, wait_until_names_free


class SimulationWorkerDied(RuntimeError):
    """A simulation worker died mid-call; a retry of the step replaces it."""


class SimulationWorker:
    """Scores plans with the agent env's own evaluator (its batched MuJoCo envs)."""

    def __init__(self, config_json: str) -> None:
        import torch

        torch.set_num_threads(ENV_WORKER_THREADS)
        self.cfg = parse_run_config(config_json)
        import_env_module(self.cfg.env.module)  # the run's own envs, registered in this process too
        self.evaluator = make_agent_env(self.cfg.env.name).evaluator

    def ping(self) -> bool:
        return True

    def evaluate(self, plans: list, seeds: list[int]) -> list[float]:
        return self.evaluator(plans, seeds)


class SimulationPool:
    """The run's simulation workers, named after the run; `evaluate` has the signature of an env's evaluator."""

    def __init__(self, cfg: AgentRunConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._actors: dict[int, ray.actor.ActorHandle] = {}
        self._turn = itertools.count()

    def _name(self, index: int) -> str:
        return f"gymflow-{self.cfg.run_name}-sim-{index}-of-{self.cfg.env.num_workers}"

    def _actor(self, index: int) -> ray.actor.ActorHandle:
        with self._lock:
            if index not in self._actors:
                ensure_ray(actor_cpus(self.cfg))
                remote = ray.remote(num_cpus=1)(SimulationWorker).options(
                    name=self._name(index), get_if_exists=True, **actor_options())
                self._actors[index] = remote.remote(self.cfg.model_dump_json())
            return self._actors[index]

    def start(self) -> None:
        for index in range(self.cfg.env.num_workers):
            self._actor(index)

    def evaluate(self, plans: list, seeds: list[int]) -> list[float]:
        """Rewards of `plans` on their problems, simulated by the next worker in turn."""
        index = next(self._turn) % self.cfg.env.num_workers
        actor = self._actor(index)
        try:
            return ray.get(actor.evaluate.remote(plans, seeds))
        except ray.exceptions.RayActorError as err:
            self._discard([index])
            raise SimulationWorkerDied(f"simulation worker {index} of run {self.cfg.run_name} died: {err}; a retry "
                                       "starts a replacement") from err

    def _discard(self, indices: list[int]) -> None:
        with self._lock:
            actors = {i: self._actors.pop(i) for i in indices if i in self._actors}
        for actor in actors.values():
            ray.kill(actor, no_restart=True)
        wait_until_names_free([self._name(i) for i in actors])

    def shutdown(self) -> None:
        self._discard(list(self._actors))
