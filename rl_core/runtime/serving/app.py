"""The env service's ASGI app: OpenEnv's routes over the session table, behind the server's token.

    GET  /health, GET /schema[?task=&num_envs=], GET /state?session_id=
    POST /reset {seed?, episode_id?, task?, num_envs?, session_id?} -> {observation, reward, done, session_id}
    POST /step {action, session_id} -> {observation, reward, done};  POST /close {session_id}
    WS   /ws: OpenEnv's messages {"type": "reset"|"step"|"state"|"close", "data": ...} -> {"type": "observation"|
         "state"|"error", "data": ...}; a binary frame (`frames`) is answered with one

Every request carries the token, as `Authorization: Bearer <token>` or as the password of HTTP Basic auth, which is
what OpenEnv's client sends for a URL `http://user:<token>@host:port` (it takes no headers); a wrong or missing one
gets 401 before anything else is read, compared in constant time. Over HTTP a session is named by the unguessable id
its first reset returns; over the WebSocket the connection is the session, and its envs are freed when it ends.
Refusals are 4xx with `{"detail": message, "code": OpenEnv's WSErrorCode}` (over the WebSocket, an error message with
the same fields and `status`); no request can cause a 500.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
from typing import Any

import numpy as np
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket

from rl_core.runtime.serving.frames import FrameError, decode_frame, encode_frame
from rl_core.runtime.serving.messages import (
    SessionRequest,
    SessionState,
    StepRequest,
    action_model,
    observation_model,
)
from rl_core.runtime.serving.sessions import EnvSession, Reply, ServeError, SessionTable, validation_message
from rl_core.runtime.serving.tasks import task_kind

log = logging.getLogger(__name__)
CODES = {400: "INVALID_JSON", 401: "UNAUTHORIZED", 404: "SESSION_ERROR", 409: "SESSION_ERROR", 413: "INVALID_JSON",
         422: "VALIDATION_ERROR", 429: "CAPACITY_REACHED", 503: "EXECUTION_ERROR"}
"""OpenEnv's error code for each status (its WSErrorCode; UNAUTHORIZED is gymflow's)."""


def env_app(table: SessionTable, token: str, max_body_bytes: int) -> ASGIApp:
    """The app serving `table`'s sessions to clients holding `token`."""
    expected = token.encode()

    def authorized(authorization: str) -> bool:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode("latin-1").partition(":")[2]
            except (binascii.Error, ValueError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.encode("latin-1", "replace"), expected)

    async def checked_body(request: Request) -> Any:
        """The request's JSON object body (None for a GET), once its token is good; 4xx otherwise."""
        if not authorized(request.headers.get("authorization", "")):
            raise ServeError(401, "missing or wrong token: send Authorization: Bearer <token>, or put the token in "
                                  "the URL as http://gymflow:<token>@host:port (what `gymflow serve-envs` prints)")
        if request.method != "POST":
            return None
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > max_body_bytes:
                raise ServeError(413, f"the request body exceeds {max_body_bytes} bytes; use the WebSocket's binary "
                                      "frames for large batches")
        data = _json(bytes(body) or b"{}")
        if not isinstance(data, dict):
            raise ServeError(400, f"the body must be a JSON object, found {type(data).__name__}")
        return data

    async def health(request: Request) -> Response:
        await checked_body(request)
        return JSONResponse({"status": "healthy"})

    async def schema(request: Request) -> Response:
        await checked_body(request)
        task = request.query_params.get("task", table.cfg.tasks[0])
        if task not in table.cfg.tasks:
            raise ServeError(422, f"schema: task {task!r} is not served here; this server serves "
                                  f"{', '.join(table.cfg.tasks)}")
        try:
            num_envs = int(request.query_params.get("num_envs", table.cfg.num_envs))
        except ValueError:
            raise ServeError(422, "schema: num_envs must be an integer") from None
        kind = task_kind(task)
        return JSONResponse({"action": action_model(kind, num_envs).model_json_schema(),
                             "observation": observation_model(kind, num_envs).model_json_schema(),
                             "state": SessionState.model_json_schema()})

    async def reset(request: Request) -> Response:
        data = await checked_body(request)
        session_id = data.get("session_id")
        opened = session_id is None
        session = table.open(over_http=True) if opened else table.get(_id(session_id))
        try:
            async with session.lock:
                reply = await session.reset(data)
        except BaseException:
            if opened:
                await table.close(session)  # a refused first reset leaves no empty session behind
            raise
        return JSONResponse({**_serialized(reply), "session_id": session.id})

    async def step(request: Request) -> Response:
        try:
            parsed = StepRequest.model_validate(await checked_body(request))
        except ValidationError as err:
            raise ServeError(422, f"step: {validation_message(err)}") from None
        session = table.get(parsed.session_id)
        async with session.lock:
            return JSONResponse(_serialized(await session.step(parsed.action)))

    async def state(request: Request) -> Response:
        await checked_body(request)
        return JSONResponse(table.get(_id(request.query_params.get("session_id"))).state())

    async def close(request: Request) -> Response:
        try:
            parsed = SessionRequest.model_validate(await checked_body(request))
        except ValidationError as err:
            raise ServeError(422, f"close: {validation_message(err)}") from None
        await table.close(table.get(parsed.session_id))
        return JSONResponse({"closed": parsed.session_id})

    async def websocket(ws: WebSocket) -> None:
        if not authorized(ws.headers.get("authorization", "")):
            await ws.send_denial_response(_error(ServeError(401, "missing or wrong token: connect to "
                                                                 "ws://gymflow:<token>@host:port/ws")))
            return
        await ws.accept()
        try:
            session = table.open(over_http=False)
        except ServeError as err:
            await ws.send_text(json.dumps(_ws_error(err)))
            await ws.close()
            return
        try:
            await _serve_socket(ws, session)
        finally:
            await table.close(session)

    routes = [Route("/health", health), Route("/schema", schema), Route("/state", state),
              Route("/reset", reset, methods=["POST"]), Route("/step", step, methods=["POST"]),
              Route("/close", close, methods=["POST"]), WebSocketRoute("/ws", websocket)]
    handlers = {ServeError: _refused, HTTPException: _http_error, Exception: _server_error}
    return Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]  # handler types


async def _serve_socket(ws: WebSocket, session: EnvSession) -> None:
    """Answer `ws`'s messages in order until it closes or sends "close"."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        binary = message.get("bytes") is not None
        try:
            kind, data, arrays = _message(message)
            if kind == "close":
                return
            async with session.lock:
                if kind == "reset":
                    answer, payload = "observation", _reply_fields(await session.reset(data))
                elif kind == "step":
                    actions = arrays.get("actions") if binary else None
                    if binary and set(arrays) != {"actions"}:
                        raise ServeError(422, 'step: a binary step frame carries one array, "actions"')
                    answer, payload = "observation", _reply_fields(await session.step(data, actions))
                else:
                    answer, payload = "state", session.state()
        except ServeError as err:
            answer, payload = "error", _ws_error(err)["data"]
        except Exception as err:  # a fault of the server's: said, and the session goes on
            log.exception("env service: %s failed", session.id)
            answer, payload = "error", {"message": f"the server failed: {type(err).__name__}: {err}",
                                        "code": "EXECUTION_ERROR", "status": 500}
        if binary:
            await ws.send_bytes(_frame(answer, payload))
        else:
            await ws.send_text(json.dumps({"type": answer, "data": _jsonable(payload)}))


def _frame(answer: str, payload: dict[str, Any]) -> bytes:
    """A binary answer: the observation's numpy fields as arrays, everything else in the JSON header."""
    fields = payload.get("observation", {}) if answer == "observation" else {}
    arrays = {name: value for name, value in fields.items() if isinstance(value, np.ndarray)}
    if arrays:
        payload = {**payload, "observation": {k: v for k, v in fields.items() if k not in arrays}}
    return encode_frame(answer, payload, arrays)


def _message(message: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(type, data, arrays) of a WebSocket message, checked."""
    if message.get("bytes") is not None:
        try:
            kind, data, arrays = decode_frame(message["bytes"])
        except FrameError as err:
            raise ServeError(400, f"binary frame: {err}") from None
    else:
        parsed = _json(message.get("text") or "")
        if not isinstance(parsed, dict) or not isinstance(parsed.get("type"), str):
            raise ServeError(400, 'a message is a JSON object {"type": "reset"|"step"|"state"|"close", "data": {...}}')
        kind, data, arrays = parsed["type"], parsed.get("data", {}), {}
        if not isinstance(data, dict):
            raise ServeError(422, f'{kind}: "data" must be a JSON object, found {type(data).__name__}')
    if kind not in ("reset", "step", "state", "close"):
        raise ServeError(400, f"unknown message type {kind!r}; expected reset, step, state or close")
    return kind, data, arrays


def _json(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # RecursionError: JSON nested deeper than Python's stack
        raise ServeError(400, f"the body is not valid JSON: {type(err).__name__}: {str(err)[:200]}") from None


def _id(session_id: Any) -> str:
    if not isinstance(session_id, str):
        raise ServeError(422, "session_id must be the string POST /reset returned")
    return session_id


def _reply_fields(reply: Reply) -> dict[str, Any]:
    """OpenEnv's serialized observation: its fields under "observation", with reward and done beside them."""
    observation, reward, done = reply
    return {"observation": observation, "reward": reward, "done": done}


def _serialized(reply: Reply) -> dict[str, Any]:
    return _jsonable(_reply_fields(reply))


def _jsonable(value: Any) -> Any:
    """`value` with its numpy arrays as lists."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value.tolist() if isinstance(value, np.ndarray) else value


def _ws_error(err: ServeError) -> dict[str, Any]:
    return {"type": "error", "data": {"message": err.message, "code": CODES.get(err.status, "EXECUTION_ERROR"),
                                      "status": err.status}}


def _error(err: ServeError) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse({"detail": err.message, "code": CODES.get(err.status, "EXECUTION_ERROR")}, err.status,
                        headers=headers)


async def _refused(request: Request, err: ServeError) -> Response:
    return _error(err)


async def _http_error(request: Request, err: HTTPException) -> Response:
    """Routing's own refusals (no such path, wrong method), in the same format."""
    return _error(ServeError(err.status_code, f"{request.method} {request.url.path}: {err.detail}; this server "
                                              "serves GET /health /schema /state, POST /reset /step /close, WS /ws"))


async def _server_error(request: Request, err: Exception) -> Response:
    """A fault of the server's (never of a request's body)."""
    return JSONResponse({"detail": f"the server failed: {type(err).__name__}: {err}", "code": "EXECUTION_ERROR"},
                        500)
