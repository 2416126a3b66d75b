"""The preflight: the checks of a run's configuration that need the world, asked once per process by the edges that
start a run (the command line, a flow's `start_run`, `evaluate`, `train_in_process`) and never by the actors.

The config models (`rl_core.config`) check values only. What they cannot know is asked here: the user's env module
imports, the env is registered, and the algorithm's own `check` (GRPO: the model's files and tokenizer, prompts that
fit its context, an importable vLLM). Errors name the field and its launch option as the models' errors do.
"""
from __future__ import annotations

from rl_core.algos.base import algorithm_of
from rl_core.config.agent import AgentRunConfig, AnyRunConfig
from rl_core.config.common import ConfigError, FieldProblem, format_validation_error
from rl_core.config.launch_options import agent_launch_options, launch_options
from rl_core.envs.agent import validate_agent_env_name
from rl_core.envs.registry import import_env_module, validate_env_name

_CHECKED: set[str] = set()
"""Configs (as JSON) this process has checked: a second edge in the same process (the CLI, then its flow) is free."""


def preflight(cfg: AnyRunConfig) -> AnyRunConfig:
    """`cfg` once the world accepts it, else a ConfigError naming each refused field (and its `--flag`)."""
    key = cfg.model_dump_json()
    if key in _CHECKED:
        return cfg
    agent = isinstance(cfg, AgentRunConfig)
    try:
        _check_env(cfg, agent)
        check = algorithm_of(cfg).check
        if check is not None:
            check(cfg)
    except FieldProblem as problem:
        table = agent_launch_options() if agent else launch_options()
        flags = {".".join(o.path): o.name for o in table.values() if o.path}
        title = "invalid agent run configuration:" if agent else "invalid run configuration:"
        raise ConfigError(format_validation_error(problem, title, flags)) from None
    _CHECKED.add(key)
    return cfg


def _check_env(cfg: AnyRunConfig, agent: bool) -> None:
    """The env module imports (registering its envs), then the env's name is registered."""
    if cfg.env.module is not None:
        try:
            import_env_module(cfg.env.module)
        except ValueError as err:
            raise FieldProblem("env.module", str(err), cfg.env.module) from None
    try:
        (validate_agent_env_name if agent else validate_env_name)(cfg.env.name)
    except (ValueError, ImportError) as err:  # an rg: env without the tasks extra says what to install
        raise FieldProblem("env.name", str(err), cfg.env.name) from None
