"""gymflow's OpenAI-compatible chat endpoint: an agent written as a plain program calls a stock `openai` client at
a per-episode URL, and its completions come from the run's generator, so every call can be recorded token-exact.

One app serves every episode of a run: `/s/{session}/v1/chat/completions` and `/s/{session}/v1/models`, where the
session names the episode (`EndpointServer.base_url_for(session)` is the client's `base_url`). The client's `api_key`
is a random per-run token (`new_token`), checked in constant time: a wrong or missing one gets 401 before anything
else is read. A session the backend does not know (never opened, or closed) gets 404, one that has ended mid-request
409. Every refusal is an OpenAI-style error body (`{"error": {"message", "type", "param", "code"}}`) naming the field
at fault; no request body can cause a 500.

The sampling rule (`SamplingPolicy`): the run fixes temperature, top_p, top_k and a ceiling on max_tokens, because
GRPO trains on samples of the distribution the run chose.
- A request that leaves a value out, or sends the run's, gets the run's.
- Only when `policy.allow_less_random` is True may it ask for less randomness: a lower temperature (> 0), a lower
  top_p (> 0), a smaller top_k >= 1 (any, when the run's is 0 = off). Any other value is refused, naming the field.
- max_tokens (or max_completion_tokens, the same number if both are sent) may be at most the ceiling; the prompt plus
  it must fit the context. Left out, it is the ceiling cut to what the context has left.
- frequency_penalty, presence_penalty and logit_bias are refused unless 0/empty; `seed` and other fields are ignored:
  a sample's random stream is the backend's to choose (counter-based, so a retried episode redraws it exactly).
- stop: a string or up to 4, each encoded to token ids (`SamplingParams.stop`); the completion also stops at eos.
  Caveat: a stop string is matched on ids, so it stops generation only when the model writes exactly those ids (a
  tokenizer can spell the same text with other tokens in context). The returned content leaves the matched stop
  string out, as OpenAI's does; the generation handed to the backend keeps it.

Rendering is the model's chat template (`chat_rendering`); when the request offers `tools` (and tool_choice is not
"none"), calls written in the model's format (`ChatFormat.tools`) are parsed into `tool_calls`, with ids derived
from the request's digest, so a replayed request gets the same ids. `stream: true` answers with Server-Sent Events of
`chat.completion.chunk` objects; the whole completion is generated first, then sent in pieces.

The generator is behind `ChatBackend`: it gets the session, the prompt ids, the resolved `SamplingParams`, n and a
`request_key` (sha256 of the canonical JSON of the resolved request), so it can replay an identical retried request
(an agent that repeats a request on purpose sends the same key twice: count them if that must draw anew).
"""
from __future__ import annotations

import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from rl_core.generation.base import Generation, SamplingParams
from rl_core.runtime.agent.chat_rendering import ChatFormat
from rl_core.runtime.agent.openai_request import Completion, RequestError, SamplingPolicy, parse_request
from rl_core.runtime.loopback_server import LoopbackServer

MAX_BODY_BYTES = 8 << 20
"""A larger request body is refused (413) before it is parsed."""
STREAM_PIECE_CHARS = 16
"""Characters per content delta of a streamed answer."""


class SessionEnded(Exception):
    """Raised by a backend when the session's episode ended (or was cancelled) while the request was in flight."""


class ChatBackend(Protocol):
    """Where the endpoint gets completions: the run's generator, with the episode bookkeeping around it."""

    def knows(self, session: str) -> bool:
        """Whether `session` is an open episode."""
        ...

    async def complete(self, session: str, prompt_ids: list[int], params: SamplingParams, n: int,
                       request_key: str) -> list[Generation]:
        """n generations of `prompt_ids`; raise SessionEnded when the episode is over, ValueError for a request the
        generator refuses."""
        ...


def openai_app(backend: ChatBackend, *, model_name: str, token: str, policy: SamplingPolicy, chat: ChatFormat,
               context: int, max_body_bytes: int = MAX_BODY_BYTES) -> ASGIApp:
    """The ASGI app serving `model_name` from `backend` to clients holding `token`; `chat` renders and decodes for
    the model, whose context (prompt plus completion) is `context` tokens."""
    expected = f"Bearer {token}".encode("latin-1")

    def check(request: Request) -> str:
        """The request's session, once its token and session are good."""
        given = request.headers.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(given, expected):
            raise RequestError(401, "incorrect or missing API key: send the run's token as the client's api_key "
                                    "(Authorization: Bearer <token>)", None, "invalid_api_key")
        session = request.path_params["session"]
        if not backend.knows(session):
            raise RequestError(404, f"session {session!r} is not open: its episode never started or has ended; use "
                                    "the base_url gymflow gave this episode", None, "session_not_found")
        return session

    async def models(request: Request) -> Response:
        check(request)
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                                         "owned_by": "gymflow"}]})

    async def chat_completions(request: Request) -> Response:
        session = check(request)
        body = await _body(request, max_body_bytes)
        completion = parse_request(body, model_name=model_name, policy=policy, chat=chat, context=context)
        try:
            generations = await backend.complete(session, completion.prompt_ids, completion.params,
                                                 completion.request.n, completion.key)
        except SessionEnded as err:
            raise RequestError(409, f"session {session!r} ended while this request was in flight ({err}); the "
                                    "episode is over, do not retry", None, "session_ended") from None
        except ValueError as err:
            raise RequestError(400, f"the generator refused this request: {err}") from None
        answer = _answer(completion, generations, chat, model_name)
        if completion.request.stream:
            usage = completion.request.stream_options is not None and completion.request.stream_options.include_usage
            return StreamingResponse(_chunks(answer, usage), media_type="text/event-stream")
        return JSONResponse(answer)

    routes = [Route("/s/{session}/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/s/{session}/v1/models", models, methods=["GET"])]
    handlers = {RequestError: _refused, HTTPException: _http_error, Exception: _server_error}
    return Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]  # handler types


class EndpointServer(LoopbackServer):
    """The endpoint's server: on 127.0.0.1 and a free port unless told otherwise, with each episode's URL."""

    def __init__(self, app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 10.0) -> None:
        super().__init__(app, name="OpenAI endpoint", host=host, port=port, start_timeout=start_timeout)

    def base_url_for(self, session: str) -> str:
        """The `base_url` an episode's OpenAI client takes."""
        return f"http://{self.host}:{self.port}/s/{quote(session, safe='')}/v1"


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused once it grows past `limit` bytes (before it is all read)."""
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise RequestError(413, f"the request body exceeds {limit} bytes; send a shorter conversation")
    return bytes(body)


def _answer(completion: Completion, generations: list[Generation], chat: ChatFormat, model_name: str
            ) -> dict[str, Any]:
    """The `chat.completion` object."""
    choices = [_choice(index, generation, completion, chat) for index, generation in enumerate(generations)]
    produced = sum(len(generation.completion) for generation in generations)
    prompt = len(completion.prompt_ids)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": produced, "total_tokens": prompt + produced}}


def _choice(index: int, generation: Generation, completion: Completion, chat: ChatFormat) -> dict[str, Any]:
    """One choice: the completion's text without the matched stop string (kept with vLLM's
    `include_stop_str_in_output`), its tool calls parsed where tools were offered. Calls are parsed from the whole
    text, stop string included: a call's closing tag is often the stop string that ended it."""
    whole = list(generation.completion)
    ids = whole
    if generation.finish_reason == "stop" and not completion.request.include_stop_str_in_output:
        matched = next((stop for stop in completion.stops if tuple(ids[len(ids) - len(stop):]) == stop), ())
        ids = ids[:len(ids) - len(matched)]
    text = chat.decode(ids)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = generation.finish_reason
    if completion.parse_tools:
        written = text if len(ids) == len(whole) else chat.decode(whole)
        content, calls = chat.tools.parse(written, f"call_{completion.key[:16]}_{index}")
        if calls:
            message = {"role": "assistant", "content": content, "tool_calls": calls}
            finish = "tool_calls" if finish == "stop" else finish
    return {"index": index, "message": message, "finish_reason": finish, "logprobs": None}


async def _chunks(answer: dict[str, Any], usage: bool) -> AsyncIterator[str]:
    """The answer as Server-Sent Events: per choice a role delta, content deltas, tool-call deltas, the finish
    reason; then the usage (when asked) and [DONE]."""
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]}

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps(head | {'choices': choices} | extra, ensure_ascii=False)}\n\n"

    for choice in answer["choices"]:
        index, message = choice["index"], choice["message"]
        yield event([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        text = message["content"] or ""
        for start in range(0, len(text), STREAM_PIECE_CHARS):
            piece = text[start:start + STREAM_PIECE_CHARS]
            yield event([{"index": index, "delta": {"content": piece}, "finish_reason": None}])
        if message.get("tool_calls"):
            calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            yield event([{"index": index, "delta": {"tool_calls": calls}, "finish_reason": None}])
        yield event([{"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}])
    if usage:
        yield event([], usage=answer["usage"])
    yield "data: [DONE]\n\n"


def _error(status: int, message: str, param: str | None, code: str | int | None,
           kind: str = "invalid_request_error") -> JSONResponse:
    # The openai SDK retries 409 and 5xx unless told not to: an ended episode will not come back.
    headers = {"x-should-retry": "false"} if status == 409 else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status,
                        headers=headers)


async def _refused(request: Request, err: RequestError) -> Response:
    return _error(err.status, err.message, err.param, err.code)


async def _http_error(request: Request, err: HTTPException) -> Response:
    """Routing's own refusals (no such path, wrong method), in OpenAI's format."""
    return _error(err.status_code, f"{request.method} {request.url.path}: {err.detail}; this endpoint serves POST "
                                   "/s/{session}/v1/chat/completions and GET /s/{session}/v1/models", None, None)


async def _server_error(request: Request, err: Exception) -> Response:
    """A fault in the backend (never in a request body): said as OpenAI says it, so clients handle it as theirs."""
    return _error(500, f"the backend failed: {type(err).__name__}: {err}", None, None, "server_error")
