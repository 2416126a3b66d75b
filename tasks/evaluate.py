"""evaluate: a committed version judged apart from training: a control run's deterministic-policy episodes next to a
uniform-random policy, an agent run's held-out accuracy and mean reward."""
from __future__ import annotations

from prefect import task

from rl_core.config.agent import AnyRunConfig
from rl_core.runtime.agent.actors import AgentActors
from rl_core.runtime.control.actors import ControlActors
from tasks.caching import STEP_OPTIONS, step_cache_key


@task(name="evaluate", cache_key_fn=step_cache_key, **STEP_OPTIONS)
def evaluate(cfg: AnyRunConfig, actors: ControlActors | AgentActors, incarnation: str, version: int) -> dict:
    """The evaluation of `version` the run's actors make, with the policy's sha256."""
    return actors.evaluate(version)
