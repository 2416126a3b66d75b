"""sft_warm_start: the supervised warm start of a new agent run, on trainer rank 0, staged for version 0."""
from __future__ import annotations

from prefect import task

from rl_core.config.agent import AgentRunConfig
from rl_core.data import RunLayout
from rl_core.runtime.agent.actors import AgentActors
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="sft_warm_start", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def sft_warm_start(cfg: AgentRunConfig, actors: AgentActors, incarnation: str) -> dict:
    """SFT on the env's demonstrations; the staged learner's URI and the SFT metrics (first and last loss)."""
    uri = RunLayout(cfg.run_url).warm_start
    return {"staged": uri, **actors.trainer_group.warm_start(uri)}
