"""Agent environments by name, so configuration can name one and get a clear error for an unknown one.

Like the MuJoCo tasks (`rl_core.envs.registry`): the built-ins register on import of `rl_core.envs.agent`, and an
env of your own registers when its module is imported (`rl_core.envs.import_env_module`, i.e. env_module /
--env-module). A registry entry is a factory, because every concurrent episode needs its own env object.
"""
from __future__ import annotations

from collections.abc import Callable

from rl_core.envs.agent.contract import AgentEnv

AgentEnvFactory = Callable[[], AgentEnv]
_FACTORIES: dict[str, AgentEnvFactory] = {}


def register_agent_env(factory: AgentEnvFactory, name: str) -> None:
    """Make `factory` (an env class or a function returning an env) selectable by `name`; never replaces one."""
    if name in _FACTORIES and _FACTORIES[name] is not factory:
        raise ValueError(f"agent env {name!r} is already registered (by {_FACTORIES[name]!r}); pick another name")
    _FACTORIES[name] = factory


def agent_env_names() -> list[str]:
    """Registered agent env names, sorted."""
    return sorted(_FACTORIES)


def validate_agent_env_name(name: str) -> None:
    """Raise a ValueError saying what is allowed unless `name` is a registered agent env."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown agent env {name!r}; allowed: {', '.join(agent_env_names())}; an env of your own "
                         "needs its module imported first (env_module / --env-module)")


def uses_simulator(name: str) -> bool:
    """Whether agent env `name` scores actions by simulation: it then takes an `evaluator` (plans, problem seeds ->
    rewards), which a runtime may route to its simulation workers."""
    validate_agent_env_name(name)
    return bool(getattr(_FACTORIES[name], "uses_simulator", False))


def make_agent_env(name: str, evaluator: Callable | None = None) -> AgentEnv:
    """A new env object of the agent env called `name`; `evaluator` replaces a simulated env's own."""
    validate_agent_env_name(name)
    if evaluator is None:
        return _FACTORIES[name]()
    if not uses_simulator(name):
        raise ValueError(f"agent env {name!r} does not simulate, so it takes no evaluator")
    return _FACTORIES[name](evaluator=evaluator)
