"""The tool-call format of a character model: a tool's tags around its one argument, e.g. `<calc>374*56</calc>`.

A model with a chat template writes calls in its template's format; a character model writes what its env taught it.
An env that offers tools declares that format (`tool_format = TaggedTools(...)`), so the OpenAI endpoint can turn
the model's text into `tool_calls` for an agent program, and a program's `tool` messages back into the text the
model reads, with not one character changed either way (`rl_core.runtime.agent.tool_calls.ToolFormat`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaggedTool:
    """A tool whose one string argument the model writes between two tags: `<calc>374*56</calc>` is the call
    `calculator(expression="374*56")`."""

    name: str
    argument: str
    open: str
    close: str


@dataclass(frozen=True)
class TaggedTools:
    """A character model's tool format: each call is a tool's tags around its argument, written one after another
    (no separator), and a result is `result_open` + the tool's output + `result_close`. A call and its text round-trip
    exactly: `assistant_text` writes back the characters `parse` read."""

    tools: tuple[TaggedTool, ...]
    result_open: str
    result_close: str

    def __post_init__(self) -> None:
        alternatives = "|".join(f"{re.escape(t.open)}(.*?){re.escape(t.close)}" for t in self.tools)
        object.__setattr__(self, "_call", re.compile(alternatives, re.DOTALL))

    def parse(self, text: str, id_prefix: str) -> tuple[str | None, list[dict[str, Any]]]:
        calls, kept, position = [], [], 0
        for match in self._call.finditer(text):  # type: ignore[attr-defined]  # set in __post_init__
            tool = self.tools[match.lastindex - 1]
            kept.append(text[position:match.start()])
            position = match.end()
            calls.append({"id": f"{id_prefix}_{len(calls)}", "type": "function",
                          "function": {"name": tool.name, "arguments": json.dumps({tool.argument: match.group(
                              match.lastindex)}, ensure_ascii=False)}})
        if not calls:
            return (text or None), []
        kept.append(text[position:])
        return ("".join(kept) or None), calls

    def call(self, text: str) -> tuple[TaggedTool, str] | None:
        """(the tool, its argument) when `text` is exactly one call, else None: what an env's `step` runs."""
        match = self._call.fullmatch(text)  # type: ignore[attr-defined]  # set in __post_init__
        return None if match is None else (self.tools[match.lastindex - 1], match.group(match.lastindex))

    def assistant_text(self, content: str | None, calls: list[dict[str, Any]]) -> str:
        return (content or "") + "".join(self._call_text(call["function"]) for call in calls)

    def result_text(self, content: str) -> str:
        return f"{self.result_open}{content}{self.result_close}"

    def _call_text(self, function: dict[str, Any]) -> str:
        """A call as the model writes it; a tool it does not know, or arguments other than the tool's one string, is
        a client error (a ValueError: the endpoint answers 400)."""
        tool = next((t for t in self.tools if t.name == function["name"]), None)
        if tool is None:
            raise ValueError(f"tool {function['name']!r} is not one this model can call; it calls "
                             f"{', '.join(t.name for t in self.tools)}")
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict) or set(arguments) != {tool.argument} or not isinstance(
                arguments[tool.argument], str):
            raise ValueError(f"tool {tool.name!r} takes one string argument {tool.argument!r}, found "
                             f"{function['arguments'][:80]!r}")
        return f"{tool.open}{arguments[tool.argument]}{tool.close}"
