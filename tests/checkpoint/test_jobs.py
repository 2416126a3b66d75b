"""run_jobs: the caller works beside the pool, results come back in order, the earliest failure is raised."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rl_core.checkpoint.jobs import run_jobs


@pytest.fixture
def pool():
    with ThreadPoolExecutor(3, thread_name_prefix="helper") as executor:
        yield executor


def test_results_come_back_in_item_order_computed_by_the_caller_and_the_helpers(pool) -> None:
    threads: list[str] = []

    def square(x: int) -> int:
        threads.append(threading.current_thread().name)
        time.sleep(0.002)  # long enough for every thread to take items
        return x * x

    assert run_jobs(pool, 3, square, [(i,) for i in range(40)]) == [i * i for i in range(40)]
    assert threading.current_thread().name in threads
    assert {t for t in threads if t.startswith("helper")}, "no helper thread took an item"


def test_no_helper_works_on_a_single_item(pool) -> None:
    threads: list[str] = []
    assert run_jobs(pool, 3, lambda x: threads.append(threading.current_thread().name) or x, [(7,)]) == [7]
    assert threads == [threading.current_thread().name]


def test_the_earliest_items_failure_is_raised(pool) -> None:
    def job(i: int) -> int:
        if i == 0:
            time.sleep(0.05)  # fails after item 1 has: the earlier item's failure is still the one raised
            raise ValueError("item 0")
        if i == 1:
            raise ValueError("item 1")
        return i

    with pytest.raises(ValueError, match="item 0"):
        run_jobs(pool, 1, job, [(i,) for i in range(10)])


def test_no_item_starts_after_a_failure(pool) -> None:
    started: list[int] = []

    def job(i: int) -> int:
        started.append(i)
        if i == 0:
            raise ValueError("item 0")
        time.sleep(0.02)  # the other thread is inside item 1 when item 0 fails
        return i

    with pytest.raises(ValueError, match="item 0"):
        run_jobs(pool, 1, job, [(i,) for i in range(50)])
    assert set(started) <= {0, 1}  # item 1 only if the other thread took it before item 0 failed


def test_every_thread_is_done_when_it_returns(pool) -> None:
    running = []

    def job(i: int) -> None:
        running.append(i)
        time.sleep(0.003)
        running.remove(i)

    run_jobs(pool, 3, job, [(i,) for i in range(12)])
    assert running == []
