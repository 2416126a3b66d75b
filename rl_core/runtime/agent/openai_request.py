"""What a chat-completion request to gymflow's OpenAI endpoint may say, checked at the edge: the body parsed with
pydantic (strict types, unknown fields ignored), the messages checked per role, and the sampling the client asks for
held to the run's `SamplingPolicy` (the rule: `rl_core.runtime.agent.openai_endpoint`'s docstring).

Every refusal is a `RequestError` carrying the HTTP status and the request field to name in OpenAI's error body, so
no body, however malformed, reaches the generator or ends in a server error.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from rl_core.generation.base import SamplingParams
from rl_core.runtime.agent.chat_rendering import ChatFormat

MAX_STOP = 4
"""Stop strings a request may send, as OpenAI's API allows."""


class RequestError(Exception):
    """A request the endpoint refuses: the HTTP status, what is wrong and what to do, and the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass(frozen=True)
class SamplingPolicy:
    """How the run samples: every request gets these values unless the rule lets it ask for others."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 = off."""
    max_tokens: int = 256
    """The ceiling on a completion's tokens; a request may ask for fewer."""
    allow_less_random: bool = False
    """Whether a request may lower temperature or top_p, or narrow top_k (e.g. an evaluation that wants greedy-ish
    answers); training runs keep it False so every sample is drawn from the distribution the run trains."""
    max_n: int = 16
    """The most completions one request may ask for."""

    def __post_init__(self) -> None:
        SamplingParams(self.temperature, self.top_p, self.top_k, self.max_tokens)  # the same checks, same messages
        if self.max_n < 1:
            raise ValueError(f"SamplingPolicy.max_n must be >= 1, found {self.max_n}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionSchema(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSchema


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatRequest(_Strict):
    """The fields of OpenAI's chat-completion request that gymflow reads; the rest are ignored."""

    model: str
    messages: list[Message]
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # not OpenAI's; vLLM's servers take it, clients send it as extra_body
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False  # vLLM's extension (extra_body): the content keeps the matched stop
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


@dataclass(frozen=True)
class Completion:
    """A request ready for the generator, and what the response needs of it."""

    request: ChatRequest
    messages: list[dict[str, Any]]
    """OpenAI message dicts, content as one string ("developer" as "system")."""
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    params: SamplingParams
    stops: tuple[tuple[int, ...], ...]
    """The request's stop strings as ids (eos, added to `params.stop`, is not one of them)."""
    parse_tools: bool
    """Whether tools were offered and may be called, so the completions' calls are parsed."""
    key: str
    """sha256 of the canonical JSON of what decides the completions (`request_key`)."""


def parse_request(body: bytes, *, model_name: str, policy: SamplingPolicy, chat: ChatFormat,
                  context: int) -> Completion:
    """The request in `body`, checked and resolved, or a RequestError naming the field at fault."""
    try:
        request = ChatRequest.model_validate_json(body, strict=True)
    except ValidationError as err:
        first = err.errors()[0]
        param = _param(first["loc"])
        found = f", found {_json_type(first['input'])}" if first["type"].endswith("_type") else ""
        raise RequestError(400, f"{param or 'the request body'}: {first['msg']}{found} (see OpenAI's chat completions "
                                "request format)", param, first["type"]) from None
    if request.model != model_name:
        raise RequestError(404, f"model {_short(request.model)} is not served here; this endpoint serves "
                                f"{model_name!r}", "model", "model_not_found")
    messages = _messages(request)
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
    if request.tool_choice not in (None, "auto", "none"):
        raise RequestError(400, f"tool_choice {_short(request.tool_choice)} is not supported: the model is not "
                                "constrained to call a tool; send 'auto', 'none' or leave it out", "tool_choice")
    if not 1 <= request.n <= policy.max_n:
        raise RequestError(400, f"n must be between 1 and {policy.max_n}, found {request.n}", "n")
    temperature, top_p, top_k = _temperature(request, policy), _top_p(request, policy), _top_k(request, policy)
    _no_other_sampling(request)
    stop_texts = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    stops = _stop_ids(stop_texts, chat)
    try:
        prompt_ids = chat.render(messages, tools)
    except Exception as err:  # noqa: BLE001 - a template or tokenizer refusing this content is the request's fault
        raise RequestError(400, f"messages could not be rendered for this model: {err}", "messages") from None
    max_tokens = _max_tokens(request, policy, len(prompt_ids), context)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                            stop=(*stops, (chat.eos_id,)))
    key = request_key({"model": request.model, "messages": messages, "tools": tools, "tool_choice": request.tool_choice,
                       "n": request.n, "temperature": params.temperature, "top_p": params.top_p,
                       "top_k": params.top_k, "max_tokens": max_tokens, "stop": stop_texts,
                       "include_stop_str_in_output": request.include_stop_str_in_output})
    return Completion(request, messages, tools, prompt_ids, params, stops,
                      bool(tools) and request.tool_choice != "none", key)


def request_key(resolved: dict[str, Any]) -> str:
    """sha256 of `resolved`'s canonical JSON. Built from the resolved request (sampling values filled in, transport
    fields such as `stream` left out), so a retry, or the same request sent with or without the run's defaults
    spelled out, gets the same key."""
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _param(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic error location as OpenAI names a field ("messages[0].content"), without pydantic's union labels."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.fullmatch(r"[a-z_][a-z0-9_]*", part) and part not in {"str", "int", "float", "bool", "none", "dict"}:
            path += f".{part}" if path else part
    return path or None


def _short(value: Any) -> str:
    """A client's value as an error message repeats it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _json_type(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _messages(request: ChatRequest) -> list[dict[str, Any]]:
    """The messages as the renderer takes them, each checked against what its role needs."""
    if not request.messages:
        raise RequestError(400, "messages is empty; send at least one message (e.g. a user message)", "messages")
    rendered = []
    for i, message in enumerate(request.messages):
        where = f"messages[{i}]"
        if message.tool_calls and message.role != "assistant":
            raise RequestError(400, f"{where} has tool_calls but role {message.role!r}; only assistant messages "
                                    "carry tool calls", f"{where}.tool_calls")
        if message.role == "tool" and not message.tool_call_id:
            raise RequestError(400, f"{where} is a tool message without tool_call_id; send the id of the call it "
                                    "answers", f"{where}.tool_call_id")
        if message.content is None and not message.tool_calls:
            raise RequestError(400, f"{where} has no content; only an assistant message with tool_calls may leave it "
                                    "out", f"{where}.content")
        content = message.content if not isinstance(message.content, list) else \
            "".join(part.text for part in message.content)
        entry: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                                 "content": content or ""}
        if message.tool_calls:
            entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            entry["name"] = message.name
        rendered.append(entry)
    return rendered


def _stop_ids(texts: list[str], chat: ChatFormat) -> tuple[tuple[int, ...], ...]:
    if len(texts) > MAX_STOP:
        raise RequestError(400, f"stop holds {len(texts)} strings; send at most {MAX_STOP}", "stop")
    stops = []
    for text in texts:
        try:
            ids = tuple(chat.encode(text))
        except ValueError as err:
            raise RequestError(400, f"stop string {_short(text)} cannot be encoded for this model: {err}",
                               "stop") from None
        if not ids:
            raise RequestError(400, "stop holds an empty string; send non-empty stop strings", "stop")
        stops.append(ids)
    return tuple(stops)


def _max_tokens(request: ChatRequest, policy: SamplingPolicy, prompt: int, context: int) -> int:
    """The completion's token limit: the request's, at most the run's ceiling and what the context has left; the
    run's ceiling (cut to the context's room) when the request sets none."""
    asked, field = request.max_tokens, "max_tokens"
    if request.max_completion_tokens is not None:
        if asked is not None and asked != request.max_completion_tokens:
            raise RequestError(400, f"max_tokens {asked} and max_completion_tokens {request.max_completion_tokens} "
                                    "differ; send one of them", "max_completion_tokens")
        asked, field = request.max_completion_tokens, "max_completion_tokens"
    if prompt >= context:
        raise RequestError(400, f"the prompt renders to {prompt} tokens, which fills this model's context of "
                                f"{context}; shorten the conversation", "messages", "context_length_exceeded")
    if asked is None:
        return min(policy.max_tokens, context - prompt)
    if not 1 <= asked <= policy.max_tokens:
        raise RequestError(400, f"{field} must be between 1 and this run's ceiling {policy.max_tokens}, found {asked}",
                           field)
    if prompt + asked > context:
        raise RequestError(400, f"the prompt's {prompt} tokens plus {field} {asked} exceed this model's context of "
                                f"{context}; lower {field} to at most {context - prompt} or shorten the conversation",
                           field, "context_length_exceeded")
    return asked


def _refusal(field: str, asked: float, run: float, policy: SamplingPolicy, lower: str) -> RequestError:
    allowed = f"a request may {lower}, or leave it out" if policy.allow_less_random else \
        "this run does not let a request change it; leave it out or send the run's value"
    return RequestError(400, f"{field} {asked} is not allowed: the run samples with {field} {run}, and {allowed}",
                        field)


def _lowered(field: str, asked: float | None, run: float, policy: SamplingPolicy, lower: str) -> float:
    """The run's value of `field` (temperature, top_p), or a lower one > 0 where the policy lets a request ask."""
    if asked is None or asked == run:
        return run
    if policy.allow_less_random and 0 < asked < run:
        return asked
    raise _refusal(field, asked, run, policy, lower)


def _temperature(request: ChatRequest, policy: SamplingPolicy) -> float:
    return _lowered("temperature", request.temperature, policy.temperature, policy,
                    "lower it to a value > 0 (e.g. 1e-3 for near-greedy sampling; 0 is not a distribution)")


def _top_p(request: ChatRequest, policy: SamplingPolicy) -> float:
    return _lowered("top_p", request.top_p, policy.top_p, policy, "lower it to a value > 0")


def _top_k(request: ChatRequest, policy: SamplingPolicy) -> int:
    asked = request.top_k
    if asked is None or asked == policy.top_k:
        return policy.top_k
    if policy.allow_less_random and asked >= 1 and (policy.top_k == 0 or asked < policy.top_k):
        return asked
    raise _refusal("top_k", asked, policy.top_k, policy, "narrow it to a smaller k >= 1")


def _no_other_sampling(request: ChatRequest) -> None:
    """Penalties and logit biases would change the distribution sampled, which is the run's to choose."""
    for field in ("frequency_penalty", "presence_penalty"):
        if getattr(request, field) not in (None, 0):
            raise RequestError(400, f"{field} {getattr(request, field)} is not supported: the run samples from the "
                                    "policy's own distribution; leave it out or send 0", field)
    if request.logit_bias:
        raise RequestError(400, "logit_bias is not supported: the run samples from the policy's own distribution; "
                                "leave it out", "logit_bias")
