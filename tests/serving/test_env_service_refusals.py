"""What the env service refuses, and how: without the token nothing is served (401); a session reaches only its own
envs; a bad action, an unknown task or a step out of order is a clear 4xx over HTTP and the same status in the
WebSocket's error message, and the session goes on."""
from __future__ import annotations

import asyncio
import base64
import json
import re

import httpx
import numpy as np
import psutil
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from rl_core.envs import make_batch
from rl_core.runtime.serving import BatchClient, EnvService, ServeConfig
from rl_core.runtime.serving.client import ServedEnvError
from rl_core.runtime.serving.frames import encode_frame

pytestmark = pytest.mark.slow
ROUTES = [("GET", "/health"), ("GET", "/schema"), ("GET", "/state"), ("POST", "/reset"), ("POST", "/step"),
          ("POST", "/close")]


def test_the_server_listens_on_loopback_only_by_default(service: EnvService) -> None:
    assert ServeConfig(tasks=["HalfCheetah-v5"]).host == "127.0.0.1"
    listening = [c.laddr for c in psutil.Process().net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == service.server.port]
    assert [address.ip for address in listening] == ["127.0.0.1"]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic " + base64.b64encode(b"gymflow:wrong").decode(),
                                           "Basic !!!", "Token x"])
def test_every_route_and_the_websocket_refuse_a_missing_or_wrong_token(service: EnvService,
                                                                        authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    sessions = len(service.sessions.sessions)
    for method, path in ROUTES:
        answer = httpx.request(method, service.base_url + path, headers=headers, json={"num_envs": 1})
        assert answer.status_code == 401, (path, answer.text)
        assert "token" in answer.json()["detail"] and answer.headers["www-authenticate"] == "Bearer"

    async def refused() -> int:
        with pytest.raises(InvalidStatus) as err:
            async with connect(service.base_url.replace("http", "ws") + "/ws", additional_headers=headers):
                pass
        return err.value.response.status_code

    assert asyncio.run(refused()) == 401
    assert len(service.sessions.sessions) == sessions  # nothing was opened


def test_the_token_is_accepted_as_bearer_or_as_the_urls_password(service: EnvService) -> None:
    assert httpx.get(service.base_url + "/health", headers={"Authorization": f"Bearer {service.token}"}).json() == {
        "status": "healthy"}
    assert httpx.get(service.client_url + "/health").status_code == 200  # httpx sends the URL's user info as Basic


def test_a_session_reaches_only_its_own_envs(service: EnvService, http: httpx.Client) -> None:
    """Two sessions on the same task and seed: stepping one leaves the other where it was; a session id is the only
    handle on a session's envs, a guessed or closed one reaches nothing, and a WebSocket session has none."""
    a = http.post("/reset", json={"num_envs": 4, "seed": 1}).json()["session_id"]
    b = http.post("/reset", json={"num_envs": 4, "seed": 1}).json()["session_id"]
    local = make_batch("HalfCheetah-v5", 4, seed=1)
    push = np.ones((4, local.action_dim))
    for _ in range(3):
        assert http.post("/step", json={"action": {"actions": push.tolist()}, "session_id": a}).status_code == 200
    zero = np.zeros((4, local.action_dim))
    answer = http.post("/step", json={"action": {"actions": zero.tolist()}, "session_id": b}).json()
    assert answer["observation"]["obs"] == local.step(zero).obs.tolist()  # b's first step, untouched by a's
    assert len(a) >= 22 and a != b  # 128 random bits, URL-safe
    for guess in ("0", a[:-1] + ("A" if a[-1] != "A" else "B"), "../" + a):
        assert http.post("/step", json={"action": {"actions": zero.tolist()}, "session_id": guess}).status_code == 404
    http.post("/close", json={"session_id": a})
    assert http.post("/step", json={"action": {"actions": zero.tolist()}, "session_id": a}).status_code == 404
    assert http.get("/state", params={"session_id": a}).status_code == 404

    async def websocket_session_ids() -> list[str]:
        async with BatchClient(service.base_url, service.token) as env:
            await env.reset(num_envs=2)
            return [s.id for s in service.sessions.sessions.values() if not s.over_http]

    for session_id in asyncio.run(websocket_session_ids()):
        assert http.get("/state", params={"session_id": session_id}).status_code == 404


NAN_BODY = '{"action": {"actions": [[NaN, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]}, "session_id": "%s"}'
STEP_REFUSALS = {
    "five floats for six": ({"actions": [[0.0] * 5] * 2}, 422, "takes \\(2, 6\\) floats; found shape \\(2, 5\\)"),
    "one row for two envs": ({"actions": [[0.0] * 6]}, 422, "found shape \\(1, 6\\)"),
    "ragged rows": ({"actions": [[0.0] * 6, [0.0] * 5]}, 422, "ragged"),
    "a string": ({"actions": "left"}, 422, "actions: Input should be a valid list"),
    "the scalar shape": ({"action": [0.0] * 6}, 422, "steps BatchVectorAction"),
    "text for a MuJoCo task": ({"texts": ["a", "b"]}, 422, "steps BatchVectorAction"),
}


@pytest.mark.parametrize("action, status, message", STEP_REFUSALS.values(), ids=STEP_REFUSALS)
def test_a_wrong_action_is_a_clear_4xx_and_the_session_goes_on(http: httpx.Client, action: dict, status: int,
                                                                 message: str) -> None:
    session = http.post("/reset", json={"num_envs": 2}).json()["session_id"]
    answer = http.post("/step", json={"action": action, "session_id": session})
    assert answer.status_code == status
    assert answer.json()["code"] == "VALIDATION_ERROR"
    assert re.search(message, answer.json()["detail"]), answer.json()["detail"]
    assert http.post("/step", json={"action": {"actions": [[0.0] * 6] * 2}, "session_id": session}).status_code == 200


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinite_actions_are_refused_over_http(http: httpx.Client, number: str) -> None:
    session = http.post("/reset", json={"num_envs": 2}).json()["session_id"]
    answer = http.post("/step", content=(NAN_BODY % session).replace("NaN", number))
    assert answer.status_code == 422 and "finite number" in answer.json()["detail"]


def test_refusals_over_the_websocket_carry_the_same_status(service: EnvService) -> None:
    async def refusals() -> dict[str, int]:
        got = {}
        async with BatchClient(service.base_url, service.token) as env:
            for name, call in [("step before reset", env.step(np.zeros((2, 6)))),
                               ("unknown task", env.reset(task="Pong-v5")),
                               ("too many envs", env.reset(num_envs=513))]:
                with pytest.raises(ServedEnvError) as err:
                    await call
                got[name] = err.value.status
            await env.reset(num_envs=2)
            for name, actions in [("nan", np.full((2, 6), np.nan)), ("inf", np.full((2, 6), np.inf)),
                                  ("shape", np.zeros((3, 6))), ("ints", np.zeros((2, 6), np.int64))]:
                with pytest.raises(ServedEnvError) as err:
                    await env.step(actions)
                got[name] = err.value.status
            assert (await env.step(np.zeros((2, 6))))["observation"]["obs"].shape == (2, 17)  # it goes on
        return got

    assert asyncio.run(refusals()) == {"step before reset": 409, "unknown task": 422, "too many envs": 422,
                                       "nan": 422, "inf": 422, "shape": 422, "ints": 422}


def test_malformed_messages_get_an_error_message_not_a_closed_socket(service: EnvService) -> None:
    async def answers() -> list[dict]:
        got = []
        url = service.base_url.replace("http", "ws") + "/ws"
        async with connect(url, additional_headers={"Authorization": f"Bearer {service.token}"}) as ws:
            for message in ["not json", "[1, 2]", '{"type": "jump"}', '{"type": "step", "data": 3}',
                            b"GFB1\xff\xff\xff\xff",
                            encode_frame("step", {}, {"actions": np.zeros(2), "x": np.ones(1)}),
                            '{"type": "reset", "data": {"seed": -1}}', '{"type": "reset", "data": {"colour": 1}}']:
                await ws.send(message)
                answer = await ws.recv()
                got.append(json.loads(answer) if isinstance(answer, str) else {"binary": True})
            await ws.send('{"type": "state"}')
            got.append(json.loads(await ws.recv()))
        return got

    *errors, state = asyncio.run(answers())
    texts = [e for e in errors if "binary" not in e]
    assert [e["data"]["status"] for e in texts] == [400, 400, 400, 422, 422, 422]
    assert all(e["type"] == "error" and e["data"]["message"] for e in texts)
    assert state == {"type": "state", "data": {"episode_id": None, "step_count": 0, "task": None, "num_envs": 0,
                                               "envs_done": 0}}


def test_http_refusals_of_bodies_and_limits(service: EnvService, http: httpx.Client) -> None:
    assert http.post("/reset", content=b"{not json").status_code == 400
    assert http.post("/reset", content=b"[1]").status_code == 400
    assert http.post("/reset", content=b"[" * 50000).status_code == 400  # deeper than Python's stack
    too_big = http.post("/step", content=b" " * (service.cfg.max_body_bytes + 1))
    assert too_big.status_code == 413 and "binary frames" in too_big.json()["detail"]
    assert http.post("/reset", json={"task": "Pong-v5"}).json()["code"] == "VALIDATION_ERROR"
    assert http.post("/reset", json={"task": "Pong-v5"}).status_code == 422
    assert http.get("/schema", params={"task": "Pong-v5"}).status_code == 422
    assert http.get("/nowhere").status_code == 404 and http.get("/reset").status_code == 405
    held = [http.post("/reset", json={"num_envs": 500}) for _ in range(3)]  # max_envs 1024
    assert [answer.status_code for answer in held] == [200, 200, 429]
    assert "max_envs" in held[2].json()["detail"] and held[2].json()["code"] == "CAPACITY_REACHED"


def test_schema_describes_the_session_a_reset_would_open(http: httpx.Client) -> None:
    single = http.get("/schema").json()
    assert single["action"]["title"] == "VectorAction" and "done" in single["observation"]["properties"]
    batch = http.get("/schema", params={"task": "Arithmetic-v0", "num_envs": 4}).json()
    assert batch["action"]["title"] == "BatchTextAction" and batch["state"]["title"] == "SessionState"
