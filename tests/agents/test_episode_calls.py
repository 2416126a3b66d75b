"""An agent-owned episode's calls, recorded token-exact (`EpisodeCalls`) and merged into segments by token prefix.

The calls come as the OpenAI endpoint makes them: a program's messages rendered by a real tokenizer (gymflow's char
tokenizer, SmolLM2's chat template), answered by a real TorchGenerator on a tiny LlamaLM. The model writes only a few
ids (`tiny_generator`), so the text a program gets back re-encodes to the ids sampled, and whether a rendering
extends the held ids depends on the template alone.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest
import torch

from rl_core.algos.grpo.trajectories import Episode, Segment, TrajectoryBatch
from rl_core.generation.base import Generation, GenerationRequest, SamplingParams
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.hf_tokenizer import HFTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.runtime.agent.episode_calls import CallRecord, Choice, EpisodeCalls, segments
from tests.smollm2 import smollm2_gguf

Message = tuple[str, str]
Chat = Callable[..., Awaitable[list[str]]]
COUNTERS = (7, 0x4147, 3, 1, 2)  # seed, stream, iteration, group, sample
CHAR = CharTokenizer("abcdefgh0123456789 ?.")
CHAR_PARAMS = SamplingParams(temperature=1.0, top_k=CHAR.vocab_size - 3, max_tokens=5,
                             stop=((CHAR.encode(".")[0],),))
SMOL_WORDS = " a b c d"  # four ids ("Ġa" ...): any sequence of them re-encodes to itself
# Qwen3's template renders earlier assistant turns otherwise than they were sampled (without their reasoning); this
# one, SmolLM2's otherwise, strips their surrounding whitespace, which every reply of SMOL_WORDS ids begins with.
REWRITING_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{% set content = message['content'] | trim if message['role'] == 'assistant' else message['content'] %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def tiny_generator(vocab_size: int, allowed: Sequence[int]) -> TorchGenerator:
    """A random tiny LlamaLM that writes only `allowed` ids: residual dimension 0 holds a constant no layer writes, so
    the final norm's output there is positive, and every other id's lm_head row points against it (top-k of
    len(allowed) then cuts them off exactly)."""
    model = LlamaLM(LlamaSpec(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                              initializer_range=0.2), seed=3)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 3.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        banned = torch.ones(vocab_size, dtype=torch.bool)
        banned[list(allowed)] = False
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[banned] = 0.0
        model.lm_head.weight[banned, 0] = -1000.0
    return TorchGenerator(model)


class CountingGenerator:
    """The async generate the endpoint hands to EpisodeCalls, keeping every request it was asked."""

    def __init__(self, generator: TorchGenerator) -> None:
        self.generator = generator
        self.requests: list[GenerationRequest] = []

    async def __call__(self, requests: list[GenerationRequest]) -> list[Generation]:
        self.requests.extend(requests)
        return self.generator.generate(requests, 0)


class Endpoint:
    """What the OpenAI endpoint does for one episode, without HTTP: render, key the request, reply with text."""

    def __init__(self, tokenizer: CharTokenizer | HFTokenizer, calls: EpisodeCalls, generate: CountingGenerator,
                 params: SamplingParams) -> None:
        self.tokenizer, self.calls, self.generate, self.params = tokenizer, calls, generate, params
        self.prompts: list[list[int]] = []

    async def chat(self, messages: list[Message], n: int = 1) -> list[str]:
        prompt = self.tokenizer.conversation_ids(messages)
        key = hashlib.sha256(json.dumps([messages, n]).encode()).hexdigest()
        self.prompts.append(prompt)
        generations = await self.calls.call(prompt, self.params, n, key, self.generate)
        return [self.tokenizer.decode(g.completion) for g in generations]


async def conversation(chat: Chat, second: str = " 1?") -> None:
    """A deterministic program: three calls, each sending the whole conversation so far."""
    messages: list[Message] = [("user", "ab? ")]
    for question in (second, " 2?", None):
        messages.append(("assistant", (await chat(messages))[0]))
        if question is not None:
            messages.append(("user", question))


def run(tokenizer: CharTokenizer | HFTokenizer, generator: TorchGenerator, params: SamplingParams,
        program: Callable[[Chat], Awaitable[None]], earlier: Sequence[CallRecord] = ()
        ) -> tuple[EpisodeCalls, Endpoint, list[CallRecord]]:
    """Run `program` to its end against a fresh session; the session, its endpoint and the records stored."""
    stored: list[CallRecord] = []

    async def store(record: CallRecord) -> None:
        stored.append(record)

    calls = EpisodeCalls(COUNTERS, earlier, store)
    endpoint = Endpoint(tokenizer, calls, CountingGenerator(generator), params)
    asyncio.run(program(endpoint.chat))
    return calls, endpoint, stored


def trained(rows: list[Segment]) -> list[tuple[int, float, int]]:
    """(token, behaviour log-prob, turn) of every position in the loss, row by row."""
    return [(t, lp, turn) for s in rows for t, m, lp, turn in zip(s.tokens, s.loss_mask, s.logprobs, s.turns) if m]


def sampled(records: Sequence[CallRecord]) -> list[tuple[int, float, int]]:
    """(token, behaviour log-prob, action turn) of every token the generator sampled, call by call."""
    return [(t, lp, 2 * r.index + 1) for r in records for c in r.choices for t, lp in zip(c.completion, c.logprobs)]


def through_json(records: Sequence[CallRecord]) -> list[CallRecord]:
    """The records as a store gives them back."""
    return [CallRecord.from_json(json.loads(json.dumps(r.to_json()))) for r in records]


@pytest.fixture(scope="module")
def char() -> tuple[CharTokenizer, TorchGenerator, SamplingParams]:
    return CHAR, tiny_generator(CHAR.vocab_size, range(3, CHAR.vocab_size)), CHAR_PARAMS


@pytest.fixture(scope="module")
def smollm2() -> tuple[HFTokenizer, TorchGenerator, SamplingParams]:
    transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    gguf = Path(smollm2_gguf())
    tokenizer = HFTokenizer(transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    words = tokenizer.encode(SMOL_WORDS)
    assert len(words) == 4, f"{SMOL_WORDS!r} is {len(words)} SmolLM2 ids, expected one per word"
    return tokenizer, tiny_generator(tokenizer.vocab_size, words), SamplingParams(top_k=4, max_tokens=3)


@pytest.mark.parametrize("name", ["char", "smollm2"])
def test_a_conversation_whose_rendering_extends_the_held_ids_is_one_segment(name: str,
                                                                            request: pytest.FixtureRequest) -> None:
    tokenizer, generator, params = request.getfixturevalue(name)
    calls, endpoint, stored = run(tokenizer, generator, params, conversation)
    records = calls.records
    (segment,) = segments(records)
    assert stored == list(records) and [r.index for r in records] == [0, 1, 2]
    assert segment.tokens == endpoint.prompts[2] + list(records[2].choices[0].completion)
    assert trained([segment]) == sampled(records)  # every sampled id once, with its log-prob and action turn
    assert all(lp == 0.0 for lp, m in zip(segment.logprobs, segment.loss_mask) if not m)
    for k, prompt in enumerate(endpoint.prompts):  # the ids call k's prompt adds: observation turn 2k (prompt: 0)
        held = len(endpoint.prompts[k - 1]) + len(records[k - 1].choices[0].completion) if k else 0
        assert segment.turns[held:len(prompt)] == [2 * k] * (len(prompt) - held)
        assert not any(segment.loss_mask[held:len(prompt)])
    assert [r.seed_counters for r in endpoint.generate.requests] == [(*COUNTERS, k + 1) for k in range(3)]
    assert calls.metrics.generated_tokens == len(sampled(records)) and calls.metrics.calls == 3


def test_a_template_that_rewrites_earlier_turns_forks_a_segment_without_retokenizing(smollm2) -> None:
    tokenizer, generator, params = smollm2
    faithful, rewriting = copy.deepcopy(tokenizer.tokenizer), copy.deepcopy(tokenizer.tokenizer)
    faithful.chat_template = REWRITING_TEMPLATE.replace(" | trim", "")
    rewriting.chat_template = REWRITING_TEMPLATE
    assert len(segments(run(HFTokenizer(faithful), generator, params, conversation)[0].records)) == 1
    calls, endpoint, _ = run(HFTokenizer(rewriting), generator, params, conversation)
    rows, records = segments(calls.records), calls.records
    assert len(rows) == 3  # each call re-renders the replies before it otherwise than sampled
    for row, prompt, record in zip(rows, endpoint.prompts, records):
        assert row.tokens == prompt + list(record.choices[0].completion)  # the endpoint's ids and the generator's
        assert row.turns == [0] * len(prompt) + [2 * record.index + 1] * len(record.choices[0].completion)
    assert trained(rows) == sampled(records)


def test_a_program_that_trims_its_context_starts_a_new_segment(char) -> None:
    async def trimming(chat: Chat) -> None:
        first = (await chat([("user", "ab? ")]))[0]
        second = (await chat([("user", "ab? "), ("assistant", first), ("user", " 1?")]))[0]
        await chat([("user", " 1?"), ("assistant", second), ("user", " 2?")])  # the first exchange dropped

    calls, endpoint, _ = run(*char, trimming)
    rows, records = segments(calls.records), calls.records
    assert len(rows) == 2 and rows[0].tokens[:len(endpoint.prompts[1])] == endpoint.prompts[1]
    assert rows[1].tokens == endpoint.prompts[2] + list(records[2].choices[0].completion)
    assert not any(rows[1].loss_mask[:len(endpoint.prompts[2])])  # the second reply, seen again, is trained once
    assert trained(rows) == sampled(records)


def test_a_retried_request_gets_the_same_reply_recorded_once(char) -> None:
    replies = []

    async def retrying(chat: Chat) -> None:
        replies.append(await chat([("user", "ab? ")], 2))
        replies.append(await chat([("user", "ab? ")], 2))  # the client saw no answer and sent it again

    calls, endpoint, stored = run(*char, retrying)
    assert replies[0] == replies[1] and len(stored) == 1 and len(endpoint.generate.requests) == 2
    assert (calls.metrics.calls, calls.metrics.retried_calls) == (1, 1)


def test_a_resumed_program_replays_the_recorded_calls_and_ends_bit_identical(char) -> None:
    whole, _, stored = run(*char, conversation)
    resumed, endpoint, stored_again = run(*char, conversation, earlier=through_json(stored[:2]))  # crashed after 2
    assert [r.seed_counters for r in endpoint.generate.requests] == [(*COUNTERS, 3)]  # calls 0 and 1 replayed
    assert resumed.metrics.replayed_calls == 2 and resumed.metrics.divergences == 0
    assert resumed.metrics.generated_tokens == len(whole.records[2].choices[0].completion)
    assert resumed.metrics.replayed_tokens == whole.records[0].completion_tokens + whole.records[1].completion_tokens
    assert stored_again == [whole.records[2]]
    assert json.dumps([r.to_json() for r in resumed.records]) == json.dumps([r.to_json() for r in whole.records])
    assert segments(resumed.records) == segments(whole.records)
    arrays = [TrajectoryBatch.from_episodes([Episode(1, 2, 5, 0, [], segments(calls.records))], CHAR.pad_id)
              .to_arrays() for calls in (whole, resumed)]
    assert {name: a.tobytes() for name, a in arrays[0].items()} == {name: a.tobytes() for name, a in arrays[1].items()}


def test_a_program_that_changes_a_request_on_rerun_diverges_there(char, caplog: pytest.LogCaptureFixture) -> None:
    first, _, stored = run(*char, conversation)
    with caplog.at_level(logging.WARNING, logger="rl_core.runtime.agent.episode_calls"):
        rerun, endpoint, stored_again = run(*char, lambda chat: conversation(chat, second=" 9?"),
                                            earlier=through_json(stored))
    assert (rerun.metrics.replayed_calls, rerun.metrics.divergences, rerun.metrics.calls) == (1, 1, 3)
    assert len([r for r in caplog.records if "differs from the one an earlier attempt recorded" in r.message]) == 1
    assert rerun.records[0] == first.records[0] and stored_again == list(rerun.records[1:])
    assert [r.seed_counters for r in endpoint.generate.requests] == [(*COUNTERS, 2), (*COUNTERS, 3)]
    assert rerun.records[1].prompt != first.records[1].prompt
    assert rerun.metrics.generated_tokens == rerun.records[1].completion_tokens + rerun.records[2].completion_tokens


def test_with_several_choices_the_episode_follows_the_one_continued(char) -> None:
    async def picking(chat: Chat) -> None:
        replies = await chat([("user", "ab? ")], 3)
        await chat([("user", "ab? "), ("assistant", replies[1]), ("user", " 1?")])

    calls, endpoint, _ = run(*char, picking)
    rows, records = segments(calls.records), calls.records
    assert [r.seed_counters for r in endpoint.generate.requests] == [(*COUNTERS, 1, j) for j in range(3)] + \
        [(*COUNTERS, 2)]
    first, second = records
    assert first.choices[0].completion != first.choices[1].completion  # distinct streams per choice
    assert len(rows) == 3 and rows[0].tokens == endpoint.prompts[1] + list(second.choices[0].completion)
    assert rows[1].tokens == endpoint.prompts[0] + list(first.choices[0].completion)
    assert rows[2].tokens == endpoint.prompts[0] + list(first.choices[2].completion)
    assert sorted(trained(rows)) == sorted(sampled(records))  # every sampled token trained once


def bits(values: Sequence[float]) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def test_the_json_round_trip_keeps_log_probs_to_the_bit(char) -> None:
    calls, _, _ = run(*char, conversation)
    awkward = Choice((4, 5, 6, 7, 8), (-0.0, -5e-324, -0.1, float(torch.tensor(-1 / 3, dtype=torch.float32)),
                                       -1.0000000000000002), "length")
    records = [*calls.records, dataclasses.replace(calls.records[0], index=3, choices=(awkward,))]
    for record, back in zip(records, through_json(records)):
        assert back == record
        assert [bits(c.logprobs) for c in back.choices] == [bits(c.logprobs) for c in record.choices]
    with pytest.raises(ValueError, match=r"keys \['version'\] are missing"):
        CallRecord.from_json({k: v for k, v in records[0].to_json().items() if k != "version"})


def test_earlier_calls_out_of_order_and_a_short_reply_are_refused(char) -> None:
    tokenizer, generator, params = char
    _, _, stored = run(*char, conversation)
    with pytest.raises(ValueError, match=r"indices 0, 1, ... in order; found \[1, 2\]"):
        EpisodeCalls(COUNTERS, stored[1:])

    async def one_short(requests: list[GenerationRequest]) -> list[Generation]:
        return generator.generate(requests[:1], 0)

    with pytest.raises(RuntimeError, match="answered 1 generations for 2 requests"):
        asyncio.run(EpisodeCalls(COUNTERS).call([tokenizer.bos_id], params, 2, "k", one_short))
