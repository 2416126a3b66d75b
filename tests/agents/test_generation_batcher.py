"""The program endpoint's generation batcher: a call whose program stopped waiting (its rollout failed and cancelled
the other episodes, or it timed out) must not stop the batcher from answering the calls that come after it, such as
those of the rollout's retry."""
from __future__ import annotations

import asyncio
import threading

from rl_core.runtime.agent.program_rollout import GenerationBatcher


def test_calls_cancelled_while_queued_or_generating_leave_the_batcher_answering() -> None:
    batcher = GenerationBatcher()
    started, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def generate(requests: list[int]) -> list[int]:
        batches.append(list(requests))
        if len(batches) == 1:  # the first batch blocks until the test has cancelled calls around it
            started.set()
            release.wait(10)
        return [request * 10 for request in requests]

    async def main() -> list[int]:
        generating = asyncio.ensure_future(batcher([1], generate))
        await asyncio.to_thread(started.wait, 10)
        queued = asyncio.ensure_future(batcher([2], generate))
        await asyncio.sleep(0.05)  # the call is in the batcher's queue behind the running batch
        generating.cancel()
        queued.cancel()
        await asyncio.gather(generating, queued, return_exceptions=True)
        release.set()
        return await asyncio.wait_for(batcher([3], generate), 10)

    try:
        assert asyncio.run(main()) == [30]
    finally:
        batcher.close()
    assert batches == [[1], [3]]  # the call cancelled in the queue was never generated
