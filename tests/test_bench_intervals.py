"""bench/intervals.py: the statistics docs/benchmarks.md's return claims rest on (IQM, bootstrap intervals, the
verdict)."""
from __future__ import annotations

import numpy as np
import pytest

from bench.intervals import (
    bootstrap_interval,
    compare,
    difference_interval,
    iqm,
    summarize,
    verdict,
)


def test_iqm_averages_the_middle_half_of_the_runs() -> None:
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # drops 1, 2 and 7, 8
    assert iqm([100.0, 1.0, 2.0, 3.0, -50.0]) == 2.0  # 5 runs: drops one at each end, whatever their order
    assert iqm([3.0, 5.0]) == 4.0  # under 4 runs nothing is dropped


def test_bootstrap_interval_brackets_the_statistic_and_repeats_exactly() -> None:
    runs = [2162.0, 3340.0, 1395.3, 1126.1, 2861.1]
    low, high = bootstrap_interval(runs)
    assert min(runs) <= low < np.mean(runs) < high <= max(runs)
    assert bootstrap_interval(runs) == (low, high)  # seeded
    assert bootstrap_interval([7.0, 7.0, 7.0]) == (7.0, 7.0)
    with pytest.raises(ValueError, match="at least 2 runs"):
        bootstrap_interval([1.0])


def test_the_verdict_says_only_what_the_difference_interval_says() -> None:
    ours, theirs = [10.0, 11.0, 12.0, 13.0, 14.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert difference_interval(ours, theirs)[0] > 0
    assert verdict(ours, theirs) == "better" and verdict(theirs, ours) == "worse"
    overlapping = [3.0, 5.0, 7.0, 9.0, 11.0]
    low, high = difference_interval(overlapping, [4.0, 6.0, 8.0, 10.0, 12.0])
    assert low < 0 < high and verdict(overlapping, [4.0, 6.0, 8.0, 10.0, 12.0]) == "not worse"


def test_compare_reads_bench_ppo_results_per_task_and_system() -> None:
    runs = {"Hopper-v5": {"direct": [{"final_return": v} for v in (10.0, 11.0, 12.0)],
                          "sb3": [{"final_return": v} for v in (1.0, 2.0, 3.0)]},
            "Swimmer-v5": {"direct": [{"final_return": 5.0}]}}  # one seed: no interval, left out
    out = compare(runs)
    assert out["returns_direct_hopper"] == summarize([10.0, 11.0, 12.0])
    assert out["return_verdict_hopper"] == "better"
    assert not [k for k in out if "swimmer" in k]
