"""A trained policy written as files that load without gymflow.

An agent's causal LM becomes a Hugging Face model directory: config.json, model.safetensors and its tokenizer, what
`transformers.AutoModelForCausalLM.from_pretrained` (and vLLM) read. The weights are `LlamaLM.hf_state_dict()`, so
whatever the policy folds into its model (adapters merged into the base weights) is what is written.

A control policy (PPO's actor-critic and the observation normalizer it acts through) becomes one safetensors file
whose header says how to rebuild it: sizes, activation, normalizer constants, the env. docs/guides/export.md holds a
loader in plain torch.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.hf_model import Tokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.mlp import ActorCritic
from rl_core.policies.normalizer import ObservationNormalizer
from rl_core.policies.pretrained import save_pretrained, save_weights

CONTROL_FORMAT = "gymflow-control-policy/1"
"""The header's `format`: a loader checks it before reading the other keys."""


def write_hf_directory(model: LlamaLM, tokenizer: Tokenizer, directory: str | Path) -> Path:
    """`model` and its tokenizer in Hugging Face's layout under `directory` (created if needed); returns it.

    A gymflow char tokenizer is written as `save_pretrained` writes it (transformers has no class for it, gymflow
    reads it back); a Hugging Face tokenizer by its own `save_pretrained`, which keeps its chat template."""
    if isinstance(tokenizer, CharTokenizer):
        return save_pretrained(model, tokenizer, directory)
    directory = save_weights(model, directory)
    tokenizer.tokenizer.save_pretrained(directory)
    return directory


def _control_header(model: ActorCritic, normalizer: ObservationNormalizer) -> dict[str, str]:
    """What a loader needs to rebuild the actor, read from the model itself: sizes, activation, normalizer
    constants (safetensors headers hold strings)."""
    linears = [layer for layer in model.actor if isinstance(layer, nn.Linear)]
    activation = type(model.actor[1]).__name__.lower()  # the actor is Linear, activation, ..., Linear
    return {"format": CONTROL_FORMAT, "obs_dim": str(linears[0].in_features),
            "action_dim": str(linears[-1].out_features),
            "hidden_sizes": json.dumps([layer.out_features for layer in linears[:-1]]),
            "activation": activation, "obs_clip": repr(normalizer.clip), "obs_eps": repr(normalizer.eps)}


def write_control_policy(model: ActorCritic, normalizer: ObservationNormalizer, path: str | Path,
                         about: dict[str, str]) -> dict[str, str]:
    """The actor-critic's tensors (`actor.*`, `critic.*`, `log_std`) and the normalizer's mean and variance
    (`obs_norm.mean`, `obs_norm.var`, float64 as the normalizer computes) in one safetensors file at `path`. Its
    header, returned: the model's sizes and activation, the normalizer's constants, and `about` (env, run, version)."""
    moments = normalizer.moments
    # The variance `ObservationNormalizer.normalize` divides by: the identity scale before any data was seen.
    var = moments.m2 / moments.count if moments.count > 1 else np.ones_like(moments.mean)
    tensors = {name: value.detach().contiguous() for name, value in model.state_dict().items()}
    tensors["obs_norm.mean"] = torch.from_numpy(np.ascontiguousarray(moments.mean, dtype=np.float64))
    tensors["obs_norm.var"] = torch.from_numpy(np.ascontiguousarray(var, dtype=np.float64))
    header = {**_control_header(model, normalizer), **about}
    save_file(tensors, str(path), metadata=header)
    return header
