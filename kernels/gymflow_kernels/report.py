"""What tuning found, in forms people and programs read: dataclasses, a text table, table rows, JSON, fast_p.

fast_p follows KernelBench: the share of problems whose chosen implementation is correct and more than p times as
fast as the reference. Here a problem is one op at one shape bucket; the reference itself counts as speedup 1.0, so
fast_1.0 is the share of problems where a verified candidate beat the reference.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

FAST_P = (1.0, 1.5)
"""The p values reported by default."""


@dataclass
class CandidateResult:
    """What the tuner found out about one implementation in one bucket."""

    name: str
    verified: bool
    reason: str | None = None
    """Why it was rejected (None when verified); for a verified proposal, where its code was saved."""
    max_abs_err: float | None = None
    median_s: float | None = None
    iqr_s: float | None = None
    speedup: float | None = None
    """Reference median / this median; > 1 means faster than the reference."""
    build_s: float | None = None
    """Extra time of the first call in this process over a timed call: build, load or JIT compile."""
    nonfinite: int = 0
    """NaN/inf values produced where the reference's output was finite (counted up to the first failing case)."""
    reverified: bool = False
    """A speedup over the re-verification threshold held on fresh inputs (and was re-timed on them)."""


@dataclass
class BucketReport:
    """Tuning result for one shape bucket."""

    shape: dict
    """The shape the measurements were made at (a member of `bucket`)."""
    bucket: dict
    dtype: str
    device: str
    num_threads: int
    winner: str
    candidates: list[CandidateResult]
    cache_hit: bool = False
    proposals: list[CandidateResult] = field(default_factory=list)
    """Proposed candidates (kernels.proposers), checked in a subprocess; reported for review, never dispatched."""

    @classmethod
    def from_entry(cls, entry: dict) -> BucketReport:
        """Rebuild a report from its cache entry (raises KeyError/TypeError on a malformed entry)."""
        fields = {k: v for k, v in entry.items() if k not in ("candidates", "proposals")}
        return cls(**fields, candidates=[CandidateResult(**c) for c in entry["candidates"]],
                   proposals=[CandidateResult(**c) for c in entry.get("proposals", [])])

    def to_entry(self) -> dict:
        """The cache entry for this result; whether it came from the cache is not part of it."""
        entry = asdict(self)
        del entry["cache_hit"]
        return entry

    def result(self, name: str) -> CandidateResult:
        """The result of implementation `name` (KeyError naming the ones present when absent)."""
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(f"no result for {name!r} in this bucket; found {[c.name for c in self.candidates]}")

    @property
    def winner_speedup(self) -> float:
        """Speedup of the chosen implementation over the reference (1.0 when the reference stayed)."""
        return self.result(self.winner).speedup or 1.0


@dataclass
class TuneReport:
    """Everything `autotune` decided for one op, one `BucketReport` per distinct bucket."""

    op: str
    buckets: list[BucketReport] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain JSON-serialisable form."""
        return asdict(self)

    def table(self) -> str:
        """Human-readable table, one block per bucket."""
        lines = []
        for b in self.buckets:
            lines.append(f"{self.op} shape {_fmt(b.shape)} (bucket {_fmt(b.bucket)}) {b.dtype} {b.device} "
                         f"threads={b.num_threads}: winner {b.winner}{' (cache hit)' if b.cache_hit else ''}")
            lines.append(f"  {'candidate':<14}{'verified':<10}{'median ms':>11}{'iqr ms':>10}{'speedup':>10}"
                         f"{'build s':>9}  note")
            for c in [*b.candidates, *b.proposals]:
                lines.append(_row(c, b.winner))
        return "\n".join(lines)

    def rows(self) -> list[dict]:
        """One flat dict per (bucket, implementation): the rows of a table artifact."""
        return [
            {"op": self.op, "bucket": _fmt(b.bucket), "dtype": b.dtype, "device": b.device,
             "candidate": c.name, "verified": c.verified, "median_ms": _ms(c.median_s),
             "speedup": None if c.speedup is None else round(c.speedup, 2),
             "build_s": None if c.build_s is None else round(c.build_s, 2),
             "winner": c.name == b.winner, "note": c.reason or ""}
            for b in self.buckets for c in [*b.candidates, *b.proposals]
        ]


def _row(c: CandidateResult, winner: str) -> str:
    timed = c.median_s is not None
    median = f"{c.median_s * 1e3:.4f}" if timed else "-"
    iqr = f"{c.iqr_s * 1e3:.4f}" if timed and c.iqr_s is not None else "-"
    speedup = f"{c.speedup:.2f}x" if timed and c.speedup is not None else "-"
    build = f"{c.build_s:.2f}" if c.build_s is not None else "-"
    note = c.reason or ("winner" if c.name == winner else "")
    if c.reverified:
        note = f"{note}, re-verified on fresh inputs".lstrip(", ")
    return (f"  {c.name:<14}{'yes' if c.verified else 'no':<10}{median:>11}{iqr:>10}{speedup:>10}{build:>9}  "
            f"{note}")


def _fmt(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


def fast_p(reports: list[TuneReport], p: float) -> float:
    """KernelBench's fast_p over every (op, bucket): share whose winner is verified and > p times the reference."""
    buckets = [b for r in reports for b in r.buckets]
    if not buckets:
        raise ValueError("fast_p needs at least one tuned bucket, found none")
    fast = sum(b.result(b.winner).verified and b.winner_speedup > p for b in buckets)
    return fast / len(buckets)


def geomean_speedup(reports: list[TuneReport]) -> float:
    """Geometric mean over every (op, bucket) of the winner's speedup over the reference."""
    speedups = [b.winner_speedup for r in reports for b in r.buckets]
    if not speedups:
        raise ValueError("geomean_speedup needs at least one tuned bucket, found none")
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


def summary(reports: list[TuneReport], ps: tuple[float, ...] = FAST_P) -> dict:
    """The headline numbers plus every report, as one JSON-serialisable dict."""
    return {
        "geomean_speedup": round(geomean_speedup(reports), 3),
        **{f"fast_{p}": round(fast_p(reports, p), 3) for p in ps},
        "winners": {f"{r.op} {_fmt(b.bucket)}": b.winner for r in reports for b in r.buckets},
        "ops": [r.to_dict() for r in reports],
    }
