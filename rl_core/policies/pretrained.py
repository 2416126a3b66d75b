"""The Llama policy on disk in Hugging Face's layout: config.json, model.safetensors and the tokenizer's file.

`transformers.AutoModelForCausalLM.from_pretrained(directory)` (and vLLM) load what `save_pretrained` writes;
`load_pretrained` reads it back, refusing what LlamaLM would not compute the same way.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from rl_core.policies import char_tokenizer
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "LlamaForCausalLM"
MODEL_TYPE = "llama"
# What LlamaLM computes and HF's LlamaConfig allows to differ: a config asking for anything else is refused.
_FIXED_ARCHITECTURE = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def hf_config(spec: LlamaSpec) -> dict[str, Any]:
    """config.json's contents for `spec`."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        **asdict(spec),
        **_FIXED_ARCHITECTURE,
        "head_dim": spec.head_dim,
        "attention_dropout": 0.0,
        # transformers >= 5 reads rope_parameters and dtype; older readers (transformers 4, some vLLM releases)
        # read rope_theta and torch_dtype. Both are written so either loads the same model.
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
    }


def save_pretrained(model: LlamaLM, tokenizer: CharTokenizer, directory: str | Path) -> Path:
    """Write `model` and `tokenizer` to `directory` (created if needed) in HF's layout; returns the directory."""
    if tokenizer.vocab_size != model.spec.vocab_size:
        raise ValueError(f"save_pretrained: the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size "
                         f"is {model.spec.vocab_size}; build the LlamaSpec with vocab_size=tokenizer.vocab_size")
    directory = save_weights(model, directory)
    tokenizer.save(directory / char_tokenizer.FILE_NAME)
    return directory


def save_weights(model: LlamaLM, directory: str | Path) -> Path:
    """Write `model`'s config.json and model.safetensors (no tokenizer) to `directory`: what transformers and vLLM
    need to load the weights; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.hf_state_dict().items()}
    save_file(state, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(hf_config(model.spec), indent=2, sort_keys=True) + "\n")
    return directory


def spec_from_hf_config(config: dict[str, Any], source: str) -> LlamaSpec:
    """The LlamaSpec of a config.json's contents, or a ValueError saying why LlamaLM cannot run it."""
    architectures = config.get("architectures") or []  # a GGUF file's config names none
    if config.get("model_type") != MODEL_TYPE or (architectures and ARCHITECTURE not in architectures):
        raise ValueError(f"{source}: not a Llama causal LM: expected architectures [{ARCHITECTURE!r}] and model_type "
                         f"{MODEL_TYPE!r}, found {architectures} and {config.get('model_type')!r}")
    different = {key: config[key] for key, value in _FIXED_ARCHITECTURE.items() if config.get(key, value) != value}
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        different["rope_type"] = rope.get("rope_type", rope.get("type"))
    if config.get("head_dim") not in (None, config["hidden_size"] // config["num_attention_heads"]):
        different["head_dim"] = config["head_dim"]
    if different:
        raise ValueError(f"{source}: LlamaLM implements {_FIXED_ARCHITECTURE}, default RoPE and head_dim = "
                         f"hidden_size / num_attention_heads; this config asks for {different}")
    values = {field.name: config[field.name] for field in fields(LlamaSpec) if field.name in config}
    values["rope_theta"] = rope.get("rope_theta", config.get("rope_theta", LlamaSpec.rope_theta))
    return LlamaSpec(**values)


def check_pretrained(directory: str | Path) -> tuple[LlamaSpec, CharTokenizer]:
    """The spec and tokenizer of the model that `save_pretrained` wrote to `directory` (its weights are not read), or
    an error saying what is missing or why LlamaLM cannot run it."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"load_pretrained: {directory} is not a directory; pass one written by "
                                "save_pretrained")
    for name in (CONFIG_FILE, WEIGHTS_FILE, char_tokenizer.FILE_NAME):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"load_pretrained: {directory} has no {name}; a model directory written by "
                                    f"save_pretrained holds {CONFIG_FILE}, {WEIGHTS_FILE} and "
                                    f"{char_tokenizer.FILE_NAME}")
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"load_pretrained: {directory / CONFIG_FILE} is not JSON ({err})") from None
    spec = spec_from_hf_config(config, str(directory / CONFIG_FILE))
    tokenizer = CharTokenizer.load(directory / char_tokenizer.FILE_NAME)
    if tokenizer.vocab_size != spec.vocab_size:
        raise ValueError(f"load_pretrained: {directory}'s tokenizer has {tokenizer.vocab_size} ids but its model's "
                         f"vocab_size is {spec.vocab_size}; the two files come from different models")
    return spec, tokenizer


def load_pretrained(directory: str | Path) -> tuple[LlamaLM, CharTokenizer]:
    """The model and tokenizer that `save_pretrained` wrote to `directory`."""
    spec, tokenizer = check_pretrained(directory)
    model = LlamaLM(spec)
    model.load_hf_state(load_file(Path(directory) / WEIGHTS_FILE))
    return model.eval(), tokenizer
