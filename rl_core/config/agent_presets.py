"""Presets and `build_agent_config`: from launch options (flat, as a person gives them) to a validated AgentRunConfig.

Values come in layers, later ones winning: the models' defaults, the size preset (`AGENT_PRESETS`), then the launch
options given (`rl_core.config.launch_options.agent_launch_options`).
"""
from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from rl_core.config.agent import AgentEnvConfig, AgentRunConfig
from rl_core.config.control import ConfigError, format_validation_error
from rl_core.config.control_presets import default_run_name
from rl_core.config.launch_options import agent_launch_options, nest_options

AGENT_PRESETS: dict[str, dict[str, Any]] = {
    # CalcTool-v0 on a 2-core machine: SFT (~1 min), then GRPO lifts held-out accuracy by tens of points (README).
    "quick": {"iterations": 40},
    # The nightly run: 5x longer, same shapes.
    "full": {"iterations": 200},
    # Seconds: for tests and smoke runs; does not learn. Two update epochs, saved after each, so fault drills can
    # resume mid-update; two rollout chunks, so they can resume mid-rollout.
    "tiny": {"iterations": 2, "eval_problems": 8, "rollout_groups_per_write": 2,
             "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
             "sft": {"steps": 10, "batch_size": 16},
             "storage": {"epoch_checkpoint_min_s": 0.0},
             "algorithm": {"prompts_per_iteration": 4, "group_size": 4, "update_epochs": 2}},
}


def build_agent_config(preset: str = "quick", **options: Any) -> AgentRunConfig:
    """The agent run's configuration from a size preset and launch options (None: not given)."""
    if preset not in AGENT_PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; allowed: {', '.join(AGENT_PRESETS)}")
    table = agent_launch_options()
    try:
        given = nest_options(options, table)
    except TypeError as err:
        raise ConfigError(str(err)) from None
    layered = copy.deepcopy(AGENT_PRESETS[preset])
    for key, value in given.items():
        if isinstance(value, dict) and key in AgentRunConfig.SECTIONS:  # a section: merged into the preset's
            layered.setdefault(key, {}).update(value)
        else:
            layered[key] = value
    env = layered.get("env", {}).get("name", AgentEnvConfig.model_fields["name"].default)
    layered.setdefault("run_name", default_run_name(env, preset, layered.get("seed", 0)))
    try:
        return AgentRunConfig(**layered)
    except ValidationError as err:
        flags = {".".join(o.path): o.name for o in table.values() if o.path}
        raise ConfigError(format_validation_error(err, "invalid agent run configuration:", flags)) from None
    except ValueError as err:  # an env module that does not import, raised before any field validates
        raise ConfigError(f"invalid agent run configuration: {err}") from None
