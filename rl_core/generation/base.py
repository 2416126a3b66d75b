"""The generation seam: what is asked (requests with sampling params and seed counters), what comes back
(completions with behaviour log-probs, stamped with the policy version), and the `Generator` backends implement."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn: logits / temperature, then top-k, then top-p, renormalized each time."""

    temperature: float = 1.0
    """Divides the logits; > 0 (use a small value such as 1e-3 for near-greedy sampling)."""
    top_p: float = 1.0
    """Nucleus: keep the most likely tokens whose probabilities first reach top_p; in (0, 1], 1 = off."""
    top_k: int = 0
    """Keep the k most likely tokens; >= 0, 0 = off."""
    max_tokens: int = 16
    """The most completion tokens; reaching it finishes with "length"."""
    stop: tuple[tuple[int, ...], ...] = field(default=())
    """Token-id sequences; a completion ending with one finishes with "stop" (the stop tokens stay in it)."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"SamplingParams.temperature must be > 0, found {self.temperature}; use a small "
                             "positive value such as 1e-3 for near-greedy sampling")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], found {self.top_p}; 1 turns nucleus "
                             "sampling off")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an integer >= 0, found {self.top_k}; 0 turns it off")
        if int(self.max_tokens) != self.max_tokens or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, found {self.max_tokens}")
        stop = tuple(tuple(int(token) for token in sequence) for sequence in self.stop)
        if any(not sequence or min(sequence) < 0 for sequence in stop):
            raise ValueError(f"SamplingParams.stop must hold non-empty sequences of token ids >= 0, found "
                             f"{self.stop!r}")
        object.__setattr__(self, "stop", stop)  # lists in, tuples kept: hashable, so requests group by params


@dataclass(frozen=True)
class GenerationRequest:
    """One sample to draw: the prompt, how to sample, and the counters its random stream is a pure function of."""

    prompt: tuple[int, ...]
    """Prompt token ids (at least one, e.g. the bos id)."""
    params: SamplingParams
    seed_counters: tuple[int, ...]
    """E.g. (run seed, iteration, prompt index, sample index): a retried rollout redraws exactly the same tokens."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(int(token) for token in self.prompt))
        object.__setattr__(self, "seed_counters", tuple(int(part) for part in self.seed_counters))
        if not self.prompt:
            raise ValueError("GenerationRequest.prompt is empty; start it with at least one token (e.g. bos)")
        if not self.seed_counters:
            raise ValueError("GenerationRequest.seed_counters is empty; pass e.g. (seed, iteration, prompt index, "
                             "sample index)")


@dataclass(frozen=True)
class Generation:
    """A completion and the log-prob of each of its tokens under the distribution it was sampled from."""

    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Behaviour log-probs, one per completion token, of `sampling_logprobs`'s distribution."""
    finish_reason: FinishReason
    version: int
    """The policy version whose weights generated it."""


class VersionMismatchError(RuntimeError):
    """A generation was asked of a policy version the generator does not hold."""


@runtime_checkable
class Generator(Protocol):
    """A backend that samples completions from one policy version at a time."""

    @property
    def version(self) -> int:
        """The policy version of the weights held now."""
        ...

    def generate(self, requests: Sequence[GenerationRequest], version: int) -> list[Generation]:
        """One Generation per request, in order; raises VersionMismatchError unless `version` is the one held."""
        ...

    def update_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        """Replace the weights (HF parameter names) and become `version`."""
        ...


def check_version(held: int, asked: int) -> None:
    """Refuse a generation for `asked` when the weights are `held`: its stamp would lie about the policy."""
    if held != asked:
        raise VersionMismatchError(f"generation asked for policy version {asked}, but the generator holds version "
                                   f"{held}; call update_weights(state, {asked}) first, or ask for version {held}")
