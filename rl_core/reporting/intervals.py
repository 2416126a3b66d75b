"""Score statistics a reviewer accepts over a handful of seeds: mean, interquartile mean (IQM), percentile bootstrap
95% intervals, and verdicts between two groups of runs that say only what the intervals say.

The same estimators as rliable (Agarwal et al., 2021, "Deep RL at the Edge of the Statistical Precipice") for one
task: IQM is the mean of the middle half of the runs (scipy's ``trim_mean(x, 0.25)``: with 5 seeds, the middle 3),
and intervals resample the seeds with replacement. A few lines of numpy instead of rliable, which would pull arch
and its compiled dependencies in for these functions. Used by sweeps' reports (flows/sweep.py) and benchmarks
(bench/intervals.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

RESAMPLES = 10_000
"""Bootstrap resamples; the interval's ends move by well under 1% of the spread between seeds with this many."""

VERDICTS = ("better", "not worse", "worse", "inconclusive")


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
    """Percentile bootstrap interval of mean(ours) - mean(theirs), each group's runs resampled on their own
    (the seeds of two groups are independent runs, not pairs)."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    if min(len(a), len(b)) < 2:
        raise ValueError(f"a difference interval needs at least 2 runs a side, got {len(a)} and {len(b)}")
    rng = np.random.default_rng(seed)
    da = a[rng.integers(0, len(a), size=(RESAMPLES, len(a)))].mean(axis=1)
    db = b[rng.integers(0, len(b), size=(RESAMPLES, len(b)))].mean(axis=1)
    return _percentile_interval(da - db, confidence)


def _percentile_interval(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central `confidence` share of bootstrap statistics."""
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(stats, tail)), float(np.percentile(stats, 100 - tail))


def verdict_of(interval: tuple[float, float] | None, margin: float) -> str:
    """The claim a difference interval (ours - theirs, higher is better) allows: 'better' or 'worse' where it excludes
    0; 'not worse' where it holds 0 but lies above -margin (a non-inferiority claim: any loss is smaller than the
    margin); else 'inconclusive', as without an interval (under 2 runs a side)."""
    if interval is None:
        return "inconclusive"
    low, high = interval
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "not worse" if low >= -margin else "inconclusive"


def compared(ours: Sequence[float], theirs: Sequence[float], margin: float = 0.0
             ) -> tuple[tuple[float, float] | None, str]:
    """The difference interval of two groups' runs (None under 2 runs a side) and `verdict_of` it (see there)."""
    interval = difference_interval(ours, theirs) if min(len(ours), len(theirs)) >= 2 else None
    return interval, verdict_of(interval, margin)


def verdict(ours: Sequence[float], theirs: Sequence[float], margin: float = 0.0) -> str:
    """`verdict_of` the difference interval of two groups' runs (see there); 'inconclusive' under 2 runs a side."""
    return compared(ours, theirs, margin)[1]


def summarize(values: Sequence[float], digits: int = 1) -> dict[str, float | list[float] | None]:
    """Mean and IQM with their bootstrap 95% intervals (None under 2 runs), and the runs themselves."""
    enough = len(values) >= 2

    def rounded(pair: tuple[float, float]) -> list[float]:
        return [round(v, digits) for v in pair]

    return {"mean": round(float(np.mean(values)), digits),
            "mean_ci95": rounded(bootstrap_interval(values)) if enough else None,
            "iqm": round(iqm(values), digits),
            "iqm_ci95": rounded(bootstrap_interval(values, iqm)) if enough else None,
            "runs": [round(float(v), digits) for v in values]}


def pairwise_verdicts(groups: dict[str, Sequence[float]], margin_fraction: float) -> list[dict[str, Any]]:
    """Each ordered pair of groups (A, B): the difference interval of mean(A) - mean(B) (None under 2 runs a side)
    and `verdict_of` it, the non-inferiority margin being `margin_fraction` of |mean(B)| (the group compared
    against sets the scale)."""
    rows = []
    for a, ours in groups.items():
        for b, theirs in groups.items():
            if a == b:
                continue
            margin = margin_fraction * abs(float(np.mean(theirs)))
            interval, said = compared(ours, theirs, margin)
            rows.append({"group": a, "versus": b, "difference_ci95": list(interval) if interval else None,
                         "margin": margin, "verdict": said})
    return rows
