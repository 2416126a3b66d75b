"""The env service, fuzzed: whatever body a client posts (random JSON, the requests' keys with values of any type,
near-valid requests, random bytes) and whatever a WebSocket sends (random JSON messages, random bytes, binary frames
with random headers), the answer is a 200 or a 4xx, never a 5xx and never a hang: the session answers its next
message. HTTP cases go through Starlette's TestClient (in process, fast; a server exception would be raised into the
test) against an app sharing the live service's env hosts; WebSocket cases go to the live server with a timeout."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from websockets.sync.client import ClientConnection, connect

from rl_core.runtime.serving import EnvService
from rl_core.runtime.serving.app import env_app
from rl_core.runtime.serving.frames import DTYPES, MAGIC
from rl_core.runtime.serving.sessions import SessionTable
from tests.serving.conftest import TASKS

pytestmark = pytest.mark.slow
FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the clients are module-scoped; hypothesis cannot tell
REPLY_TIMEOUT_S = 30.0


def mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` about three times in four, so bodies whose other fields are good reach the deeper checks."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda pick: valid if pick else other)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
floats = st.floats(-2, 2) | st.floats()  # st.floats() draws NaN and infinities too
reset_bodies = st.fixed_dictionaries({}, optional={
    "seed": mostly(st.integers(0, 2**63 - 1), st.integers() | json_values),
    "episode_id": mostly(st.text(max_size=20), json_values), "task": mostly(st.sampled_from(TASKS), json_values),
    "num_envs": mostly(st.integers(1, 8), st.integers(-2, 600) | json_values), "colour": json_values})
vector_actions = st.fixed_dictionaries({"actions": st.lists(st.lists(floats, min_size=5, max_size=7), min_size=1,
                                                            max_size=3)}, optional={"metadata": json_values})
text_actions = st.fixed_dictionaries({"texts": st.lists(st.none() | st.text(max_size=10), min_size=1, max_size=3)})


@pytest.fixture(scope="module")
def client(service: EnvService) -> Iterator[TestClient]:
    app = env_app(SessionTable(service.cfg, service.pool), service.token, service.cfg.max_body_bytes)
    with TestClient(app, headers={"Authorization": f"Bearer {service.token}"}) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def sessions(client: TestClient) -> dict[str, str]:
    """A 2-env HalfCheetah session and a 2-env Arithmetic session to step."""
    return {task: client.post("/reset", json={"task": task, "num_envs": 2}).json()["session_id"]
            for task in ("HalfCheetah-v5", "Arithmetic-v0")}


def refused_cleanly(answer: Any) -> bool:
    """A 200, or a 4xx whose body says why."""
    return answer.status_code == 200 or (400 <= answer.status_code < 500 and answer.json()["detail"])


@settings(suppress_health_check=FIXTURE_OK)
@given(body=mostly(reset_bodies, json_values))
def test_any_reset_body_is_served_or_refused_with_a_4xx(client: TestClient, body: Any) -> None:
    answer = client.post("/reset", content=json.dumps(body))
    assert refused_cleanly(answer), answer.text
    if answer.status_code == 200:
        assert client.post("/close", json={"session_id": answer.json()["session_id"]}).status_code == 200


@settings(suppress_health_check=FIXTURE_OK)
@given(data=st.data())
def test_any_step_body_is_served_or_refused_with_a_4xx(client: TestClient, sessions: dict[str, str],
                                                       data: st.DataObject) -> None:
    task = data.draw(st.sampled_from(sorted(sessions)))
    action = data.draw(mostly(vector_actions if task == "HalfCheetah-v5" else text_actions, json_values))
    body = {"action": action, "session_id": data.draw(mostly(st.just(sessions[task]), json_values))}
    answer = client.post("/step", content=json.dumps(body))
    assert refused_cleanly(answer), answer.text
    if task == "Arithmetic-v0" and answer.status_code == 200:
        client.post("/reset", json={"session_id": sessions[task]})  # one-turn episodes: start the next ones


@settings(suppress_health_check=FIXTURE_OK)
@given(body=st.binary(max_size=64))
def test_random_bytes_are_served_or_refused_with_a_4xx(client: TestClient, body: bytes) -> None:
    for path in ("/reset", "/step", "/close"):
        answer = client.post(path, content=body)
        assert refused_cleanly(answer), answer.text
        if path == "/reset" and answer.status_code == 200:  # no body at all: OpenEnv's plain reset
            client.post("/close", json={"session_id": answer.json()["session_id"]})


@pytest.fixture(scope="module")
def socket(service: EnvService) -> Iterator[ClientConnection]:
    url = service.base_url.replace("http", "ws") + "/ws"
    with connect(url, additional_headers={"Authorization": f"Bearer {service.token}"}, compression=None,
                 max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"num_envs": 2}}))
        assert json.loads(ws.recv(timeout=REPLY_TIMEOUT_S))["type"] == "observation"
        yield ws


frame_headers = st.fixed_dictionaries({"type": mostly(st.sampled_from(["step", "reset", "state"]), json_values)},
                                      optional={"data": json_values, "arrays": st.lists(st.fixed_dictionaries(
                                          {"name": mostly(st.just("actions"), json_values),
                                           "dtype": mostly(st.sampled_from(sorted(DTYPES)), json_values),
                                           "shape": mostly(st.lists(st.integers(0, 8), max_size=3), json_values)}),
                                          max_size=3)})


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    header = json.dumps(draw(frame_headers)).encode()
    length = draw(mostly(st.just(len(header)), st.integers(0, 2**32 - 1)))
    return MAGIC + length.to_bytes(4, "little") + header + draw(st.binary(max_size=200))


ws_messages = (st.fixed_dictionaries({"type": mostly(st.sampled_from(["step", "reset", "state"]), json_values)},
                                     optional={"data": mostly(vector_actions | reset_bodies, json_values)})
               .map(json.dumps) | st.text(max_size=30) | frames() | st.binary(max_size=64))


@settings(suppress_health_check=FIXTURE_OK)
@given(message=ws_messages)
def test_any_websocket_message_is_answered_and_the_session_answers_the_next(socket: ClientConnection,
                                                                            message: str | bytes) -> None:
    socket.send(message)
    answer = socket.recv(timeout=REPLY_TIMEOUT_S)
    if isinstance(answer, str):
        reply = json.loads(answer)
        assert reply["type"] in ("observation", "state") or 400 <= reply["data"]["status"] < 500, reply
    socket.send(json.dumps({"type": "state"}))
    assert json.loads(socket.recv(timeout=REPLY_TIMEOUT_S))["type"] == "state"


def test_the_fuzzed_socket_still_steps(socket: ClientConnection) -> None:
    socket.send(json.dumps({"type": "reset", "data": {"task": "HalfCheetah-v5", "num_envs": 2}}))
    assert json.loads(socket.recv(timeout=REPLY_TIMEOUT_S))["type"] == "observation"
    socket.send(json.dumps({"type": "step", "data": {"actions": np.zeros((2, 6)).tolist()}}))
    assert json.loads(socket.recv(timeout=REPLY_TIMEOUT_S))["data"]["observation"]["rewards"]
