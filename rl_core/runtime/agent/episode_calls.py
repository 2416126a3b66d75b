"""What an agent-owned episode asked of the model and got back, token-exact, and the segments it trains on.

An agent-owned episode is the user's program calling a stock OpenAI client at a per-episode endpoint. The endpoint
renders each request's messages into prompt ids; `EpisodeCalls` answers them and records every call (prompt ids,
each choice's output ids, behaviour log-probs and finish reason, the policy version), so training sees exactly the
ids the model was conditioned on and sampled, never a re-tokenization of the text the program saw.

Why the rules of `EpisodeCalls.call` are what they are:
- Seeds are chosen here: call k (from 0) draws from (episode counters, k + 1), choice j of a call asking for n > 1
  from (episode counters, k + 1, j). A re-run program that makes the same calls draws the same tokens, whichever
  attempt or generator answers it; and a one-choice call draws as turn k + 1 of the step contract does, so an env's
  turn loop run as a program through the endpoint samples exactly what the direct path samples.
- A client retries a request it got no answer to: the same request re-sent right after is answered with the reply
  already recorded, so a retry neither draws new tokens nor adds a call.
- A resumed rollout re-runs the program from its start with the calls an earlier attempt recorded: while the
  program repeats them it is answered from the record (no generation), which brings it back to where it stopped.
  The first call that differs (a program reading the clock, a tool that answered otherwise) discards the record
  from there on: later recorded replies answered a conversation that no longer exists.

`segments` merges the calls by token prefix: a call whose prompt extends the ids held appends only the new ids, and
one whose prompt does not (the program trimmed its context, the chat template re-rendered earlier turns) starts a new
segment from its prompt. A call with n > 1 choices: the episode goes on along the choice the next call's prompt
extends (the first such choice, or choice 0 when none does), and each other choice becomes a segment of its own
(the call's prompt, then that choice). Every sampled token is then trained exactly once, with the episode's reward:
the return is a function of every choice the program saw, so each is credited with it as REINFORCE would.
"""
from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rl_core.algos.grpo.trajectories import Segment
from rl_core.generation.base import FinishReason, Generation, GenerationRequest, SamplingParams

log = logging.getLogger(__name__)

AsyncGenerate = Callable[[list[GenerationRequest]], Awaitable[list[Generation]]]
"""Requests in, one generation per request out (in order), all from the policy version the rollout samples."""

OnRecord = Callable[["CallRecord"], Awaitable[None]]
"""Called with each newly generated call before its reply returns: the rollout stores it as a safe point. A record
supersedes any stored record with its index or a later one (after a divergence, those answered another program)."""

_FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Choice:
    """One sampled completion of a call: its ids, the behaviour log-prob of each, and why it ended."""

    completion: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        object.__setattr__(self, "completion", tuple(int(token) for token in self.completion))
        object.__setattr__(self, "logprobs", tuple(float(value) for value in self.logprobs))
        if len(self.logprobs) != len(self.completion):
            raise ValueError(f"a recorded choice needs one log-prob per completion token: found "
                             f"{len(self.logprobs)} log-probs for {len(self.completion)} tokens")
        if not all(math.isfinite(value) for value in self.logprobs):
            raise ValueError(f"a recorded choice's log-probs must be finite (a sampled token has probability > 0), "
                             f"found {[v for v in self.logprobs if not math.isfinite(v)][:3]}; the generator's "
                             "sampled distribution and its log-probs disagree")
        if self.finish_reason not in _FINISH_REASONS:
            raise ValueError(f"a recorded choice's finish_reason must be one of {_FINISH_REASONS}, found "
                             f"{self.finish_reason!r}")


@dataclass(frozen=True)
class CallRecord:
    """One model call of an episode: what was asked (prompt ids, the endpoint's request key) and what came back.

    `to_json` writes log-probs as JSON numbers, which Python writes as the shortest text that reads back as the same
    double, so `from_json(to_json(r)) == r` to the bit and a replayed call answers with exactly the recorded values.
    """

    index: int
    """The call's position in the episode (0 first): it picks the call's seed counters."""
    request_key: str
    """The endpoint's identity of the request (a digest of its body), equal across retries and program re-runs."""
    prompt: tuple[int, ...]
    choices: tuple[Choice, ...]
    version: int
    """The policy version that generated every choice."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(int(token) for token in self.prompt))
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.index < 0 or not self.prompt or not self.choices:
            raise ValueError(f"a call record needs an index >= 0, prompt ids and at least one choice; found index "
                             f"{self.index}, {len(self.prompt)} prompt ids, {len(self.choices)} choices")

    def generations(self) -> list[Generation]:
        """The reply as the generator gave it: one Generation per choice."""
        return [Generation(self.prompt, c.completion, c.logprobs, c.finish_reason, self.version)
                for c in self.choices]

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.completion) for c in self.choices)

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-able data (no pickle)."""
        return {"index": self.index, "request_key": self.request_key, "prompt": list(self.prompt),
                "version": self.version,
                "choices": [{"completion": list(c.completion), "logprobs": list(c.logprobs),
                             "finish_reason": c.finish_reason} for c in self.choices]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CallRecord:
        """A record written by `to_json`."""
        missing = [key for key in ("index", "request_key", "prompt", "version", "choices") if key not in data]
        if missing:
            raise ValueError(f"not a call record: keys {missing} are missing (found {sorted(data)}); read back "
                             "what CallRecord.to_json wrote")
        return cls(int(data["index"]), str(data["request_key"]), tuple(data["prompt"]),
                   tuple(Choice(tuple(c["completion"]), tuple(c["logprobs"]), c["finish_reason"])
                         for c in data["choices"]),
                   int(data["version"]))


@dataclass
class CallMetrics:
    """What answering an episode's calls took; `dataclasses.asdict` for the metric sinks."""

    calls: int = 0
    """Distinct calls answered (replayed or generated); retries are not counted."""
    replayed_calls: int = 0
    """Calls answered from an earlier attempt's record."""
    retried_calls: int = 0
    """Re-sent requests answered with the reply just given."""
    divergences: int = 0
    """Calls that differed from the earlier attempt's record at their index (0 or 1 per episode)."""
    generated_tokens: int = 0
    replayed_tokens: int = 0


class EpisodeCalls:
    """The recorder of one episode's session: answers each call by retry, replay or generation, and records it.

    Calls are answered one at a time, in arrival order: call indices, hence seeds, follow that order, so a program
    that sends calls concurrently resumes bit-exactly only if they always arrive in the same order.
    """

    def __init__(self, counters: Sequence[int], earlier: Sequence[CallRecord] = (),
                 on_record: OnRecord | None = None) -> None:
        """`counters`: the episode's seed counters, e.g. (seed, stream, iteration, group, sample); see the module
        docstring for the counters of each call. `earlier`: the calls an earlier attempt of this episode recorded, in
        order (empty for a first attempt)."""
        found = [record.index for record in earlier]
        if found != list(range(len(found))):
            raise ValueError(f"the earlier attempt's calls must be indices 0, 1, ... in order; found {found[:10]}; "
                             "pass the stored records sorted by index, cut at the first gap")
        self.counters = tuple(int(part) for part in counters)
        self.earlier = list(earlier)
        self.on_record = on_record
        self.metrics = CallMetrics()
        self._records: list[CallRecord] = []
        self._lock = asyncio.Lock()

    @property
    def records(self) -> tuple[CallRecord, ...]:
        """This attempt's calls so far, replayed ones included: the episode once the program has ended (earlier
        records the program did not reach again are not part of it)."""
        return tuple(self._records)

    async def call(self, prompt_ids: Sequence[int], params: SamplingParams, n: int, request_key: str,
                   generate: AsyncGenerate) -> list[Generation]:
        """The reply to one request: `n` generations of `prompt_ids` sampled with `params`."""
        if n < 1:
            raise ValueError(f"a call asks for n >= 1 choices, found n={n}")
        prompt = tuple(int(token) for token in prompt_ids)
        async with self._lock:
            if self._records and _same(self._records[-1], prompt, n, request_key):
                self.metrics.retried_calls += 1
                return self._records[-1].generations()
            k = len(self._records)
            if k < len(self.earlier):
                recorded = self.earlier[k]
                if _same(recorded, prompt, n, request_key):
                    self._records.append(recorded)
                    self.metrics.calls += 1
                    self.metrics.replayed_calls += 1
                    self.metrics.replayed_tokens += recorded.completion_tokens
                    return recorded.generations()
                log.warning("episode %s: call %d differs from the one an earlier attempt recorded (request %s, "
                            "%d prompt ids; recorded %s, %d prompt ids): the %d recorded calls from there are "
                            "discarded and generated anew", self.counters, k, request_key, len(prompt),
                            recorded.request_key, len(recorded.prompt), len(self.earlier) - k)
                self.metrics.divergences += 1
                self.earlier = self.earlier[:k]
            record = await self._generate(k, prompt, params, n, request_key, generate)
            self._records.append(record)
            self.metrics.calls += 1
            self.metrics.generated_tokens += record.completion_tokens
            if self.on_record is not None:
                await self.on_record(record)
            return record.generations()

    async def _generate(self, k: int, prompt: tuple[int, ...], params: SamplingParams, n: int, request_key: str,
                        generate: AsyncGenerate) -> CallRecord:
        requests = [GenerationRequest(prompt, params, (*self.counters, k + 1, *((j,) if n > 1 else ())))
                    for j in range(n)]
        generations = await generate(requests)
        if len(generations) != n or any(g.prompt != prompt for g in generations):
            raise RuntimeError(f"the generator answered {len(generations)} generations for {n} requests of one "
                               f"{len(prompt)}-id prompt, or answered another prompt; it must return one generation "
                               "per request, in order")
        versions = sorted({g.version for g in generations})
        if len(versions) != 1:
            raise RuntimeError(f"the {n} choices of call {k} came from policy versions {versions}; one call's "
                               "choices must come from one version (sync the generator before the episode)")
        choices = tuple(Choice(g.completion, g.logprobs, g.finish_reason) for g in generations)
        return CallRecord(k, request_key, prompt, choices, versions[0])


def _same(record: CallRecord, prompt: tuple[int, ...], n: int, request_key: str) -> bool:
    """Whether a request is the one `record` answered."""
    return record.request_key == request_key and record.prompt == prompt and len(record.choices) == n


def segments(records: Sequence[CallRecord]) -> list[Segment]:
    """An episode's calls as segments, by token prefix (module docstring), with no id re-tokenized.

    Turns as in trajectories: prompt ids 0, call k's output (k from 0) action k + 1 at turn 2k + 1, and the ids call
    k's prompt adds to the held ones the observation before it, turn 2k. Rows are in the order they start.
    """
    rows: list[Segment] = []
    current: Segment | None = None
    for k, record in enumerate(records):
        prompt = list(record.prompt)
        if current is not None and prompt[:len(current.tokens)] == current.tokens:
            current.append(prompt[len(current.tokens):], 2 * k)
        else:
            current = Segment.start(prompt)
            rows.append(current)
        following = list(records[k + 1].prompt) if k + 1 < len(records) else []
        continued = next((j for j, c in enumerate(record.choices)
                          if following[:len(prompt) + len(c.completion)] == prompt + list(c.completion)), 0)
        for j, choice in enumerate(record.choices):
            if j == continued:
                current.append(list(choice.completion), 2 * k + 1, list(choice.logprobs))
            else:
                side = Segment.start(prompt)
                side.append(list(choice.completion), 2 * k + 1, list(choice.logprobs))
                rows.append(side)
    return rows
