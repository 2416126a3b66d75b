"""Tool calls written in the model's own format (Hermes/Qwen2.5/SmolLM2 `<tool_call>` blocks, a bare JSON list) come
out as OpenAI `tool_calls` with deterministic ids and JSON-string arguments; what does not parse stays text."""
from __future__ import annotations

import json

import pytest

from rl_core.runtime.agent.tool_calls import format_tool_call, parse_tool_calls


def test_a_hermes_block_becomes_an_openai_tool_call() -> None:
    text = 'Let me add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = parse_tool_calls(text, "call_ep1")
    assert content == "Let me add them."
    assert calls == [{"id": "call_ep1_0", "type": "function",
                      "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}


def test_several_blocks_and_a_list_in_a_block_are_numbered_in_order() -> None:
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call> and '
            '<tool_call>[{"name": "b", "arguments": {"x": 1}}, {"name": "c", "parameters": {"y": "z"}}]</tool_call>')
    content, calls = parse_tool_calls(text, "p")
    assert content == "and"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("p_0", "a", "{}"), ("p_1", "b", '{"x": 1}'), ("p_2", "c", '{"y": "z"}')]


def test_a_bare_json_list_of_calls_is_parsed_and_leaves_no_content() -> None:
    content, calls = parse_tool_calls(' [{"name": "search", "arguments": {"q": "café"}}] ', "id")
    assert content is None
    assert calls[0]["function"] == {"name": "search", "arguments": '{"q": "café"}'}


def test_arguments_already_a_json_string_are_kept_as_written() -> None:
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"k\\":1}"}</tool_call>', "id")
    assert calls[0]["function"]["arguments"] == '{"k":1}'


@pytest.mark.parametrize("text", [
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>',
    '<tool_call>[]</tool_call>',
    '<tool_call>{"name": "f", "arguments": {}}',  # never closed (the completion ran out of tokens)
    '[1, 2, 3]',
    '["name", "arguments"]',
    "just an answer",
])
def test_what_does_not_parse_stays_content(text: str) -> None:
    assert parse_tool_calls(text, "id") == (text, [])


def test_a_bad_block_stays_while_a_good_one_is_taken() -> None:
    text = '<tool_call>oops</tool_call>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text, "id")
    assert content == "<tool_call>oops</tool_call>" and [c["function"]["name"] for c in calls] == ["f"]


def test_empty_text_is_no_content() -> None:
    assert parse_tool_calls("", "id") == (None, [])


def test_a_formatted_call_parses_back_to_itself() -> None:
    block = format_tool_call("add", '{"a": 2, "b": [3, "é"]}')
    assert block == '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": [3, "é"]}}\n</tool_call>'
    assert parse_tool_calls(block, "id")[1][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": [3, "é"]}'}
