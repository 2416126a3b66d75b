"""How the OpenAI endpoint turns a chat request into prompt ids and sampled ids back into text, for one tokenizer.

The endpoint needs five things of a model's tokenizer, held by `ChatFormat`: render a conversation (OpenAI message
dicts and tool schemas) as the model expects its next turn, encode a stop string, decode a completion, the eos id
that ends a turn, and the format its tool calls are written in. `chat_format` builds them from gymflow's tokenizers
the way `HFTokenizer.conversation_ids` renders an agent's conversation: the model's chat template with its generation
prompt, or, for a tokenizer without one (`CharTokenizer`, a bare HF tokenizer), bos and the messages' texts one after
another, calls and tool results written in the env's tool format (`TaggedTools`) when it has one.

Two things a template may not do are done here, so that what the model sees holds what it was offered and wrote:
- a template that never mentions `tool_calls` (SmolLM2's) would drop an assistant turn's calls, so each call is
  written back into that turn's text as the `<tool_call>` block the model writes (`tool_calls.format_tool_call`);
- a template that never mentions `tools` (SmolLM2's) would never show the tools, so their schemas are added to the
  system message in the Hermes format Qwen2.5's template writes, which asks for the same blocks.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.hf_tokenizer import HFTokenizer
from rl_core.runtime.agent.tool_calls import HermesBlocks, ToolFormat

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], list[int]]
"""(OpenAI messages, tool schemas or None) -> prompt ids ready for the assistant's turn."""

TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                  "with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_INSTRUCTION = ("</tools>\n\nFor each function call, return a json object with function name and arguments "
                     "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                     "\"arguments\": <args-json-object>}\n</tool_call>")


@dataclass(frozen=True)
class ChatFormat:
    """What the endpoint asks of a model's tokenizer."""

    render: Render
    encode: Callable[[str], list[int]]
    """Text to ids, nothing added (stop strings)."""
    decode: Callable[[Iterable[int]], str]
    """Ids to text, special tokens dropped (the completion's content)."""
    eos_id: int
    """Ends an assistant turn: every completion stops at it."""
    tools: ToolFormat
    """How the model writes a call (parsed into `tool_calls`) and reads a result."""


def chat_format(tokenizer: HFTokenizer | CharTokenizer, tools: ToolFormat | None = None) -> ChatFormat:
    """The format of gymflow's tokenizers: the chat template where the tokenizer has one, else bos and the texts.
    `tools`: the env's tool format, for a tokenizer without a template (a template's model writes `<tool_call>`
    blocks)."""
    templated = isinstance(tokenizer, HFTokenizer) and tokenizer.chat
    template = str(tokenizer.tokenizer.chat_template) if templated else ""  # what it mentions, named templates too
    hermes = HermesBlocks()
    written = hermes if templated or tools is None else tools

    def render(messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None) -> list[int]:
        if not templated:
            return [tokenizer.bos_id, *tokenizer.encode("".join(_text(m, written) for m in messages))]
        if "tool_calls" not in template:
            messages = [_calls_in_text(m, hermes) for m in messages]
        else:
            messages = [_arguments_as_objects(m) for m in messages]
        if offered and "tools" not in template:
            messages, offered = _tools_in_system(messages, offered), None
        rendered = tokenizer.tokenizer.apply_chat_template(messages, tools=offered or None,
                                                           add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(rendered)

    return ChatFormat(render, tokenizer.encode, tokenizer.decode, tokenizer.eos_id, written)


def _text(message: dict[str, Any], tools: ToolFormat) -> str:
    """A message's text where no template frames it: a tool result as the model reads one, calls as it writes them."""
    if message["role"] == "tool":
        return tools.result_text(message["content"])
    return _calls_in_text(message, tools)["content"]


def _calls_in_text(message: dict[str, Any], tools: ToolFormat) -> dict[str, Any]:
    """The message with its tool calls written into its text, as the model writes them."""
    calls = message.get("tool_calls") or []
    if not calls:
        return message
    text = tools.assistant_text(message["content"], calls)
    return {key: value for key, value in message.items() if key != "tool_calls"} | {"content": text}


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    """The message with each call's arguments decoded from their JSON string: HF templates write them with `tojson`,
    which would otherwise write the string, quotes escaped."""
    calls = message.get("tool_calls") or []
    if not calls:
        return message
    decoded = []
    for call in calls:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except ValueError:
            arguments = call["function"]["arguments"]
        decoded.append({**call, "function": {**call["function"], "arguments": arguments}})
    return message | {"tool_calls": decoded}


def _tools_in_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with the tool schemas at the end of its system message (a new one first when it has none)."""
    schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    block = f"{TOOLS_PREAMBLE}\n{schemas}\n{TOOLS_INSTRUCTION}"
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [first | {"content": f"{first['content']}\n\n{block}" if first["content"] else block}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
