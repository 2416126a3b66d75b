"""bench/intervals.py: bench/ppo.py's results per task and system, as docs/benchmarks.md's return claims read them
(the estimators and the verdict rule: tests/core/test_intervals.py)."""
from __future__ import annotations

from bench.intervals import compare
from rl_core.reporting.intervals import summarize


def test_compare_reads_bench_ppo_results_per_task_and_system() -> None:
    runs = {"Hopper-v5": {"direct": [{"final_return": v} for v in (10.0, 11.0, 12.0)],
                          "sb3": [{"final_return": v} for v in (1.0, 2.0, 3.0)]},
            "Swimmer-v5": {"direct": [{"final_return": 5.0}]}}  # one seed: no interval, left out
    out = compare(runs)
    assert out["returns_direct_hopper"] == summarize([10.0, 11.0, 12.0])
    assert out["return_verdict_hopper"] == "better"
    assert not [k for k in out if "swimmer" in k]


def test_overlapping_intervals_read_not_worse_against_sb3() -> None:
    """No margin is set against SB3: the benchmarks page's 'not worse' means the intervals overlap."""
    runs = {"Hopper-v5": {"direct": [{"final_return": v} for v in (3.0, 5.0, 7.0, 9.0, 11.0)],
                          "sb3": [{"final_return": v} for v in (4.0, 6.0, 8.0, 10.0, 12.0)]}}
    assert compare(runs)["return_verdict_hopper"] == "not worse"
