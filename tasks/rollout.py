"""rollout: every prompt group of an iteration played by the agent, token-exact, chunk by chunk into the store."""
from __future__ import annotations

from prefect import get_run_logger, task

from rl_core.config.agent import AgentRunConfig
from rl_core.runtime.agent.actors import AgentActors
from rl_core.runtime.agent.rollouts import rollout_iteration
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="rollout", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def rollout(cfg: AgentRunConfig, actors: AgentActors, incarnation: str, iteration: int, version: int) -> dict:
    """Trajectory URIs and rollout metrics of `iteration`, sampled from checkpoint `version`; a retry keeps the
    chunks an earlier attempt wrote."""
    result = rollout_iteration(cfg, actors, iteration, version)
    if result["chunks_resumed"]:
        get_run_logger().info("rollout of iteration %d kept %d chunk(s) an earlier attempt wrote", iteration,
                              result["chunks_resumed"])
    return result
