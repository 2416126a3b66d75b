"""Causal LMs from outside gymflow: a Hugging Face model directory or a GGUF file, read with transformers, run as
our LlamaLM (the torch backend and the trainer compute the same function) with the model's own tokenizer.

A source is one of: a directory `save_pretrained` wrote (gymflow's char tokenizer: `rl_core.policies.pretrained`),
any Hugging Face causal-LM directory (config.json, weights, tokenizer files), or a `.gguf` file (dequantized to
float32 once, into gymflow's cache: `$GYMFLOW_CACHE_DIR/models/<digest>/`, an HF directory every later process
reads). The architecture must be Llama's (SmolLM2, Llama 2/3, TinyLlama...): LlamaLM computes nothing else, and
anything else is refused with the architecture it found. Nothing is downloaded: a source
is a local path. transformers is the `hf` extra; without it only gymflow's own directories load.
"""
from __future__ import annotations

import functools
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from gymflow_kernels.cache import cache_dir
from rl_core.policies import char_tokenizer
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.hf_tokenizer import HFTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.pretrained import (
    WEIGHTS_FILE,
    check_pretrained,
    load_pretrained,
    save_weights,
    spec_from_hf_config,
)

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
    directory = _readable(source)
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(directory).to_dict()
    spec = spec_from_hf_config(config, str(source))
    tokenizer = HFTokenizer(transformers.AutoTokenizer.from_pretrained(directory))
    if tokenizer.vocab_size > spec.vocab_size:
        raise ValueError(f"{source}: the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
                         f"{spec.vocab_size}; the two come from different models")
    return spec, tokenizer


def load_causal_lm(source: str) -> tuple[LlamaLM, Tokenizer]:
    """The model (float32 LlamaLM, eval mode) and its tokenizer."""
    if is_gymflow_directory(source):
        return load_pretrained(source)
    spec, tokenizer = inspect_causal_lm(source)
    directory = _readable(source)
    if (directory / WEIGHTS_FILE).is_file():  # one safetensors file under HF's names: read as is
        state = load_file(directory / WEIGHTS_FILE)
    else:
        state = dict(_transformers().AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, use_kernels=False).state_dict())  # no Hub kernels
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the tied embedding, which LlamaLM does not hold twice
    model = LlamaLM(spec)
    model.load_hf_state({name: tensor.to(torch.float32) for name, tensor in state.items()})
    return model.eval(), tokenizer


def _readable(source: str | Path) -> Path:
    """Where to read `source` from: a GGUF file's float32 conversion in gymflow's cache (made on first use, then
    shared by every process and run: dequantizing and reading the GGUF tokenizer cost seconds in each), or the
    source itself."""
    directory, gguf = _where(source)
    if gguf is None:
        return directory
    converted = cache_dir() / "models" / model_digest(str(source)).removeprefix("sha256:")[:32]
    if not (converted / WEIGHTS_FILE).is_file():
        _convert_gguf(directory, gguf, converted)
    return converted


def _convert_gguf(directory: Path, gguf: str, target: Path) -> None:
    """Dequantize the GGUF file once into `target` (config, float32 safetensors, tokenizer with its chat template),
    written beside it and renamed into place, so a reader never sees half a conversion."""
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(directory, gguf_file=gguf).to_dict()
    model = LlamaLM(spec_from_hf_config(config, str(directory / gguf)))
    state = dict(transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=gguf, dtype=torch.float32, use_kernels=False).state_dict())  # no Hub kernels
    if model.spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model.load_hf_state(state)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        transformers.AutoTokenizer.from_pretrained(directory, gguf_file=gguf).save_pretrained(partial)
        save_weights(model, partial)  # transformers will not save a model it read from GGUF
        try:
            partial.rename(target)
        except OSError:  # another process converted it meanwhile
            if not (target / WEIGHTS_FILE).is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def model_digest(source: str) -> str:
    """`sha256:<hex>` of the model's files (the GGUF file, or every file at a directory's top level, by name and
    content): the identity of a frozen base that a LoRA run's versions do not hold. Cached per process while the
    files keep their sizes and times."""
    path = Path(source)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return _digest(tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=8)
def _digest(files: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, _ in files:
        digest.update(Path(name).name.encode() + b"\0")
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"
