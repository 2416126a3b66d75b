"""A character model's own tool-call format (`TaggedTools`, LookupCalc's `<look>17</look>`): parsed into OpenAI
`tool_calls` by the endpoint, and a program's call and `tool` message rendered back into exactly the characters the
model wrote and reads."""
from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from rl_core.envs.agent.lookup_calc import ALPHABET, TOOL_FORMAT, TOOLS
from rl_core.generation.base import Generation, SamplingParams
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.runtime.agent.chat_rendering import chat_format
from rl_core.runtime.agent.openai_request import SamplingPolicy
from tests.agents.endpoint_helpers import MODEL, GeneratorBackend, char_generator, served

CHARS = CharTokenizer(ALPHABET)
POLICY = SamplingPolicy(temperature=1.0, top_p=1.0, top_k=0, max_tokens=16)
PROMPT = [{"role": "user", "content": "$17*56="}]


@pytest.mark.parametrize("text", ["<look>17</look>", "<calc>374*56</calc>", "<look>1</look><calc>2*3</calc>",
                                  "12<calc>1*2</calc>", "<calc></calc>", "<calc>a<look>b</calc>"])
def test_a_call_and_its_text_round_trip_exactly(text: str) -> None:
    content, calls = TOOL_FORMAT.parse(text, "id")
    assert calls and [call["id"] for call in calls] == [f"id_{k}" for k in range(len(calls))]
    assert TOOL_FORMAT.assistant_text(content, calls) == text


@pytest.mark.parametrize("text", ["<ans>3</ans>", "<look>17", "look>17</look>", ""])
def test_text_that_holds_no_whole_call_stays_text(text: str) -> None:
    assert TOOL_FORMAT.parse(text, "id") == (text or None, [])


@pytest.mark.parametrize("function, error", [({"name": "search", "arguments": '{"q": "x"}'}, "not one this model"),
                                             ({"name": "lookup", "arguments": '{"key": "17"}'}, "one string argument"),
                                             ({"name": "lookup", "arguments": '{"item": 17}'}, "one string argument"),
                                             ({"name": "lookup", "arguments": "17"}, "one string argument")])
def test_a_call_the_model_cannot_write_is_refused(function: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        TOOL_FORMAT.assistant_text(None, [{"id": "c", "type": "function", "function": function}])


class WritesALookup(GeneratorBackend):
    """Answers every request with what a model that learnt LookupCalc's format writes first: `<look>17</look>`."""

    async def complete(self, session: str, prompt_ids: list[int], params: SamplingParams, n: int,
                       request_key: str) -> list[Generation]:
        self.calls.append((session, prompt_ids, params, n, request_key))
        ids = tuple(CHARS.encode("<look>17</look>"))
        return [Generation(tuple(prompt_ids), ids, (0.0,) * len(ids), "stop", 0)] * n


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[openai.OpenAI, WritesALookup]]:
    backend = WritesALookup(char_generator())
    backend.open("ep")
    with served(backend, chat_format(CHARS, TOOL_FORMAT), POLICY, 96) as (server, token):
        yield openai.OpenAI(base_url=server.base_url_for("ep"), api_key=token, max_retries=0), backend


def test_the_endpoint_hands_a_tagged_call_over_as_tool_calls_and_renders_the_result_as_the_model_reads_it(
        client) -> None:
    openai_client, backend = client
    answer = openai_client.chat.completions.create(model=MODEL, messages=PROMPT, tools=list(TOOLS), stop=["</look>"])
    choice, first_prompt = answer.choices[0], backend.calls[-1][1]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("lookup", {"item": "17"})]
    result = {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "374"}
    openai_client.chat.completions.create(model=MODEL, tools=list(TOOLS), messages=[
        *PROMPT, choice.message.model_dump(include={"role", "content", "tool_calls"}), result])
    assert backend.calls[-1][1] == [*first_prompt, *CHARS.encode("<look>17</look><out>374</out>")]
    without_tools = openai_client.chat.completions.create(model=MODEL, messages=PROMPT)
    assert without_tools.choices[0].message.content == "<look>17</look>"  # no tools offered: the text as written


def test_a_call_the_model_cannot_write_is_a_400_naming_the_messages(client) -> None:
    openai_client, _ = client
    unknown = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}
    with pytest.raises(openai.BadRequestError, match="not one this model can call") as refused:
        openai_client.chat.completions.create(model=MODEL, tools=list(TOOLS), messages=[*PROMPT, unknown])
    assert refused.value.body["param"] == "messages"
