"""The OpenAI endpoint, fuzzed (issue 44): whatever body a client posts (random JSON, the request's keys with values of
any type, near-valid requests with one field changed, random bytes), the answer is a 200 or an OpenAI-style 4xx,
never a 5xx and never a hang. Most cases go through Starlette's TestClient (in process, fast; a server exception
would be raised into the test); a share goes to the live server with a client timeout. Both apps sample from a
real TorchGenerator: gymflow's char tokenizer and SmolLM2's chat template."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from rl_core.runtime.agent.chat_rendering import ChatFormat, chat_format
from rl_core.runtime.agent.openai_endpoint import EndpointServer, openai_app
from rl_core.runtime.agent.openai_request import SamplingPolicy
from rl_core.runtime.loopback_server import new_token
from tests.agents.endpoint_helpers import (
    CHAR_CONTEXT,
    CHARS,
    MODEL,
    GeneratorBackend,
    char_generator,
    smollm2_sized_generator,
    smollm2_tokenizer,
)

POLICY = SamplingPolicy(temperature=1.0, top_p=1.0, top_k=0, max_tokens=8, allow_less_random=True, max_n=3)
SMOL_CONTEXT = 384
PATH = "/s/ep/v1/chat/completions"
FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the apps are module-scoped; hypothesis cannot tell



def mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` about three times in four (one_of would pick each branch alike): bodies whose other fields are good
    reach the deeper checks and the generator."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda pick: valid if pick else other)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
texts = st.text(alphabet=CHARS.alphabet, max_size=20) | st.text(max_size=20)
tool_calls = st.lists(st.fixed_dictionaries({"id": st.text(max_size=6), "type": st.just("function"), "function":
                                             st.fixed_dictionaries({"name": st.text(max_size=6),
                                                                    "arguments": st.text(max_size=12)})}),
                      max_size=2)
good_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                     "content": st.text(alphabet=CHARS.alphabet, max_size=20)})
messages = st.lists(mostly(good_message, st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
                    st.sampled_from(["function", "bot"]) | json_values)},
    optional={"content": mostly(texts, st.none() | json_values), "tool_calls": tool_calls | json_values,
              "tool_call_id": st.text(max_size=6) | json_values, "name": st.text(max_size=6)})), max_size=4)
tools = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.text(max_size=6)}, optional={"description": st.text(max_size=12), "parameters": json_values})}),
    max_size=2)
WIDE = {"n": st.integers(-1, 4), "temperature": st.floats(-1, 3), "top_p": st.floats(-0.5, 1.5),
        "top_k": st.integers(-2, 40), "max_tokens": st.integers(-2, 200), "max_completion_tokens": st.integers(-2, 20),
        "stop": texts | st.lists(texts, max_size=5), "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "tools": tools,
        "tool_choice": st.sampled_from(["auto", "none", "required"]), "presence_penalty": st.floats(-2, 2),
        "logit_bias": st.dictionaries(st.text(max_size=3), st.floats(-5, 5), max_size=2)}
"""Each sampling field over a range wider than the run allows."""
ALLOWED = {"n": st.integers(1, POLICY.max_n), "temperature": st.floats(1e-3, 1), "top_p": st.floats(1e-3, 1),
           "top_k": st.integers(0, 40), "max_tokens": st.integers(1, POLICY.max_tokens),
           "max_completion_tokens": st.integers(1, POLICY.max_tokens),
           "stop": st.lists(st.text(alphabet=CHARS.alphabet, min_size=1, max_size=3), max_size=4),
           "stream": st.booleans(), "stream_options": WIDE["stream_options"],
           "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
               {"name": st.text(CHARS.alphabet, min_size=1, max_size=6), "parameters": st.just({"type": "object"})})}),
               max_size=2),
           "tool_choice": st.sampled_from(["auto", "none"]), "presence_penalty": st.just(0), "logit_bias": st.just({})}
"""Each sampling field within what the run allows."""
keyed_bodies = st.fixed_dictionaries(
    {"model": mostly(st.just(MODEL), json_values), "messages": mostly(messages, json_values)},
    optional={key: values | json_values for key, values in WIDE.items()} | {"extra_field": json_values})
near_valid = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": mostly(st.lists(good_message, min_size=1, max_size=3), messages)},
    optional={key: mostly(ALLOWED[key], WIDE[key] | json_values) for key in WIDE})

def chat_formats() -> dict[str, tuple[ChatFormat, Any, int]]:
    return {"char": (chat_format(CHARS), char_generator, CHAR_CONTEXT),
            "smollm2": (chat_format(smollm2_tokenizer()), lambda: smollm2_sized_generator(SMOL_CONTEXT), SMOL_CONTEXT)}


@pytest.fixture(scope="module", params=["char", "smollm2"])
def app(request: pytest.FixtureRequest) -> tuple[Any, str]:
    chat, make_generator, context = chat_formats()[request.param]
    backend = GeneratorBackend(make_generator())
    backend.open("ep")
    token = new_token()
    return openai_app(backend, model_name=MODEL, token=token, policy=POLICY, chat=chat, context=context), token


@pytest.fixture(scope="module")
def client(app: tuple[Any, str]) -> Iterator[TestClient]:
    asgi, token = app
    with TestClient(asgi, headers={"Authorization": f"Bearer {token}"}) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def live(app: tuple[Any, str]) -> Iterator[httpx.Client]:
    asgi, token = app
    with EndpointServer(asgi) as server, httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=20,
                                                      headers={"Authorization": f"Bearer {token}"}) as http:
        yield http


def check(response: httpx.Response, sent: Any) -> None:
    """A 200 (a completion, or its event stream) or a 4xx with OpenAI's error body."""
    assert response.status_code == 200 or 400 <= response.status_code < 500, (response.status_code, sent)
    if response.status_code != 200:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"], sent
        assert error["type"] == "invalid_request_error" and isinstance(error["param"], str | None), sent
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n"), sent
    else:
        assert response.json()["object"] == "chat.completion", sent


def encoded(body: Any) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity as JavaScript writes them, which some clients send


@settings(max_examples=60, suppress_health_check=FIXTURE_OK)
@given(body=json_values)
def test_any_json_value_is_answered(client: TestClient, body: Any) -> None:
    check(client.post(PATH, content=encoded(body)), body)


@settings(max_examples=80, suppress_health_check=FIXTURE_OK)
@given(body=keyed_bodies)
def test_the_requests_keys_with_any_values_are_answered(client: TestClient, body: dict[str, Any]) -> None:
    check(client.post(PATH, content=encoded(body)), body)


@settings(max_examples=60, suppress_health_check=FIXTURE_OK)
@given(body=near_valid)
def test_a_near_valid_request_is_answered(client: TestClient, body: dict[str, Any]) -> None:
    check(client.post(PATH, content=encoded(body)), body)


@settings(max_examples=40, suppress_health_check=FIXTURE_OK)
@given(body=st.binary(max_size=200))
def test_random_bytes_are_answered(client: TestClient, body: bytes) -> None:
    check(client.post(PATH, content=body), body)


@settings(max_examples=25, suppress_health_check=FIXTURE_OK)
@given(body=keyed_bodies | near_valid | json_values.map(encoded) | st.binary(max_size=100))
def test_the_live_server_answers_in_time(live: httpx.Client, body: Any) -> None:
    check(live.post(PATH, content=body if isinstance(body, bytes) else encoded(body)), body)
