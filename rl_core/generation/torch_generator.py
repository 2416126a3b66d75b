"""The in-process generator: samples completions from a LlamaLM with a KV cache, on CPU (or the model's device).

Requests that share a prompt and sampling params (GRPO's G samples of one prompt) are one batch: the prompt is
prefilled once, its cache copied to every row, then the batch decodes a token per step; finished rows stay in the
batch but their outputs are ignored. Each row draws from its own torch.Generator, seeded from the request's
counters, so a sample's tokens do not depend on which other requests shared its batch.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rl_core.generation.base import FinishReason, Generation, GenerationRequest, SamplingParams, check_version
from rl_core.generation.sampling import sampling_logprobs
from rl_core.policies.llama import KVCache, LlamaLM
from rl_core.policies.pretrained import load_pretrained
from rl_core.seeding import torch_generator


def _gumbel_max(logprobs: torch.Tensor, rngs: Sequence[torch.Generator], active: Sequence[bool]) -> torch.Tensor:
    """(rows,) token ids, row r drawn from exp(logprobs[r]) by Gumbel-max with rngs[r]; tokens outside the sampled
    set (-inf) are never drawn. Inactive rows draw nothing (their generators stay put) and get their argmax."""
    noise = torch.zeros(logprobs.shape, dtype=torch.float32)
    for row, (rng, on) in enumerate(zip(rngs, active, strict=True)):
        if on:
            # clamped away from 0 so the noise is finite: a kept token's score never ties with -inf
            uniform = torch.rand(logprobs.shape[-1], generator=rng).clamp_(min=torch.finfo(torch.float32).tiny)
            noise[row] = -torch.log(-torch.log(uniform))
    return (logprobs + noise.to(logprobs.device)).argmax(dim=-1)


def _ends_with_stop(completion: list[int], stop: tuple[tuple[int, ...], ...]) -> bool:
    return any(len(completion) >= len(seq) and tuple(completion[-len(seq):]) == seq for seq in stop)


class TorchGenerator:
    """A `Generator` running a LlamaLM in this process; the reference backend that others are checked against."""

    def __init__(self, model: LlamaLM, *, version: int = 0):
        self.model = model.eval()
        self._version = int(version)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, version: int = 0) -> TorchGenerator:
        """A generator on the model that `save_pretrained` wrote to `directory`."""
        model, _ = load_pretrained(directory)
        return cls(model, version=version)

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        """Copy `state` (HF parameter names, as `LlamaLM.hf_state_dict`) into the model and become `version`."""
        self.model.load_hf_state({name: torch.from_numpy(np.array(value, dtype=np.float32))
                                  for name, value in state.items()})
        self._version = int(version)

    def generate(self, requests: Sequence[GenerationRequest], version: int) -> list[Generation]:
        """One Generation per request, in order; requests with the same prompt and params share a batch."""
        check_version(self._version, version)
        groups: dict[tuple[tuple[int, ...], SamplingParams], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault((request.prompt, request.params), []).append(index)
        for prompt, params in groups:
            self._check_prompt(prompt, params)  # every request before any work
        results: dict[int, Generation] = {}
        for (prompt, params), indices in groups.items():
            samples = self._sample_batch(prompt, params, [requests[i].seed_counters for i in indices])
            results.update(zip(indices, samples, strict=True))
        return [results[i] for i in range(len(requests))]

    def _check_prompt(self, prompt: tuple[int, ...], params: SamplingParams) -> None:
        spec = self.model.spec
        context = spec.max_position_embeddings
        if len(prompt) + params.max_tokens > context:
            room = f"lower max_tokens to at most {context - len(prompt)}" if len(prompt) < context else \
                f"shorten the prompt to fewer than {context} tokens"
            raise ValueError(f"TorchGenerator: a prompt of {len(prompt)} tokens plus max_tokens {params.max_tokens} "
                             f"is {len(prompt) + params.max_tokens} positions, over the model's context of "
                             f"{context} (max_position_embeddings); {room}")
        if min(prompt) < 0 or max(prompt) >= spec.vocab_size:
            raise ValueError(f"TorchGenerator: prompt ids must lie in [0, {spec.vocab_size}), found "
                             f"{[t for t in prompt if not 0 <= t < spec.vocab_size][:5]}")

    @torch.inference_mode()
    def _sample_batch(self, prompt: tuple[int, ...], params: SamplingParams,
                      counters: list[tuple[int, ...]]) -> list[Generation]:
        """The samples of one prompt, a row each: prefill once, then decode the rows together."""
        rows = len(counters)
        device = self.model.lm_head.weight.device
        rngs = [torch_generator(*parts) for parts in counters]
        # Positions fed: the prompt and every completion token but the last, which is sampled and never fed.
        cache = KVCache.allocate(self.model.spec, 1, len(prompt) + params.max_tokens - 1, device=device)
        logits, cache = self.model(torch.tensor([prompt], device=device), cache)
        cache = cache.repeat_rows(rows)
        next_logits = logits[:, -1].expand(rows, -1)  # (rows, vocab)
        completions: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        finished: list[FinishReason | None] = [None] * rows
        for step in range(params.max_tokens):
            step_logprobs = sampling_logprobs(next_logits, params)
            active = [reason is None for reason in finished]
            tokens = _gumbel_max(step_logprobs, rngs, active)
            chosen = step_logprobs.gather(-1, tokens[:, None]).squeeze(-1).tolist()
            for row in (r for r in range(rows) if active[r]):
                completions[row].append(int(tokens[row]))
                logprobs[row].append(chosen[row])
                if _ends_with_stop(completions[row], params.stop):
                    finished[row] = "stop"
            if all(reason is not None for reason in finished) or step + 1 == params.max_tokens:
                break
            logits, cache = self.model(tokens[:, None], cache)
            next_logits = logits[:, -1]
        return [Generation(prompt, tuple(completion), tuple(logps), reason or "length", self._version)
                for completion, logps, reason in zip(completions, logprobs, finished, strict=True)]
