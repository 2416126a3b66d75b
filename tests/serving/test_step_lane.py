"""The env hosts' step lane (rl_core/runtime/serving/step_lane.py): a MuJoCo shard stepped through it gives the same
arrays, to the bit and dtype, as through a Ray call; a host on another node is stepped by Ray calls; a connection
without the host's token, or with bytes that are not frames, is closed unanswered and the host keeps serving."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import ray

from rl_core.runtime.serving.frames import encode_frame
from rl_core.runtime.serving.host_pool import EnvHostPool
from rl_core.runtime.serving.step_lane import LaneClient, LaneClosed

pytestmark = pytest.mark.slow
TASK = "HalfCheetah-v5"


@pytest.fixture(scope="module")
def pool(local_ray: None) -> Iterator[EnvHostPool]:
    hosts = EnvHostPool(2)
    hosts.start()
    yield hosts
    hosts.shutdown()


async def _episode(pool: EnvHostPool, session: str, steps: int) -> tuple[list[dict[str, np.ndarray]], int]:
    """`steps` steps of 64 envs over both hosts (32 each) from seed 3: each shard's results in order, and how many
    lanes stepped them."""
    shards = pool.place(session, 64, 32)
    await asyncio.gather(*(pool.call(s, "open", TASK, "mujoco", s.count, 3, s.offset) for s in shards))
    actions = np.random.default_rng(0).uniform(-1, 1, (steps, 64, 6))
    results = []
    try:
        for step in actions:
            results += await asyncio.gather(*(pool.call(s, "step", step[s.offset:s.offset + s.count])
                                              for s in shards))
        lanes = sum(s.key in pool._lanes for s in shards)
    finally:
        pool.release(shards)
        await asyncio.gather(*(pool.call(s, "close") for s in shards))
    return results, lanes


def test_a_lane_step_equals_a_ray_call_step_and_another_nodes_host_is_stepped_by_ray(pool: EnvHostPool) -> None:
    through_lanes, lanes = asyncio.run(_episode(pool, "lanes", 1100))  # past HalfCheetah's 1,000-step episodes
    assert lanes == 2 and not pool._lanes  # released with the shards
    saved = list(pool._lane_of)
    pool._lane_of = [{**where, "node": "another-node"} for where in saved]  # as if the hosts ran elsewhere
    try:
        through_ray, lanes = asyncio.run(_episode(pool, "ray", 1100))
    finally:
        pool._lane_of = saved
    assert lanes == 0
    assert any(r["ended"].size for r in through_lanes)
    for lane, call in zip(through_lanes, through_ray, strict=True):
        assert lane.keys() == call.keys()
        for name in call:
            assert lane[name].dtype == call[name].dtype, name
            np.testing.assert_array_equal(lane[name], call[name], err_msg=name)


def test_a_connection_without_the_token_or_with_other_bytes_is_closed_and_the_host_serves_on(pool: EnvHostPool
                                                                                            ) -> None:
    where = ray.get(pool._hosts[0].lane.remote())

    async def refused(first: bytes) -> bool:
        reader, writer = await asyncio.open_unix_connection(where["name"])
        writer.write(first)
        step = encode_frame("step", {"key": "any"}, {"actions": np.zeros((1, 6))})
        writer.write(len(step).to_bytes(8, "little") + step)
        closed = await asyncio.wait_for(reader.read(), 10) == b""  # end of stream, nothing answered
        writer.close()
        return closed

    hello = encode_frame("hello", {"token": "not-the-token"}, {})
    assert asyncio.run(refused(len(hello).to_bytes(8, "little") + hello))
    assert asyncio.run(refused(b"\x10\x00\x00\x00\x00\x00\x00\x00not a frame at all"))
    assert asyncio.run(refused((1 << 40).to_bytes(8, "little")))

    async def unknown_shard() -> None:
        lane = await LaneClient.connect(where["name"], where["token"])
        try:
            with pytest.raises(RuntimeError, match="no-such-shard"):  # the host's KeyError, as an error frame
                await lane.step("no-such-shard", np.zeros((1, 6)))
        finally:
            lane.close()

    asyncio.run(unknown_shard())
    assert len(asyncio.run(_episode(pool, "after", 2))[0]) == 4


def test_a_lane_whose_host_is_gone_is_closed(pool: EnvHostPool) -> None:
    async def connect_nowhere() -> None:
        await LaneClient.connect("\0gymflow-env-host-nobody", "token")

    with pytest.raises(LaneClosed, match="cannot be reached"):
        asyncio.run(connect_nowhere())
