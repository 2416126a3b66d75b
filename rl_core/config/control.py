"""A control run's configuration: one pydantic model per section, data only, validated once at the edge.

Its validators check values, never the world: whether the env is registered (after its module is imported) is the
preflight's question (`rl_core.algos.preflight`), asked once by the edges that start a run.

A run is `ControlRunConfig`: its own fields (name, seed, iterations, ranks...) plus three sections, `env` (what is
simulated and how it is split over workers), `storage` (where checkpoints go and how often) and `algorithm`
(chosen by its `name`, each algorithm with its own fields and preset files). Inside, plain typed values.

Presets (`rl_core/config/presets.py`) are named sets of overrides; the flat launch options a flow and the
command line take are derived from these models (`rl_core/config/launch_options.py`), so a field is declared once, here.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Optional

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from rl_core.config.common import (
    MAX_SEED,
    AlgorithmConfig,
    RunName,
    StorageConfig,
    algorithm_config_class,
    option,
    register_algorithm_config,
)
from rl_core.config.randomization import DynamicsRandomization

GYM_PREFIX = "gym:"
"""An env name with this prefix names a gymnasium env (`gym:Pendulum-v1`), run by the slower gymnasium backend."""


@register_algorithm_config
class PPOConfig(AlgorithmConfig):
    """PPO hyper-parameters (Schulman et al., 2017; defaults follow the 37-details study where not noted)."""

    name: str = Field("ppo", pattern="^ppo$", json_schema_extra=option("algorithm"))
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
    hidden: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        (64, 64), description="Hidden layer widths of actor and critic (at least one layer, each >= 1).")
    log_std_init: float = Field(0.0, description="Initial log standard deviation of the Gaussian policy.")
    scale_rewards: bool = Field(True, description="Divide rewards by the running std of discounted returns.")

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("the actor and critic need at least one hidden layer, e.g. (64, 64)")
        return value


class EnvConfig(BaseModel):
    """What is simulated and how the envs are split over Ray env workers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    module: Optional[str] = Field(
        None, description="Python module imported first (here and in every worker) to register your own tasks.",
        json_schema_extra=option("env_module"))
    name: str = Field("HalfCheetah-v5", description="Registered task name, or gym:<gymnasium id> (slower backend).",
                      json_schema_extra=option("env"))
    randomization: Optional[DynamicsRandomization] = Field(
        None, description="Per-env mass, friction and damping ranges (native tasks only); None: the MJCF's values.")
    num_workers: int = Field(2, ge=1, description="Ray env-worker actors (a continued run may change it and "
                             "envs_per_worker, keeping their product: its env count).")
    envs_per_worker: int = Field(32, ge=1, description="MuJoCo envs batched in each worker.")
    rollout_steps: int = Field(128, ge=1, description="Steps per env per iteration.")

    @model_validator(mode="after")
    def _randomization_needs_native_task(self) -> "EnvConfig":
        if self.randomization is not None and self.name.startswith(GYM_PREFIX):
            raise ValueError(f"randomization applies to native tasks only, not to the gymnasium backend {self.name}")
        return self

    @property
    def num_envs(self) -> int:
        return self.num_workers * self.envs_per_worker


class ControlRunConfig(BaseModel):
    """Everything that defines one training run; two runs with equal configs produce equal weights."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    SECTIONS: ClassVar[tuple[str, ...]] = ("env", "storage", "algorithm")

    run_name: RunName = Field(description="Names the run's folder in the store; the same name continues the run.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seeds everything: equal seeds give bit-identical weights on "
                      "CPU.")
    iterations: int = Field(ge=1, description="Total training iterations of the run (a continued run trains up "
                            "to this many).")
    num_ranks: int = Field(2, ge=1, description="torch.distributed ranks of the trainer group (train shards).")
    overlap: bool = Field(
        False, description="Collect iteration i+1 while iteration i trains, acting with the policy from before "
        "iteration i's update (one update stale; the update then clips against its own starting weights and weights "
        "samples by proximal/behaviour probability: decoupled PPO). Keeps env workers and trainer busy at once; "
        "changes the math, so it is part of what a run is and a continued run keeps it.")
    eval_episodes: int = Field(5, ge=1, description="Deterministic episodes in the final evaluation.")
    eval_video: bool = Field(False, description="After the final evaluation, render one of its episodes to an MP4 "
                             "in the run's folder (<run>/videos/; needs EGL or OSMesa, which training does not).")
    collective_timeout_s: float = Field(
        120.0, gt=0, description="How long a rank waits in a collective before the group is declared broken.")
    env: EnvConfig = EnvConfig()
    storage: StorageConfig = Field(default_factory=StorageConfig)  # per config: ./runs resolved at that moment
    algorithm: SerializeAsAny[AlgorithmConfig] = PPOConfig()

    @model_validator(mode="before")
    @classmethod
    def _from_flat_layout(cls, data: Any) -> Any:
        """Configs stored before the sections existed (run.json, checkpoint meta) read as they meant."""
        return migrate_flat_config(data) if isinstance(data, dict) else data

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return algorithm_config_class(value.get("name", "ppo")).model_validate(value)
        return value

    @model_validator(mode="after")
    def _batch_divides(self) -> "ControlRunConfig":
        mb = getattr(self.algorithm, "minibatch_size", None)
        if mb is None:
            return self
        if self.batch_size % mb:
            raise ValueError(f"algorithm.minibatch_size {mb} must divide the batch {self.batch_size} "
                             "(workers*envs*steps)")
        if mb % self.num_ranks:
            raise ValueError(f"num_ranks {self.num_ranks} must divide algorithm.minibatch_size {mb}")
        return self

    @property
    def batch_size(self) -> int:
        """Env steps collected per iteration."""
        return self.env.num_envs * self.env.rollout_steps

    @property
    def run_url(self) -> str:
        """fsspec URL of this run's folder."""
        return f"{self.storage.url.rstrip('/')}/{self.run_name}"


# Where each field of the flat layout (configs written before the sections existed) lives now.
_FLAT_FIELDS = {
    "env_module": ("env", "module"), "env": ("env", "name"), "randomization": ("env", "randomization"),
    "num_workers": ("env", "num_workers"), "envs_per_worker": ("env", "envs_per_worker"),
    "rollout_steps": ("env", "rollout_steps"), "store": ("storage", "url"), "full_every": ("storage", "full_every"),
    "epoch_checkpoint_every": ("storage", "epoch_checkpoint_every"),
    "epoch_checkpoint_min_s": ("storage", "epoch_checkpoint_min_s"),
}


def migrate_flat_config(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict in the flat layout (`env` a task name, `ppo`, `store`...) in the sectioned one; others as they
    are. Runs started before the sections existed keep loading and continuing."""
    if "ppo" not in data and not isinstance(data.get("env", {}), str):
        return data
    out: dict[str, Any] = {k: v for k, v in data.items() if k not in _FLAT_FIELDS and k != "ppo"}
    for flat, (section, field) in _FLAT_FIELDS.items():
        if flat in data:
            out.setdefault(section, {})[field] = data[flat]
    if "ppo" in data:
        out["algorithm"] = {"name": "ppo", **data["ppo"]}
    return out
