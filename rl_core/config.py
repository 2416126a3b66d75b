"""Run configuration: validated once at the edge (flow start, CLI), plain typed values inside.

Presets are named sets of overrides; anything a preset sets can still be overridden explicitly. PPO values
come in layers, later ones winning: `PPOConfig`'s defaults, the task's preset file (`presets/<env>.yaml`),
the size preset's `ppo` values, then explicit `ppo=` overrides.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rl_core.envs.gym_backend import PREFIX as GYM_PREFIX
from rl_core.envs.randomization import DynamicsRandomization
from rl_core.envs.registry import import_env_module, validate_env_name

STORE_SCHEMES = ("file", "memory", "s3")


class PPOConfig(BaseModel):
    """PPO hyper-parameters (Schulman et al., 2017; defaults follow the 37-details study where not noted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(3e-4, gt=0, description="Adam step size at iteration 0.")
    anneal_lr: bool = Field(True, description="Decay the step size linearly to 0 over the run's iterations.")
    gamma: float = Field(0.99, gt=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE bias/variance trade-off.")
    update_epochs: int = Field(10, ge=1, description="Passes over each rollout.")
    minibatch_size: int = Field(512, ge=1, description="Samples per gradient step, summed over all ranks.")
    clip_coef: float = Field(0.2, gt=0, description="Policy ratio clip range.")
    clip_vloss: bool = Field(False, description="Clip the value update like the policy ratio.")
    ent_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    vf_coef: float = Field(0.5, ge=0, description="Value loss weight.")
    max_grad_norm: float = Field(0.5, gt=0, description="Global gradient-norm clip.")
    target_kl: Optional[float] = Field(None, gt=0, description="Stop the epochs early past this approx. KL.")
    norm_adv: bool = Field(True, description="Normalize advantages per minibatch.")
    hidden: tuple[int, ...] = Field((64, 64), description="Hidden layer widths of actor and critic.")
    log_std_init: float = Field(0.0, description="Initial log standard deviation of the Gaussian policy.")
    scale_rewards: bool = Field(True, description="Divide rewards by the running std of discounted returns.")


class RunConfig(BaseModel):
    """Everything that defines one training run; two runs with equal configs produce equal weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_name: str = Field(description="Names the run's folder in the store; the same name continues the run.")
    env_module: Optional[str] = Field(
        None, description="Python module imported first (here and in every worker) to register your own tasks.")
    env: str = Field("HalfCheetah-v5", description="Registered task name, or gym:<gymnasium id> (slower backend).")
    randomization: Optional[DynamicsRandomization] = Field(
        None, description="Per-env mass, friction and damping ranges (native tasks only); None: the MJCF's values.")
    seed: int = Field(0, ge=0)
    iterations: int = Field(ge=1, description="Training iterations (simulate, score, train, checkpoint).")
    store: str = Field("file://./runs", description="fsspec URL under which the run's folder lives.")
    num_workers: int = Field(2, ge=1, description="Ray env-worker actors.")
    envs_per_worker: int = Field(32, ge=1, description="MuJoCo envs batched in each worker.")
    rollout_steps: int = Field(128, ge=1, description="Steps per env per iteration.")
    num_ranks: int = Field(2, ge=1, description="torch.distributed ranks of the trainer group (train shards).")
    overlap: bool = Field(
        False, description="Collect iteration i+1 while iteration i trains, acting with the policy from before "
        "iteration i's update (one update stale; the update then clips against its own starting weights and weights "
        "samples by proximal/behaviour probability: decoupled PPO). Keeps env workers and trainer busy at once; "
        "changes the math, so it is part of what a run is and a continued run keeps it.")
    full_every: int = Field(8, ge=1, description="A full checkpoint every N versions, deltas in between.")
    eval_episodes: int = Field(5, ge=1, description="Deterministic episodes in the final evaluation.")
    epoch_checkpoint_every: int = Field(
        1, ge=0, description="Save training progress every N PPO epochs inside an iteration, so a retried "
        "train_shard resumes mid-update (0: only the per-iteration versions).")
    epoch_checkpoint_min_s: float = Field(
        10.0, ge=0, description="...but no sooner than this many seconds into the update or after the last such "
        "save: an update shorter than a save is worth (the quick preset's take about a second, a save 50 ms) is "
        "simply redone on retry (0: save at every `epoch_checkpoint_every` epochs).")
    collective_timeout_s: float = Field(
        120.0, gt=0, description="How long a rank waits in a collective before the group is declared broken.")
    ppo: PPOConfig = PPOConfig()

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value):
            raise ValueError("use letters, digits, '.', '_' or '-' (starting with a letter or digit), at most 100")
        return value

    @field_validator("env_module")
    @classmethod
    def _env_module(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            import_env_module(value)  # registers its tasks; fields validate in order, so `env` can name them
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: str) -> str:
        validate_env_name(value)
        return value

    @model_validator(mode="after")
    def _randomization_needs_native_task(self) -> "RunConfig":
        if self.randomization is not None and self.env.startswith(GYM_PREFIX):
            raise ValueError(f"randomization applies to native tasks only, not to the gymnasium backend {self.env}")
        return self

    @field_validator("store")
    @classmethod
    def _store(cls, value: str) -> str:
        scheme, _, path = value.rpartition("://")
        scheme = scheme or "file"
        if scheme not in STORE_SCHEMES:
            raise ValueError(f"unknown store scheme {scheme!r} in {value!r}; allowed: {', '.join(STORE_SCHEMES)}")
        if scheme == "file":  # absolute, so Ray workers (other working directories) see the same folder
            return "file://" + os.path.abspath(os.path.expanduser(path))
        return value

    @model_validator(mode="after")
    def _batch_divides(self) -> "RunConfig":
        batch = self.batch_size
        mb = self.ppo.minibatch_size
        if batch % mb:
            raise ValueError(f"ppo.minibatch_size {mb} must divide the batch {batch} (workers*envs*steps)")
        if mb % self.num_ranks:
            raise ValueError(f"num_ranks {self.num_ranks} must divide ppo.minibatch_size {mb}")
        return self

    @property
    def batch_size(self) -> int:
        """Env steps collected per iteration."""
        return self.num_workers * self.envs_per_worker * self.rollout_steps

    @property
    def run_url(self) -> str:
        """fsspec URL of this run's folder."""
        return f"{self.store.rstrip('/')}/{self.run_name}"


PRESETS: dict[str, dict[str, Any]] = {
    # Learns HalfCheetah on a 2-core machine in a few minutes (see README for measured figures).
    "quick": {"iterations": 100},
    # The nightly run: 6x longer, same shapes.
    "full": {"iterations": 600},
    # Seconds: for tests and smoke runs; does not learn. Saves update progress at every epoch, so fault drills
    # can resume mid-update.
    "tiny": {"iterations": 2, "envs_per_worker": 4, "rollout_steps": 16, "eval_episodes": 1,
             "epoch_checkpoint_min_s": 0.0, "ppo": {"minibatch_size": 32, "update_epochs": 2}},
}


# Per-task PPO hyper-parameters: one `<task name>.yaml` per task, keys = PPOConfig fields (shipped as package data).
PRESET_DIR = Path(__file__).with_name("presets")


class ConfigError(ValueError):
    """Invalid run configuration; the message names each bad field and what it allows."""


def task_ppo_preset(env: str, preset_dir: Path | None = None) -> dict[str, Any]:
    """The validated PPO values of `env`'s preset file (`<preset_dir>/<env>.yaml`); {} for a task without one."""
    files = {p.stem: p for p in Path(preset_dir or PRESET_DIR).glob("*.yaml")}  # by listing: no path from `env`
    path = files.get(env) if isinstance(env, str) else None
    if path is None:
        return {}
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of PPOConfig fields, found {type(values).__name__}")
    unknown = sorted(str(k) for k in values if k not in PPOConfig.model_fields)
    if unknown:
        raise ConfigError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"a task preset holds PPOConfig fields only: {', '.join(PPOConfig.model_fields)}")
    try:
        checked = PPOConfig.model_validate(values)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, f"{path}: invalid PPO preset:")) from None
    return {k: getattr(checked, k) for k in values}


def build_config(preset: str = "quick", **overrides: Any) -> RunConfig:
    """Preset values, then explicit overrides (None means 'not given'), validated together.

    PPO values: PPOConfig defaults < the task's preset file < the size preset's `ppo` < explicit `ppo=`.
    """
    if preset not in PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    values: dict[str, Any] = {k: v for k, v in PRESETS[preset].items() if k != "ppo"}
    explicit_ppo = overrides.pop("ppo", None) or {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    env = values.get("env", RunConfig.model_fields["env"].default)
    values["ppo"] = {**task_ppo_preset(env), **PRESETS[preset].get("ppo", {}), **explicit_ppo}
    try:
        return RunConfig(**values)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def format_validation_error(err: ValidationError, title: str = "invalid run configuration:") -> str:
    """One line per bad field: `field: message (got value)`."""
    lines = [title]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "config"
        lines.append(f"  {field}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)
