"""Causal LMs from outside gymflow: a Hugging Face model directory or a GGUF file, read with transformers, run as
our LlamaLM (the torch backend and the trainer compute the same function) with the model's own tokenizer.

A source is one of: a directory `save_pretrained` wrote (gymflow's char tokenizer: `rl_core.policies.pretrained`),
any Hugging Face causal-LM directory (config.json, weights, tokenizer files), or a `.gguf` file (quantized weights
are dequantized to float32 on load). The architecture must be Llama's (SmolLM2, Llama 2/3, TinyLlama...): LlamaLM
computes nothing else, and anything else is refused with the architecture it found. Nothing is downloaded: a source
is a local path. transformers is the `hf` extra; without it only gymflow's own directories load.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from rl_core.policies import char_tokenizer
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.hf_tokenizer import HFTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.pretrained import check_pretrained, load_pretrained, spec_from_hf_config

Tokenizer = CharTokenizer | HFTokenizer


def is_gymflow_directory(source: str | Path) -> bool:
    """Whether `source` is a directory `save_pretrained` wrote (it holds gymflow's char tokenizer)."""
    return Path(source).is_dir() and (Path(source) / char_tokenizer.FILE_NAME).is_file()


def _where(source: str | Path) -> tuple[Path, str | None]:
    """(directory, GGUF file name or None) of a source; a FileNotFoundError for a path that does not exist."""
    path = Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: pass a GGUF file on this machine")
        return path.parent, path.name
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory or a .gguf file: pass a model directory (config.json, "
                                "weights, tokenizer) or a GGUF file on this machine")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: not a causal LM directory (a model directory holds "
                                "config.json, its weights and its tokenizer)")
    return path, None


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"loading a Hugging Face model or a GGUF file needs transformers ({err}); install gymflow's "
                          "hf extra: pip install -e '.[hf]'") from None
    transformers.utils.logging.disable_progress_bar()  # per-tensor bars on every load, in every actor's log
    return transformers


@functools.lru_cache(maxsize=8)
def inspect_causal_lm(source: str) -> tuple[LlamaSpec, Tokenizer]:
    """The model's shape and its tokenizer, without reading its weights (a ValueError when LlamaLM cannot run it).
    Cached per process: a config check and every actor ask."""
    if is_gymflow_directory(source):
        return check_pretrained(source)
    directory, gguf = _where(source)
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(directory, gguf_file=gguf).to_dict()
    spec = spec_from_hf_config(config, str(source))
    tokenizer = HFTokenizer(transformers.AutoTokenizer.from_pretrained(directory, gguf_file=gguf))
    if tokenizer.vocab_size > spec.vocab_size:
        raise ValueError(f"{source}: the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
                         f"{spec.vocab_size}; the two come from different models")
    return spec, tokenizer


def load_causal_lm(source: str) -> tuple[LlamaLM, Tokenizer]:
    """The model (float32 LlamaLM, eval mode) and its tokenizer."""
    if is_gymflow_directory(source):
        return load_pretrained(source)
    spec, tokenizer = inspect_causal_lm(source)
    directory, gguf = _where(source)
    hf = _transformers().AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf, dtype=torch.float32,
                                                              use_kernels=False)  # no Hub kernels: local only
    state = dict(hf.state_dict())
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the tied embedding, which LlamaLM does not hold twice
    model = LlamaLM(spec)
    model.load_hf_state(state)
    return model.eval(), tokenizer
