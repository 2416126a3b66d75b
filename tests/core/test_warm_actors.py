"""Warm actors (`rl_core.runtime.warm_actors`): inside `reusing_actors()` a run takes the env-worker and trainer-rank
processes a finished run parked, and computes what fresh processes compute; a parked actor that died is replaced;
leaving the block stops the parked ones; start slots go to the run that asked first."""
from __future__ import annotations

import os
import threading
import time
import uuid

import numpy as np
import pytest
import ray

from rl_core.algos.base import build_learner
from rl_core.config.presets import build_control_config
from rl_core.data import read_tensors
from rl_core.runtime.commits import commit_initial
from rl_core.runtime.control.actors import ControlActors
from rl_core.runtime.warm_actors import WATCH_THREAD, ParkedActors, reusing_actors


def _run(tmp_path, seed: int) -> ControlActors:
    """A new tiny run (its version 0 committed) and its actors, not started yet."""
    cfg = build_control_config("tiny", run_name=f"warm-{uuid.uuid4().hex[:6]}", store=f"file://{tmp_path}",
                               seed=seed, num_workers=1, num_ranks=1)
    commit_initial(cfg, build_learner(cfg).state())
    return ControlActors(cfg)


def _pids(actors: ControlActors) -> tuple[int, int]:
    """(env worker's pid, trainer rank's pid), starting them if need be."""
    worker = actors.env_pool.call_each(lambda w: os.getpid())[0]
    rank = ray.get(actors.trainer_group._ensure()[0].__ray_call__.remote(lambda r: os.getpid()))
    return worker, rank


def _computed(actors: ControlActors) -> tuple[dict, dict]:
    """What the run's actors compute from version 0: iteration 0's experience, and the seeded learner state."""
    experience = read_tensors(actors.env_pool.simulate(0, 0)[0]["uri"])[0]
    return experience, actors.trainer_group.initial_state()


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.usefixtures("local_ray")
def test_a_run_takes_the_processes_a_finished_run_parked_and_computes_what_fresh_ones_do(tmp_path) -> None:
    fresh = _run(tmp_path, seed=0)
    expected = _computed(fresh)
    fresh_pids = _pids(fresh)
    fresh.release()
    with reusing_actors():
        first = _run(tmp_path, seed=1)  # another seed: whatever it leaves in the processes must not leak
        first_pids = _pids(first)
        _computed(first)
        first.release()
        second = _run(tmp_path, seed=0)
        assert _pids(second) == first_pids != fresh_pids
        experience, learner = _computed(second)
        assert second.env_pool.call_each(lambda w: w.cfg.run_name) == [second.cfg.run_name]
        second.release()
    _assert_equal(experience, expected[0])
    _assert_equal(learner, expected[1])


def _stopped(handle, timeout_s: float = 60.0) -> bool:
    """Whether calls to the actor fail within `timeout_s` (`ray.kill` is asynchronous: a call sent right after it can
    still be served)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.ping.remote(), timeout=deadline - time.monotonic())
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.usefixtures("local_ray")
def test_a_parked_actor_that_died_is_replaced_and_leaving_the_block_stops_the_parked_ones(tmp_path) -> None:
    with reusing_actors():
        first = _run(tmp_path, seed=0)
        worker_pid, rank_pid = _pids(first)
        worker = first.env_pool._actor(0)
        first.release()
        ray.kill(worker, no_restart=True)  # dies while parked
        second = _run(tmp_path, seed=0)
        new_worker, reused_rank = _pids(second)
        assert new_worker != worker_pid and reused_rank == rank_pid
        parked = second.env_pool._actor(0)
        second.release()
    assert _stopped(parked)
    # The new worker's start was watched on a thread: one left running could drop a reference of Ray's while Ray
    # shuts down, which ends the process (seen in CI: bench/sweep.py exited 1 after its last sweep).
    assert [t for t in threading.enumerate() if t.name == WATCH_THREAD] == []


def test_outside_the_block_a_released_run_stops_its_actors(tmp_path, local_ray) -> None:
    run = _run(tmp_path, seed=0)
    _pids(run)
    worker = run.env_pool._actor(0)
    run.release()
    assert _stopped(worker)


def test_start_slots_go_to_the_run_that_asked_first_and_a_parked_actor_needs_none() -> None:
    parked = ParkedActors(slots=1)
    order: list[str] = []

    def ask(run: str, kind: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: order.append(f"{run}:{parked.take_or_start(kind, run)}"))
        thread.start()
        time.sleep(0.2)  # it now waits, in order
        return thread

    assert parked.take_or_start("env", "a") is None  # run a holds the slot
    later = ask("b", "env")
    earlier = ask("a", "rank")  # run a asked before b did: its next request goes first
    parked.started("env", 1, None)  # it failed to start: the slot is free again
    earlier.join(5)
    assert order == ["a:None"]
    parked.put([parked.gave("env", "a parked env worker")])  # b takes it without waiting for the slot
    later.join(5)
    assert order == ["a:None", "b:a parked env worker"]


def test_a_request_waits_for_a_park_expected_sooner_than_a_start_and_starts_once_it_is_overdue() -> None:
    parked = ParkedActors(slots=2)
    worker = object()
    assert parked.take_or_start("env", "a") is None
    parked.started("env", id(worker), seconds=1.0)  # starts take 1 s here
    parked.put([parked.gave("env", worker)])  # runs hold an actor for ~0 s
    assert parked.take_or_start("env", "b") is worker
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(parked.take_or_start("env", "c")))
    waiting.start()
    time.sleep(0.3)
    assert waiting.is_alive()  # a slot is free, but run b should park its worker sooner than a new one starts
    parked.put([worker])
    waiting.join(5)
    assert got == [worker]
    began = time.monotonic()
    assert parked.take_or_start("env", "d") is None  # run c's worker is overdue: d starts one
    assert time.monotonic() - began > 0.5

