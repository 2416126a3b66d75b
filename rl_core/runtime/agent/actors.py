"""The Ray actors of one agent run, owned by whoever runs it (a flow run, a test): the generator, the trainer group
and, for an env whose reward is a simulation, the simulation workers.

Like `ControlActors` for a control run, steps get this object from the flow; what a flow started it releases. Each
actor starts Ray (or joins it) when it is first created, with a logical CPU for every actor of the run
(`AgentRunConfig.actor_cpus`); making an env or checking a config starts nothing.
"""
from __future__ import annotations

import threading
import time

from rl_core.algos.base import algorithm_of
from rl_core.config.agent import AgentRunConfig
from rl_core.envs.agent import AgentEnv, make_agent_env, uses_simulator
from rl_core.envs.agent.programs import AgentProgram, load_agent_program
from rl_core.policies.lm_policy import model_spec, tokenizer_of
from rl_core.runtime.agent.generator_worker import GeneratorClient
from rl_core.runtime.agent.program_chunks import evaluate_programs
from rl_core.runtime.agent.program_rollout import ProgramEndpoint
from rl_core.runtime.agent.simulation_pool import SimulationPool
from rl_core.runtime.trainer_group import TrainerGroup


class AgentActors:
    """The run's generator, trainer ranks and simulation workers, each created on first use and kept."""

    def __init__(self, cfg: AgentRunConfig) -> None:
        self.cfg = cfg
        self.simulated = uses_simulator(cfg.env.name)
        self._lock = threading.Lock()
        self.generator = GeneratorClient(cfg)
        self._trainer_group: TrainerGroup | None = None
        self.simulators = SimulationPool(cfg) if self.simulated else None
        self._endpoint: ProgramEndpoint | None = None
        self.program: AgentProgram | None = load_agent_program(cfg.agent) if cfg.agent else None

    @property
    def trainer_group(self) -> TrainerGroup:
        with self._lock:
            if self._trainer_group is None:
                self._trainer_group = TrainerGroup(self.cfg)
            return self._trainer_group

    @property
    def endpoint(self) -> ProgramEndpoint:
        """The run's OpenAI-compatible endpoint in this process, started on first use (agent programs only)."""
        with self._lock:
            if self._endpoint is None:
                self._endpoint = ProgramEndpoint(self.cfg, tokenizer_of(self.cfg),
                                                 model_spec(self.cfg).max_position_embeddings,
                                                 getattr(self.make_env(), "tool_format", None))
            return self._endpoint

    @property
    def step_threads(self) -> int:
        """Envs stepped at once by a rollout: one per simulation worker, else one."""
        return self.cfg.env.num_workers if self.simulated else 1

    def make_env(self) -> AgentEnv:
        """A new env of the run, its simulations (if any) routed to the simulation workers."""
        if self.simulators is not None:
            return make_agent_env(self.cfg.env.name, evaluator=self.simulators.evaluate)
        return make_agent_env(self.cfg.env.name)

    def evaluate(self, version: int) -> dict:
        """Held-out accuracy and mean reward of `version` (one sampled episode per held-out problem), and the
        policy's sha256."""
        started = time.perf_counter()
        policy_hash = self.generator.sync(version)
        generate = lambda requests: self.generator.generate(requests, version)  # noqa: E731
        if self.program is not None:
            result = evaluate_programs(self.cfg, self, generate, version)
        else:
            result = algorithm_of(self.cfg).rollouts.evaluate(self.cfg, self.make_env, tokenizer_of(self.cfg),
                                                              generate, model_spec(self.cfg).max_position_embeddings,
                                                              version, self.step_threads)
        return {**result, "policy_sha256": policy_hash, "seconds": time.perf_counter() - started}

    def start(self) -> None:
        """Create every actor without waiting for it."""
        self.generator.start()
        self.trainer_group.start()
        if self.simulators is not None:
            self.simulators.start()

    def release(self) -> None:
        """Stop the actors (idempotent); the next use starts new ones."""
        with self._lock:
            group, self._trainer_group = self._trainer_group, None
            endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.close()
        self.generator.shutdown()
        if group:
            group.shutdown()
        if self.simulators is not None:
            self.simulators.shutdown()
