"""Agent environments by name, so configuration can name one and get a clear error for an unknown one.

Like the MuJoCo tasks (`rl_core.envs.registry`): the built-ins register on import of `rl_core.envs.agent`, and an
env of your own registers when its module is imported (`rl_core.envs.import_env_module`, i.e. env_module /
--env-module). A registry entry is a factory, because every concurrent episode needs its own env object. Names
`rg:<dataset>` need no entry: they select a reasoning-gym dataset (`rl_core.envs.agent.reasoning_gym_task`); nor do
names `openenv:<url>`, a remote OpenEnv text environment (`rl_core.envs.agent.openenv_task`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from rl_core.envs.agent.contract import AgentEnv
from rl_core.envs.agent.openenv_task import OPENENV_PREFIX, OpenEnvTask, is_openenv_name, parse_openenv_name
from rl_core.envs.agent.reasoning_gym_task import RG_PREFIX, ReasoningGymTask, check_rg_name, is_rg_name

AgentEnvFactory = Callable[[], AgentEnv]
_FACTORIES: dict[str, AgentEnvFactory] = {}


def register_agent_env(factory: AgentEnvFactory, name: str) -> None:
    """Make `factory` (an env class or a function returning an env) selectable by `name`; never replaces one."""
    if is_rg_name(name) or is_openenv_name(name):
        raise ValueError(f"agent env names starting with {RG_PREFIX!r} select reasoning-gym datasets, and those "
                         f"starting with {OPENENV_PREFIX!r} OpenEnv servers; pick another name than {name!r}")
    if name in _FACTORIES and _FACTORIES[name] is not factory:
        raise ValueError(f"agent env {name!r} is already registered (by {_FACTORIES[name]!r}); pick another name")
    _FACTORIES[name] = factory


def agent_env_names() -> list[str]:
    """Registered agent env names, sorted (`rg:<dataset>` names are not listed)."""
    return sorted(_FACTORIES)


def validate_agent_env_name(name: str) -> None:
    """Raise a ValueError saying what is allowed unless `name` is a registered agent env or a usable `rg:<dataset>`
    (an ImportError for `rg:` names without reasoning-gym)."""
    if is_rg_name(name):
        check_rg_name(name)
    elif is_openenv_name(name):
        parse_openenv_name(name)
    elif name not in _FACTORIES:
        raise ValueError(f"unknown agent env {name!r}; allowed: {', '.join(agent_env_names())}, or "
                         f"{RG_PREFIX}<dataset> for a reasoning-gym dataset, {OPENENV_PREFIX}<url> for an OpenEnv "
                         "server; an env of your own needs its module "
                         "imported first (env_module / --env-module)")


def _factory(name: str) -> AgentEnvFactory:
    """What makes an env object of `name`."""
    validate_agent_env_name(name)
    if is_openenv_name(name):  # a server of gymflow's own task: the task's alphabet, turns and stop strings
        return functools.partial(OpenEnvTask, name, _FACTORIES.get(parse_openenv_name(name)[2].get("task", "")))
    return functools.partial(ReasoningGymTask, name) if is_rg_name(name) else _FACTORIES[name]


def uses_simulator(name: str) -> bool:
    """Whether agent env `name` scores actions by simulation: it then takes an `evaluator` (plans, problem seeds ->
    rewards), which a runtime may route to its simulation workers."""
    return bool(getattr(_factory(name), "uses_simulator", False))


def make_agent_env(name: str, evaluator: Callable | None = None) -> AgentEnv:
    """A new env object of the agent env called `name`; `evaluator` replaces a simulated env's own."""
    factory = _factory(name)
    if evaluator is None:
        return factory()
    if not uses_simulator(name):
        raise ValueError(f"agent env {name!r} does not simulate, so it takes no evaluator")
    return factory(evaluator=evaluator)
