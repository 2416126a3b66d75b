"""Tool calls in a completion's text, in the model's own format, turned into OpenAI `tool_calls` and back.

A chat model calls a tool by writing text: SmolLM2-Instruct and Hermes/Qwen2.5-style templates write
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks, some models a bare JSON list
`[{"name": ..., "arguments": {...}}]`. An agent program talking to a stock OpenAI client expects
`message.tool_calls` instead, so the endpoint parses them out (only when the request offered `tools`). What does not
parse stays text: a model half-way through learning the format gets its words back, not an error.

`format_tool_call` writes a call back in the block format, for chat templates that cannot render an assistant
message's `tool_calls`: the conversation the model sees next then holds the call as it would have written it.

A model without a chat template (gymflow's character models) has no block format: its env teaches it one of its own,
e.g. LookupCalc's `<calc>374*56</calc>`, answered by `<out>20944</out>`. Such an env declares it as its
`tool_format` (`rl_core.envs.agent.tagged_tools`), and the endpoint parses and renders that format instead
(`ToolFormat`), so a program using
OpenAI tool calling sees `tool_calls` and the model sees its own tags, with not one token changed.
"""
from __future__ import annotations

import json
import re
from typing import Any, Protocol

BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
"""One Hermes-style block; its body is a JSON object or a JSON list of them."""


def parse_tool_calls(text: str, id_prefix: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(the text without the calls, or None when nothing else is left; the calls as OpenAI `tool_calls` dicts).

    Call k (from 0, in order of writing) gets the id `f"{id_prefix}_{k}"`, so a replayed completion gets the same
    ids; pass a prefix unique within the episode (the endpoint uses the request's digest). `arguments` is a JSON
    string, as OpenAI's API sends it. A block whose body is not a list of calls stays in the text, as written."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for block in BLOCK.finditer(text):
        parsed = _calls(block.group(1))
        if parsed is None:
            continue
        kept.append(text[position:block.start()])
        position = block.end()
        calls.extend(parsed)
    kept.append(text[position:])
    if not calls:
        whole = _calls(text.strip()) if text.strip().startswith("[") else None
        if whole:
            calls, kept = whole, []
    if not calls:
        return (text or None), []
    content = "".join(kept).strip()
    tool_calls = [{"id": f"{id_prefix}_{k}", "type": "function", "function": {"name": name, "arguments": arguments}}
                  for k, (name, arguments) in enumerate(calls)]
    return (content or None), tool_calls


def format_tool_call(name: str, arguments: str) -> str:
    """The block a model writes for one call (`arguments` a JSON string, as OpenAI's API carries it; written as
    the object it encodes when it is one)."""
    try:
        value: Any = json.loads(arguments)
    except ValueError:
        value = arguments
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": value}, ensure_ascii=False) + "\n</tool_call>"


def _calls(body: str) -> list[tuple[str, str]] | None:
    """The (name, arguments JSON string) calls of a block body, or None unless every item is a well-formed call."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item) for item in items]
    if not items or any(call is None for call in calls):
        return None
    return calls  # type: ignore[return-value]  # no None left


def _call(item: Any) -> tuple[str, str] | None:
    """One call: {"name": str, "arguments": object} (or "parameters", as Llama 3's template writes it); arguments
    that are already a JSON string of an object are kept as that string."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return None
        return (item["name"], arguments) if isinstance(decoded, dict) else None
    if not isinstance(arguments, dict):
        return None
    return item["name"], json.dumps(arguments, ensure_ascii=False)


class ToolFormat(Protocol):
    """How one model writes tool calls and reads their results, as text."""

    def parse(self, text: str, id_prefix: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(the text without its calls, or None; the calls as OpenAI `tool_calls` dicts), as `parse_tool_calls`."""

    def assistant_text(self, content: str | None, calls: list[dict[str, Any]]) -> str:
        """An assistant turn with calls as the model wrote it (`content` and the calls' text)."""

    def result_text(self, content: str) -> str:
        """A tool message's content as the model reads it, where no chat template frames it."""


class HermesBlocks:
    """`<tool_call>` JSON blocks (SmolLM2-Instruct, Hermes, Qwen2.5): the format of templated models."""

    def parse(self, text: str, id_prefix: str) -> tuple[str | None, list[dict[str, Any]]]:
        return parse_tool_calls(text, id_prefix)

    def assistant_text(self, content: str | None, calls: list[dict[str, Any]]) -> str:
        blocks = [format_tool_call(call["function"]["name"], call["function"]["arguments"]) for call in calls]
        return "\n".join(part for part in [content, *blocks] if part)

    def result_text(self, content: str) -> str:
        return content
