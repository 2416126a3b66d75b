"""The endpoint renders a chat request as `conversation_ids` renders an agent's conversation (chat template, or bos
and the texts), and shows the model the tools and calls its template would drop, in the format it writes them."""
from __future__ import annotations

import copy
import json

from rl_core.policies.hf_tokenizer import HFTokenizer
from rl_core.runtime.agent.chat_rendering import chat_format
from tests.agents.endpoint_helpers import CHARS, smollm2_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALLED = [{"role": "user", "content": "2+3?"},
          {"role": "assistant", "content": "",
           "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
          {"role": "tool", "content": "5", "tool_call_id": "c0"}]
BLOCK = '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'


def text_of(ids: list[int]) -> str:
    return smollm2_tokenizer().tokenizer.decode(ids)


def test_a_tokenizer_without_a_template_gets_bos_and_the_texts() -> None:
    chat = chat_format(CHARS)
    messages = [{"role": "system", "content": "be brief. "}, {"role": "user", "content": "1+2="}]
    assert chat.render(messages, None) == CHARS.conversation_ids([("system", "be brief. "), ("user", "1+2=")])
    assert chat.eos_id == CHARS.eos_id and chat.decode(chat.encode("12")) == "12"


def test_a_plain_conversation_renders_as_conversation_ids() -> None:
    messages = [("user", "What is 2+3?"), ("assistant", "5"), ("user", "And 3+4?")]
    rendered = chat_format(smollm2_tokenizer()).render([{"role": r, "content": t} for r, t in messages], None)
    assert rendered == smollm2_tokenizer().conversation_ids(messages)


def test_a_template_without_tools_shows_them_in_the_system_message_and_calls_as_written() -> None:
    chat = chat_format(smollm2_tokenizer())
    shown = text_of(chat.render(CALLED, TOOLS))
    assert shown.startswith("<|im_start|>system\n# Tools\n") and json.dumps(TOOLS[0]) in shown
    assert f"<|im_start|>assistant\n{BLOCK}<|im_end|>\n<|im_start|>tool\n5<|im_end|>" in shown
    kept = text_of(chat.render([{"role": "system", "content": "Be brief."}, *CALLED], TOOLS))
    assert kept.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")


def test_a_template_that_renders_tools_and_calls_gets_them_as_objects() -> None:
    tokenizer = copy.deepcopy(smollm2_tokenizer().tokenizer)
    tokenizer.chat_template = (
        "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
        "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    shown = text_of(chat_format(HFTokenizer(tokenizer)).render(CALLED, TOOLS))
    assert shown.startswith("TOOLS [{") and '"name": "add"' in shown
    assert 'assistant: CALL add {"a": 2}\ntool: 5\nassistant:' in shown  # an object, not a quoted string
