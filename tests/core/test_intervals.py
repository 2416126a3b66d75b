"""rl_core/reporting/intervals.py: the statistics sweep reports and benchmark claims rest on (IQM, bootstrap
intervals) and the verdict rule, which claims only what the difference interval says."""
from __future__ import annotations

import numpy as np
import pytest

from rl_core.reporting.intervals import (
    bootstrap_interval,
    difference_interval,
    iqm,
    pairwise_verdicts,
    summarize,
    verdict,
    verdict_of,
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
    with pytest.raises(ValueError, match="at least 2 runs a side"):
        difference_interval([1.0], [1.0, 2.0])


@pytest.mark.parametrize(("interval", "margin", "expected"), [
    ((0.5, 2.0), 0.0, "better"),
    ((-2.0, -0.1), 10.0, "worse"),  # a margin never softens a worse
    ((-0.5, 1.0), 1.0, "not worse"),  # holds 0, any loss under the margin
    ((-1.0, 1.0), 1.0, "not worse"),  # the margin's edge counts
    ((-1.5, 1.0), 1.0, "inconclusive"),  # a loss past the margin is possible
    ((-0.5, 1.0), 0.0, "inconclusive"),  # no margin: an overlap claims nothing
    (None, 5.0, "inconclusive"),  # no interval (under 2 runs a side)
])
def test_the_verdict_rule_claims_only_what_the_interval_says(interval, margin: float, expected: str) -> None:
    assert verdict_of(interval, margin) == expected


def test_verdicts_of_runs_follow_their_difference_interval() -> None:
    ours, theirs = [10.0, 11.0, 12.0, 13.0, 14.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert difference_interval(ours, theirs)[0] > 0
    assert verdict(ours, theirs) == "better" and verdict(theirs, ours) == "worse"
    a, b = [3.0, 5.0, 7.0, 9.0, 11.0], [4.0, 6.0, 8.0, 10.0, 12.0]
    low, high = difference_interval(a, b)
    assert low < 0 < high
    assert verdict(a, b) == "inconclusive" and verdict(a, b, margin=-low) == "not worse"
    assert verdict([1.0], b, margin=100.0) == "inconclusive"


def test_pairwise_verdicts_scale_the_margin_by_the_compared_group() -> None:
    groups = {"high": [100.0, 101.0, 102.0], "close": [99.0, 100.5, 101.5], "low": [1.0, 2.0, 3.0], "one": [50.0]}
    rows = {(r["group"], r["versus"]): r for r in pairwise_verdicts(groups, margin_fraction=0.05)}
    assert len(rows) == 12  # every ordered pair
    assert rows["high", "low"]["verdict"] == "better" and rows["low", "high"]["verdict"] == "worse"
    assert rows["close", "high"]["margin"] == pytest.approx(0.05 * 101.0)
    assert rows["close", "high"]["verdict"] == "not worse"  # its interval holds 0, above -5.05
    assert rows["one", "low"] == {"group": "one", "versus": "low", "difference_ci95": None,
                                  "margin": pytest.approx(0.1), "verdict": "inconclusive"}
    for row in rows.values():
        assert row["verdict"] == verdict_of(row["difference_ci95"] and tuple(row["difference_ci95"]), row["margin"])


def test_summarize_leaves_out_intervals_it_cannot_draw() -> None:
    assert summarize([3.0], digits=2) == {"mean": 3.0, "mean_ci95": None, "iqm": 3.0, "iqm_ci95": None, "runs": [3.0]}
    full = summarize([1.0, 2.0, 3.0])
    assert full["mean_ci95"][0] <= full["mean"] <= full["mean_ci95"][1]
