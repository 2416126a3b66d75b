"""The language-model policy of an agent run: a causal LM and its tokenizer, as flat named arrays.

The model is built here (a small Llama whose vocabulary is the agent env's alphabet) or loaded from a model
directory or a GGUF file (`rl_core.policies.hf_model`); either way its weights travel under Hugging Face's parameter
names behind `model.` (`model.model.embed_tokens.weight`, `model.lm_head.weight`, ...), so a checkpoint's policy
tensors are exactly what the generator's `update_weights` and transformers take once the prefix is dropped.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import torch

from rl_core.data.tensorfile import Tensors
from rl_core.envs.agent import make_agent_env
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.hf_model import Tokenizer, inspect_causal_lm, load_causal_lm
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.lora import apply_lora
from rl_core.seeding import derive_seed

if TYPE_CHECKING:
    from rl_core.config.agent import AgentRunConfig, ModelConfig

PREFIX = "model."
LORA_STREAM = 0x4C4F5241  # "LORA": the adapters' initial draw, apart from every other stream of the run


def tokenizer_of(cfg: AgentRunConfig) -> Tokenizer:
    """The run's tokenizer: the model's own (`cfg.model.path`), or one built from the agent env's alphabet.
    Derived once per process (per model section and env)."""
    return _tokenizer(cfg.model, cfg.env.name)


def model_spec(cfg: AgentRunConfig) -> LlamaSpec:
    """The run's model shape, without building the model: the source's config, or the sizes of `cfg.model` over
    the env's alphabet. Derived once per process (per model section and env)."""
    return _model_spec(cfg.model, cfg.env.name)


@functools.cache
def _tokenizer(model: ModelConfig, env_name: str) -> Tokenizer:
    if model.path is not None:
        return inspect_causal_lm(model.path)[1]
    return CharTokenizer(make_agent_env(env_name).alphabet)


@functools.cache
def _model_spec(m: ModelConfig, env_name: str) -> LlamaSpec:
    if m.path is not None:
        return inspect_causal_lm(m.path)[0]
    tokenizer = _tokenizer(m, env_name)
    return LlamaSpec(vocab_size=tokenizer.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
                     max_position_embeddings=m.context, bos_token_id=tokenizer.bos_id,
                     eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)


def build_language_model(cfg: AgentRunConfig) -> tuple[LlamaLM, Tokenizer]:
    """The run's initial model and tokenizer: loaded from `cfg.model.path` (a gymflow or Hugging Face model
    directory, or a GGUF file), or built from the env's alphabet and seeded from the run's seed (equal configs give
    equal weights); with `model.lora_rank`, LoRA adapters on its target projections, the rest frozen."""
    if cfg.model.path is not None:
        model, tokenizer = load_causal_lm(cfg.model.path)
    else:
        model, tokenizer = LlamaLM(model_spec(cfg), seed=cfg.seed), tokenizer_of(cfg)
    m = cfg.model
    if m.lora_rank is not None:
        apply_lora(model, m.lora_rank, m.lora_alpha, m.lora_target_names, derive_seed(cfg.seed, LORA_STREAM))
    return model, tokenizer


def hf_state(state: Tensors, prefix: str = PREFIX) -> dict[str, np.ndarray]:
    """The HF-named weights inside a policy or learner state (`prefix` dropped): what a generator loads."""
    return {name[len(prefix):]: value for name, value in state.items() if name.startswith(prefix)}


class LMPolicy:
    """A causal LM that acts by generating text; `state()` holds its weights and nothing else."""

    def __init__(self, model: LlamaLM, tokenizer: Tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @classmethod
    def build(cls, cfg: AgentRunConfig) -> LMPolicy:
        return cls(*build_language_model(cfg))

    @property
    def context(self) -> int:
        """The most positions one sequence may hold."""
        return self.model.spec.max_position_embeddings

    def state(self) -> Tensors:
        """What trains: every weight, or the LoRA adapters alone (`LlamaLM.policy_state_dict`)."""
        return {PREFIX + name: value.detach().numpy().copy()
                for name, value in self.model.policy_state_dict().items()}

    def load_state(self, state: Tensors) -> None:
        self.model.load_policy_state({name: torch.from_numpy(np.array(value, dtype=np.float32))
                                      for name, value in hf_state(state).items()})
