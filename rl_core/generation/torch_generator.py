"""The in-process generator: samples completions from a LlamaLM with continuous batching, on CPU (or the model's
device).

Up to `max_batch` sequences decode together in the slots of a static KV cache (`SlotCache`), each at its own
length (by default `MAX_BATCH`, or more while their cache fits `CACHE_BUDGET_BYTES`). Requests are admitted in
order: the requests of one prompt that enter together (GRPO's G samples) share one prefill, copied into their slots;
the start that all prompts entering together share (a chat template's system prompt) is prefilled once; and the
distinct prompts of one length prefill the rest as one batch. A sequence that finishes frees its slot, which the next
waiting request takes at the following step, so no row decodes padding while requests wait. Every step samples the
whole batch at once.

A request's random stream is a pure function of its seed counters: at admission it draws its `max_tokens`
uniforms, and its token t is drawn from the sampled distribution by inverting that distribution's CDF at uniform t.
So a sample's tokens do not depend on which requests shared its batch or slot, nor, on CPU, do its log-probs (the
model computes each row the same whatever shares the call: `rl_core.policies.llama`); on a GPU they can move in the
last float bits with the batch's size, as any batched matmul's.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rl_core.generation.base import Generation, GenerationRequest, SamplingParams, check_version
from rl_core.generation.sampling import sampling_logprobs
from rl_core.policies.kv_cache import SlotCache
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.pretrained import load_pretrained
from rl_core.seeding import torch_generator

MAX_BATCH = 64
"""Sequences decoded together by default: enough to keep a small model's matmuls efficient on a CPU."""
CACHE_BUDGET_BYTES = 1 << 30
"""By default more than MAX_BATCH sequences decode together while their KV cache fits in this: an evaluation's
hundreds of short episodes then take fewer, fuller decode steps (figures in docs/benchmarks.md)."""


def inverse_cdf_sample(logprobs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(rows,) token of each row drawn from exp(logprobs[row]) with its uniform in [0, 1): the first token whose
    cumulative probability exceeds it. Tokens of probability 0 (outside top-k / top-p) are never drawn."""
    cdf = logprobs.double().exp().cumsum(dim=-1)
    target = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logprobs.shape[-1] - 1)


class TorchGenerator:
    """A `Generator` running a LlamaLM in this process; the reference backend that others are checked against."""

    def __init__(self, model: LlamaLM, *, version: int = 0, max_batch: int | None = None):
        """`max_batch`: at most this many sequences decode together; None: MAX_BATCH, or more within
        CACHE_BUDGET_BYTES."""
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"TorchGenerator: max_batch must be >= 1, found {max_batch}")
        self.model = model.eval()
        self.max_batch = max_batch
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
        """Copy `state` (HF parameter names, as `LlamaLM.policy_state_dict`: every weight, or a LoRA model's
        adapters) into the model and become `version`."""
        self.model.load_policy_state({name: torch.from_numpy(np.array(value, dtype=np.float32))
                                      for name, value in state.items()})
        self._version = int(version)

    def generate(self, requests: Sequence[GenerationRequest], version: int) -> list[Generation]:
        """One Generation per request, in order."""
        check_version(self._version, version)
        for request in requests:
            self._check_prompt(request.prompt, request.params)  # every request before any work
        if not requests:
            return []
        return _ContinuousBatch(self.model, list(requests), self.max_batch).run(self._version)

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


def _slots_within_budget(spec: LlamaSpec, capacity: int) -> int:
    """MAX_BATCH, or as many slots of `capacity` positions as CACHE_BUDGET_BYTES holds (float32 keys and values)."""
    per_slot = 2 * spec.num_hidden_layers * spec.num_key_value_heads * spec.head_dim * capacity * 4
    return max(MAX_BATCH, CACHE_BUDGET_BYTES // per_slot)


MIN_SHARED_PREFIX = 8
"""Prompts admitted together that start with at least this many equal tokens prefill that start once."""


def _shared_start(prompts: list[tuple[int, ...]]) -> int:
    """How many first tokens every one of several prompts shares, leaving each at least one of its own (its last
    position's logits come from its own prefill); 0 for one prompt."""
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    length = 0
    while length < limit and all(p[length] == first[length] for p in prompts):
        length += 1
    return length


class _ContinuousBatch:
    """The state of one `generate` call: waiting requests, the slots' sequences, their outputs."""

    def __init__(self, model: LlamaLM, requests: list[GenerationRequest], max_batch: int | None) -> None:
        self.model, self.requests = model, requests
        longest = max(r.params.max_tokens for r in requests)
        device = model.lm_head.weight.device
        # Positions fed: the prompt and every completion token but the last, which is sampled and never fed.
        capacity = max(len(r.prompt) + r.params.max_tokens - 1 for r in requests)
        slots = min(max_batch or _slots_within_budget(model.spec, capacity), len(requests))
        self.cache = SlotCache.allocate(model.spec, slots, capacity, device=device)
        self.waiting = deque(range(len(requests)))
        self.owner = [-1] * slots  # request index held by each slot; -1: free
        self.uniforms = torch.zeros(slots, longest, dtype=torch.float64)
        self.tokens = torch.zeros(slots, longest, dtype=torch.long)
        self.logprobs = torch.zeros(slots, longest)
        self.generated = torch.zeros(slots, dtype=torch.long)
        self.limit = torch.zeros(slots, dtype=torch.long)  # each slot's max_tokens
        self.next_logits = torch.zeros(slots, model.spec.vocab_size, device=device)
        stops = sorted({seq for r in requests for seq in r.params.stop})
        self.stops = [torch.tensor(seq) for seq in stops]
        self.stop_member = torch.zeros(slots, len(stops), dtype=torch.bool)  # slot's request stops on stop j
        self.stop_index = {seq: j for j, seq in enumerate(stops)}
        # The sampled distributions in this call (usually one): each slot's index into them.
        self.distributions = sorted({(r.params.temperature, r.params.top_p, r.params.top_k) for r in requests})
        self.distribution = torch.zeros(slots, dtype=torch.long)
        self.live = torch.zeros(slots, dtype=torch.bool)
        self.results: list[Generation | None] = [None] * len(requests)

    @torch.inference_mode()
    def run(self, version: int) -> list[Generation]:
        while True:
            self._admit()
            if not self.live.any():
                return self.results  # type: ignore[return-value]
            width = int(torch.nonzero(self.live).max()) + 1  # slots 0 .. width - 1 take part in this step
            chosen = self._sample(width)
            self._finish(width, version)
            if not self.live.any() and not self.waiting:
                return self.results  # type: ignore[return-value]
            width, chosen = self._compact(width, chosen)
            free = ~self.live[:width]
            self.cache.lengths[:width][free] = 0  # a free slot decodes a throw-away token from position 0
            self.next_logits[:width] = self.model.decode(chosen[:width].masked_fill(free, 0), self.cache)

    def _admit(self) -> None:
        """Give free slots to waiting requests, in order; requests of one prompt share its prefill."""
        free = [s for s, owner in enumerate(self.owner) if owner < 0]
        taken: dict[tuple[int, ...], list[int]] = {}
        for slot in free:
            if not self.waiting:
                break
            index = self.waiting.popleft()
            request = self.requests[index]
            self.owner[slot] = index
            self.live[slot] = True
            p = request.params
            self.distribution[slot] = self.distributions.index((p.temperature, p.top_p, p.top_k))
            taken.setdefault(request.prompt, []).append(slot)
            self.uniforms[slot, :request.params.max_tokens] = torch.rand(
                request.params.max_tokens, generator=torch_generator(*request.seed_counters), dtype=torch.float64)
            self.generated[slot] = 0
            self.limit[slot] = request.params.max_tokens
            self.stop_member[slot] = False
            for seq in request.params.stop:
                self.stop_member[slot, self.stop_index[seq]] = True
        device = self.next_logits.device
        shared, start = _shared_start(list(taken)), None
        if shared >= MIN_SHARED_PREFIX:  # a system prompt, a task's preamble: prefilled once for every prompt
            _, start = self.model.prefill(torch.tensor([next(iter(taken))[:shared]], device=device))
        else:
            shared = 0
        by_length: dict[int, list[tuple[int, ...]]] = {}
        for prompt in taken:
            by_length.setdefault(len(prompt), []).append(prompt)
        for prompts in by_length.values():  # prompts of one length prefill together, one row each
            logits, prefix = self.model.prefill(torch.tensor([p[shared:] for p in prompts], device=device), start)
            for row, prompt in enumerate(prompts):
                self.cache.fill(taken[prompt], prefix, row)
                self.next_logits[taken[prompt]] = logits[row]

    def _sample(self, width: int) -> torch.Tensor:
        """Draw each live slot's next token from its sampled distribution; record token and log-prob."""
        chosen = torch.zeros(width, dtype=torch.long)
        live = self.live[:width]
        for d, (temperature, top_p, top_k) in enumerate(self.distributions):
            rows = torch.nonzero(live & (self.distribution[:width] == d) if len(self.distributions) > 1 else live)
            rows = rows.flatten()
            if not len(rows):
                continue
            params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
            logprobs = sampling_logprobs(self.next_logits[rows], params).cpu()
            step = self.generated[rows]
            tokens = inverse_cdf_sample(logprobs, self.uniforms[rows, step])
            chosen[rows] = tokens
            self.tokens[rows, step] = tokens
            self.logprobs[rows, step] = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
            self.generated[rows] = step + 1
        return chosen

    def _finish(self, width: int, version: int) -> None:
        """Hand back the sequences that hit a stop sequence or their max_tokens; their slots become free."""
        live = self.live[:width]
        count = self.generated[:width]
        stopped = torch.zeros(width, dtype=torch.bool)
        for j, seq in enumerate(self.stops):
            n = len(seq)
            index = (count[:, None] - n + torch.arange(n)).clamp(min=0)
            ends = (self.tokens[:width].gather(1, index) == seq).all(1) & (count >= n)
            stopped |= ends & self.stop_member[:width, j]
        done = live & (stopped | (count >= self.limit[:width]))
        for slot in torch.nonzero(done).flatten().tolist():
            request, n = self.requests[self.owner[slot]], int(count[slot])
            self.results[self.owner[slot]] = Generation(
                request.prompt, tuple(self.tokens[slot, :n].tolist()), tuple(self.logprobs[slot, :n].tolist()),
                "stop" if bool(stopped[slot]) else "length", version)
            self.owner[slot] = -1
            self.live[slot] = False

    def _compact(self, width: int, chosen: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Once no request waits, move the live sequences to the first slots when fewer than half the width is live,
        so a step decodes no more free slots than live ones; the new width and the sampled tokens, moved alike."""
        live = [s for s in range(width) if self.owner[s] >= 0]
        if self.waiting or not live or len(live) * 2 > width:
            return width, chosen
        target = list(range(len(live)))
        moving = [(s, t) for s, t in zip(live, target) if s != t]
        if moving:
            source, dest = [s for s, _ in moving], [t for _, t in moving]
            self.cache.move(source, dest)
            for buffer in (self.uniforms, self.tokens, self.logprobs, self.generated, self.limit, self.next_logits,
                           self.stop_member, self.distribution, self.live, chosen):
                buffer[dest] = buffer[source]
            self.live[len(live):width] = False
            for s, t in moving:
                self.owner[t], self.owner[s] = self.owner[s], -1
        return len(live), chosen
