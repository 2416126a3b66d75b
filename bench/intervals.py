"""Return statistics a reviewer accepts over a handful of seeds: mean, interquartile mean (IQM) and percentile
bootstrap 95% intervals, and a verdict on two systems that only says what the intervals say.

The same estimators as rliable (Agarwal et al., 2021, "Deep RL at the Edge of the Statistical Precipice") for one
task: IQM is the mean of the middle half of the runs (scipy's ``trim_mean(x, 0.25)``: with 5 seeds, the middle 3),
and intervals resample the seeds with replacement. A few lines of numpy instead of rliable, which would pull arch
and its compiled dependencies into the test environment for these three functions.

Run: ``python bench/intervals.py RESULTS.json`` re-reads what ``bench/ppo.py --results`` wrote and prints each
task's and system's figures and the verdict of gymflow against SB3.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESAMPLES = 10_000
"""Bootstrap resamples; the interval's ends move by well under 1% of the spread between seeds with this many."""


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: drop the lowest and highest quarter of the runs (floor(n / 4) each), average the rest."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    cut = len(x) // 4
    return float(x[cut:len(x) - cut].mean())


def bootstrap_interval(values: Sequence[float], statistic: Callable[[np.ndarray], float] = np.mean,
                       confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over the runs (resampled with replacement, seeded)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        raise ValueError(f"an interval needs at least 2 runs, got {len(x)}")
    draws = np.random.default_rng(seed).integers(0, len(x), size=(RESAMPLES, len(x)))
    return _percentile_interval(np.array([statistic(x[d]) for d in draws]), confidence)


def difference_interval(ours: Sequence[float], theirs: Sequence[float], confidence: float = 0.95,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(ours) - mean(theirs), each system's runs resampled on their own
    (the seeds of two systems are independent runs, not pairs)."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    da = a[rng.integers(0, len(a), size=(RESAMPLES, len(a)))].mean(axis=1)
    db = b[rng.integers(0, len(b), size=(RESAMPLES, len(b)))].mean(axis=1)
    return _percentile_interval(da - db, confidence)


def _percentile_interval(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central `confidence` share of bootstrap statistics."""
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(stats, tail)), float(np.percentile(stats, 100 - tail))


def verdict(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """'better' or 'worse' where the difference's 95% interval excludes 0; otherwise 'not worse'
    (the intervals cannot tell the two apart, which is all such a claim may say)."""
    low, high = difference_interval(ours, theirs)
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "not worse"


def summarize(values: Sequence[float]) -> dict[str, float | list[float]]:
    """Mean and IQM with their bootstrap 95% intervals, and the runs themselves."""
    return {"mean": round(float(np.mean(values)), 1), "mean_ci95": [round(v, 1) for v in bootstrap_interval(values)],
            "iqm": round(iqm(values), 1), "iqm_ci95": [round(v, 1) for v in bootstrap_interval(values, iqm)],
            "runs": [round(float(v), 1) for v in values]}


def compare(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per task (``bench/ppo.py``'s key: 'halfcheetah'), per system: `summarize` of the final returns; and gymflow's
    (the in-process run, else the flow: the same weights) verdict against SB3."""
    out: dict[str, Any] = {}
    for task, by_system in runs.items():
        key = task.split("-")[0].lower()
        returns = {name: [r["final_return"] for r in rs] for name, rs in by_system.items()}
        if min(len(v) for v in returns.values()) < 2:
            continue
        for name, values in returns.items():
            out[f"returns_{name}_{key}"] = summarize(values)
        ours = returns.get("direct") or returns.get("flow")
        if ours and "sb3" in returns:
            out[f"return_verdict_{key}"] = verdict(ours, returns["sb3"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a file bench/ppo.py --results wrote")
    args = parser.parse_args()
    for key, value in compare(json.loads(args.results.read_text())["runs"]).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
