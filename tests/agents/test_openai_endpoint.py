"""gymflow's OpenAI endpoint (issue 44) through the stock `openai` SDK, sync and async, against a live uvicorn server
on 127.0.0.1 whose backend samples from a real TorchGenerator: completions, streaming, n, stop, max_tokens, the
sampling rule, tokens, sessions, refusals that name the field, the context, and the request key a replay needs.
Tool calls: SmolLM2's chat template renders the tools and the calls, and a call the model writes comes back as
`tool_calls` (written by a scripted backend: a random tiny model never writes one)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from rl_core.generation.base import Generation, SamplingParams
from rl_core.runtime.agent.chat_rendering import chat_format
from rl_core.runtime.agent.openai_endpoint import EndpointServer, openai_app
from rl_core.runtime.agent.openai_request import SamplingPolicy
from rl_core.runtime.loopback_server import new_token
from tests.agents.endpoint_helpers import (
    CHAR_CONTEXT,
    CHARS,
    MODEL,
    GeneratorBackend,
    char_generator,
    served,
    smollm2_sized_generator,
    smollm2_tokenizer,
)

POLICY = SamplingPolicy(temperature=1.0, top_p=0.95, top_k=0, max_tokens=16)
USER = [{"role": "user", "content": "12+34="}]


class Endpoint:
    """A served app, its backend and a client factory."""

    def __init__(self, server: EndpointServer, token: str, backend: GeneratorBackend) -> None:
        self.server, self.token, self.backend = server, token, backend

    def client(self, session: str = "ep1", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.base_url_for(session), api_key=self.token, max_retries=0, **kwargs)

    def post(self, body: Any, session: str = "ep1", token: str | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        return httpx.post(f"{self.server.base_url_for(session)}/chat/completions", content=content,
                          headers=headers, timeout=30)


def _endpoint(policy: SamplingPolicy) -> Iterator[Endpoint]:
    backend = GeneratorBackend(char_generator())
    backend.open("ep1")
    backend.open("ep2")
    with served(backend, chat_format(CHARS), policy, CHAR_CONTEXT) as (server, token):
        yield Endpoint(server, token, backend)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    yield from _endpoint(POLICY)


@pytest.fixture(scope="module")
def lenient() -> Iterator[Endpoint]:
    """A run that lets requests ask for less randomness."""
    yield from _endpoint(SamplingPolicy(temperature=1.0, top_p=0.95, top_k=0, max_tokens=16, allow_less_random=True))


def test_a_completion_through_the_sync_sdk_samples_with_the_runs_values(endpoint: Endpoint) -> None:
    answer = endpoint.client().chat.completions.create(model=MODEL, messages=USER)
    choice = answer.choices[0]
    assert answer.object == "chat.completion" and answer.model == MODEL and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    session, prompt, params, n, _ = endpoint.backend.calls[-1]
    assert (session, prompt, n) == ("ep1", CHARS.conversation_ids([("user", "12+34=")]), 1)
    assert params == SamplingParams(1.0, 0.95, 0, 16, ((CHARS.eos_id,),))
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.total_tokens == len(prompt) + answer.usage.completion_tokens
    assert answer.usage.completion_tokens >= len(choice.message.content)  # eos counts, but is not text


def test_concurrent_sessions_through_the_async_sdk(endpoint: Endpoint) -> None:
    async def ask(session: str) -> str:
        client = openai.AsyncOpenAI(base_url=endpoint.server.base_url_for(session), api_key=endpoint.token,
                                    max_retries=0)
        async with client:
            answer = await client.chat.completions.create(model=MODEL, messages=USER)
        return answer.choices[0].message.content

    async def both() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(ask("ep1"), ask("ep2")), 60)

    first, second = asyncio.run(both())
    assert first != second  # each session has its own seed counters
    assert asyncio.run(ask("ep1")) == first  # and a replayed request draws the same tokens


def test_streaming_through_the_sdk_sends_the_same_completion_in_pieces(endpoint: Endpoint) -> None:
    client = endpoint.client()
    whole = client.chat.completions.create(model=MODEL, messages=USER)
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_n_samples_come_back_as_indexed_choices(endpoint: Endpoint) -> None:
    answer = endpoint.client().chat.completions.create(model=MODEL, messages=USER, n=2)
    assert [c.index for c in answer.choices] == [0, 1]
    assert answer.choices[0].message.content != answer.choices[1].message.content
    assert endpoint.backend.calls[-1][3] == 2


def test_a_stop_string_ends_the_completion_and_is_left_out_of_the_content(endpoint: Endpoint) -> None:
    client, stopped, stops = endpoint.client(), 0, ["B", ";", ".", "2"]  # characters this model writes often
    for question in ("12+34=", "5*6=", "7-1="):
        asked = [{"role": "user", "content": question}]
        choice = client.chat.completions.create(model=MODEL, messages=asked, stop=stops).choices[0]
        params = endpoint.backend.calls[-1][2]
        assert params.stop == (*(tuple(CHARS.encode(s)) for s in stops), (CHARS.eos_id,))
        assert not set(choice.message.content) & set("".join(stops))
        generated = endpoint.backend.generations[-1][0].completion
        if choice.finish_reason == "stop":  # the stop string (or eos) ends what was generated, not the content
            stopped += 1
            assert CHARS.decode(generated[-1:]) in stops or generated[-1] == CHARS.eos_id
        assert choice.message.content == CHARS.decode(generated[:-1] if choice.finish_reason == "stop" else generated)
    assert stopped  # the model wrote one of the stop strings at least once


def test_max_tokens_below_the_ceiling_is_honoured(endpoint: Endpoint) -> None:
    client = endpoint.client()
    answer = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert endpoint.backend.calls[-1][2].max_tokens == 3 and answer.usage.completion_tokens <= 3
    client.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=5)
    assert endpoint.backend.calls[-1][2].max_tokens == 5
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=17)
    assert refused.value.param == "max_tokens" and "ceiling 16" in refused.value.message


def test_the_models_list_names_the_runs_model(endpoint: Endpoint) -> None:
    assert [(m.id, m.owned_by) for m in endpoint.client().models.list()] == [(MODEL, "gymflow")]


def test_a_wrong_or_missing_token_gets_401(endpoint: Endpoint) -> None:
    wrong = openai.OpenAI(base_url=endpoint.server.base_url_for("ep1"), api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL, messages=USER)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert httpx.get(f"{endpoint.server.base_url_for('ep1')}/models").status_code == 401
    assert endpoint.post({"model": MODEL, "messages": USER}, token=endpoint.token + "x").status_code == 401
    assert httpx.post(f"{endpoint.server.base_url_for('unknown')}/chat/completions", content=b"{").status_code == 401


def test_an_unknown_closed_or_ended_session_is_refused(endpoint: Endpoint) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        endpoint.client("nobody").chat.completions.create(model=MODEL, messages=USER)
    assert unknown.value.code == "session_not_found"
    endpoint.backend.open("short")
    endpoint.client("short").chat.completions.create(model=MODEL, messages=USER)
    endpoint.backend.close("short")
    with pytest.raises(openai.NotFoundError):
        endpoint.client("short").models.list()
    endpoint.backend.open("ending")
    endpoint.backend.ended.add("ending")
    before = len(endpoint.backend.calls)
    retrying = openai.OpenAI(base_url=endpoint.server.base_url_for("ending"), api_key=endpoint.token, max_retries=2)
    with pytest.raises(openai.ConflictError) as ended:
        retrying.chat.completions.create(model=MODEL, messages=USER)
    assert ended.value.code == "session_ended" and ended.value.response.headers["x-should-retry"] == "false"
    assert len(endpoint.backend.calls) == before


VALID = {"model": MODEL, "messages": USER}
CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
INVALID = [  # (what the body changes, the status, the field named)
    ({"messages": []}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content"),
    ({"messages": [*USER, {"role": "tool", "content": "5"}]}, 400, "messages[1].tool_call_id"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []},  # an empty list carries no call
                   {"role": "user", "content": "x", "tool_calls": [CALL]}]}, 400, "messages[1].tool_calls"),
    ({"messages": [{"role": "user", "content": "é"}]}, 400, "messages"),  # not in the char model's alphabet
    ({"model": "gpt-4o"}, 404, "model"),
    ({"model": 4}, 400, "model"),
    ({"n": 0}, 400, "n"),
    ({"n": 17}, 400, "n"),
    ({"n": "2"}, 400, "n"),
    ({"n": True}, 400, "n"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"top_p": [1]}, 400, "top_p"),
    ({"top_k": 2.5}, 400, "top_k"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 10 ** 30}, 400, "max_tokens"),
    ({"max_tokens": 4, "max_completion_tokens": 5}, 400, "max_completion_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"stop": ""}, 400, "stop"),
    ({"stop": 5}, 400, "stop"),
    ({"stream": "yes"}, 400, "stream"),
    ({"stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage"),
    ({"tools": [{"type": "function"}]}, 400, "tools[0].function"),
    ({"tools": {"name": "f"}}, 400, "tools"),
    ({"tool_choice": "required"}, 400, "tool_choice"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"frequency_penalty": -1}, 400, "frequency_penalty"),
    ({"logit_bias": {"5": 10}}, 400, "logit_bias"),
]


@pytest.mark.parametrize("change,status,param", INVALID, ids=[p + ":" + json.dumps(c)[:40] for c, _, p in INVALID])
def test_an_invalid_field_is_refused_naming_it(endpoint: Endpoint, change: dict[str, Any], status: int,
                                                param: str) -> None:
    response = endpoint.post(VALID | change)
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (status, param), error
    assert error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize("body", [b"", b"{", b"null", b"[]", b'"x"', b"\xff\xfe"])
def test_a_body_that_is_not_a_request_object_is_400(endpoint: Endpoint, body: bytes) -> None:
    response = endpoint.post(body)
    assert response.status_code == 400 and response.json()["error"]["param"] is None


def test_unknown_fields_are_ignored(endpoint: Endpoint) -> None:
    extras = {"user": "u", "seed": 3, "metadata": {"a": "b"}, "store": False, "parallel_tool_calls": True,
              "response_format": {"type": "text"}, "logprobs": False, "something_new": [1, {"x": None}]}
    assert endpoint.post(VALID | extras).status_code == 200


@pytest.mark.parametrize("field,value", [("temperature", 1.5), ("temperature", 0.5), ("top_p", 0.99),
                                         ("top_p", 0.5), ("top_k", 5)])
def test_a_strict_run_refuses_any_other_sampling_value(endpoint: Endpoint, field: str, value: float) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        endpoint.client().chat.completions.create(model=MODEL, messages=USER, extra_body={field: value})
    assert refused.value.param == field and "does not let a request change it" in refused.value.message


def test_the_runs_own_values_sent_explicitly_are_accepted(endpoint: Endpoint) -> None:
    endpoint.client().chat.completions.create(model=MODEL, messages=USER, temperature=1.0, top_p=0.95,
                                              extra_body={"top_k": 0})
    assert endpoint.backend.calls[-1][2].temperature == 1.0


@pytest.mark.parametrize("field,value", [("temperature", 0.5), ("temperature", 1e-3), ("top_p", 0.5),
                                         ("top_k", 5), ("top_k", 1)])
def test_a_lenient_run_accepts_less_randomness(lenient: Endpoint, field: str, value: float) -> None:
    lenient.client().chat.completions.create(model=MODEL, messages=USER, extra_body={field: value})
    assert getattr(lenient.backend.calls[-1][2], field) == value


@pytest.mark.parametrize("field,value", [("temperature", 1.5), ("temperature", 0), ("top_p", 0.99), ("top_p", 0),
                                         ("top_k", -1)])
def test_a_lenient_run_still_refuses_more_randomness(lenient: Endpoint, field: str, value: float) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        lenient.client().chat.completions.create(model=MODEL, messages=USER, extra_body={field: value})
    assert refused.value.param == field and "a request may" in refused.value.message


def test_a_conversation_longer_than_the_context_is_refused(endpoint: Endpoint) -> None:
    long = [{"role": "user", "content": "1" * CHAR_CONTEXT}]
    response = endpoint.post({"model": MODEL, "messages": long})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "messages")
    assert response.json()["error"]["code"] == "context_length_exceeded"
    nearly = [{"role": "user", "content": "1" * (CHAR_CONTEXT - 6)}]  # bos + 90 characters: 5 positions left
    response = endpoint.post({"model": MODEL, "messages": nearly, "max_tokens": 6})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "max_tokens")
    assert "lower max_tokens to at most 5" in response.json()["error"]["message"]
    answer = endpoint.client().chat.completions.create(model=MODEL, messages=nearly)  # no max_tokens: the room left
    assert endpoint.backend.calls[-1][2].max_tokens == 5 and answer.usage.total_tokens <= CHAR_CONTEXT


def test_an_identical_request_has_the_same_request_key(endpoint: Endpoint) -> None:
    client = endpoint.client()

    def key_of(**kwargs: Any) -> str:
        client.chat.completions.create(model=MODEL, messages=USER, **kwargs)
        return endpoint.backend.calls[-1][4]

    key = key_of()
    assert key_of() == key
    assert key_of(temperature=1.0, top_p=0.95, max_tokens=16, extra_body={"user": "someone"}) == key
    assert len(key) == 64 and int(key, 16) >= 0
    assert key_of(max_tokens=15) != key and key_of(n=2) != key and key_of(stop="a") != key
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "12+35="}])
    assert endpoint.backend.calls[-1][4] != key


def test_the_server_serves_loopback_only_and_stops() -> None:
    backend = GeneratorBackend(char_generator())
    backend.open("s")
    app = openai_app(backend, model_name=MODEL, token=new_token(), policy=POLICY, chat=chat_format(CHARS),
                     context=CHAR_CONTEXT)
    with EndpointServer(app) as server:
        assert server.base_url_for("a b/c") == f"http://127.0.0.1:{server.port}/s/a%20b%2Fc/v1"
        assert httpx.get(f"http://127.0.0.1:{server.port}/nowhere").status_code == 404
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{server.port}/s/s/v1/models", timeout=5)


# SmolLM2's chat template: tools, tool calls and tool results, rendered and parsed.

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
SMOL_CONTEXT = 512


class ScriptedBackend(GeneratorBackend):
    """Answers every request with `CALL_TEXT` and eos: the completion a model that calls tools writes."""

    async def complete(self, session: str, prompt_ids: list[int], params: SamplingParams, n: int,
                       request_key: str) -> list[Generation]:
        self.calls.append((session, prompt_ids, params, n, request_key))
        ids = (*smollm2_tokenizer().encode(CALL_TEXT), smollm2_tokenizer().eos_id)
        return [Generation(tuple(prompt_ids), ids, (0.0,) * len(ids), "stop", 0)] * n


@pytest.fixture(scope="module")
def smol() -> Iterator[Endpoint]:
    backend = GeneratorBackend(smollm2_sized_generator(SMOL_CONTEXT))
    backend.open("ep1")
    with served(backend, chat_format(smollm2_tokenizer()), POLICY, SMOL_CONTEXT) as (server, token):
        yield Endpoint(server, token, backend)


@pytest.fixture(scope="module")
def scripted() -> Iterator[Endpoint]:
    backend = ScriptedBackend(smollm2_sized_generator(SMOL_CONTEXT))
    backend.open("ep1")
    with served(backend, chat_format(smollm2_tokenizer()), POLICY, SMOL_CONTEXT) as (server, token):
        yield Endpoint(server, token, backend)


def test_a_plain_chat_renders_as_the_tokenizers_conversation_ids(smol: Endpoint) -> None:
    smol.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2+3?"}])
    assert smol.backend.calls[-1][1] == smollm2_tokenizer().conversation_ids([("user", "What is 2+3?")])
    assert smol.backend.calls[-1][2].stop == ((smollm2_tokenizer().eos_id,),)


def test_offered_tools_reach_the_prompt_of_a_template_that_does_not_render_them(smol: Endpoint) -> None:
    answer = smol.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "2+3?"}],
                                                   tools=TOOLS)
    prompt = smollm2_tokenizer().tokenizer.decode(smol.backend.calls[-1][1])
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert answer.choices[0].finish_reason in ("stop", "length")  # a random model writes no call


def test_a_written_tool_call_comes_back_as_tool_calls_and_renders_back_exactly(scripted: Endpoint) -> None:
    client, asked = scripted.client(), [{"role": "user", "content": "What is 2+3?"}]
    answer = client.chat.completions.create(model=MODEL, messages=asked, tools=TOOLS)
    choice = answer.choices[0]
    first_prompt, key = scripted.backend.calls[-1][1], scripted.backend.calls[-1][4]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert (call.id, call.type, call.function.name) == (f"call_{key[:16]}_0_0", "function", "add")
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    streamed = list(client.chat.completions.create(model=MODEL, messages=asked, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices[0].delta.tool_calls]
    assert [(d[0].id, d[0].function.name, d[0].function.arguments) for d in deltas] == [
        (call.id, "add", call.function.arguments)]
    # The agent sends the call and its result back: the conversation holds the call as the model wrote it.
    result = {"role": "tool", "tool_call_id": call.id, "content": "5"}
    client.chat.completions.create(model=MODEL, tools=TOOLS,
                                   messages=[*asked, choice.message.model_dump(exclude_none=True), result])
    second_prompt = scripted.backend.calls[-1][1]
    written = [*first_prompt, *smollm2_tokenizer().encode(CALL_TEXT), smollm2_tokenizer().eos_id]
    assert second_prompt[:len(written)] == written


def test_tool_choice_none_leaves_a_call_as_text(scripted: Endpoint) -> None:
    answer = scripted.client().chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="none")
    assert answer.choices[0].message.content == CALL_TEXT and answer.choices[0].finish_reason == "stop"
    no_tools = scripted.client().chat.completions.create(model=MODEL, messages=USER)
    assert no_tools.choices[0].message.tool_calls is None
