"""The tuner: per shape bucket, verify every candidate, time the survivors, and cache the winner.

Usage: python -m kernels.autotune --ops gae --shapes 256x64 1024x64 --report
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

import torch

from kernels.cache import cache_key, read_entries, winners_path, write_entry
from kernels.registry import REFERENCE, Op, describe, get_op, registered_ops
from kernels.timing import pick_winner, time_kernel
from kernels.verify import MIN_SEEDS, build_cases, verify

DEFAULT_MIN_RUN_TIME = 0.2
"""Seconds of timing per implementation and bucket: enough for a stable median of millisecond kernels."""


@dataclass
class CandidateResult:
    """What the tuner found out about one implementation in one bucket."""

    name: str
    verified: bool
    reason: str | None = None
    """Why it was rejected (None when verified)."""
    max_abs_err: float | None = None
    median_s: float | None = None
    iqr_s: float | None = None
    speedup: float | None = None
    """Reference median / this median; > 1 means faster than the reference."""


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

    @classmethod
    def from_entry(cls, entry: dict) -> BucketReport:
        """Rebuild a report from its cache entry (raises KeyError/TypeError on a malformed entry)."""
        fields = {k: v for k, v in entry.items() if k != "candidates"}
        return cls(**fields, candidates=[CandidateResult(**c) for c in entry["candidates"]])

    def to_entry(self) -> dict:
        """The cache entry for this result; whether it came from the cache is not part of it."""
        entry = asdict(self)
        del entry["cache_hit"]
        return entry


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
            lines.append(f"  {'candidate':<12}{'verified':<10}{'median ms':>11}{'iqr ms':>10}{'speedup':>10}  note")
            for c in b.candidates:
                timed = c.median_s is not None
                median = f"{c.median_s * 1e3:.4f}" if timed else "-"
                iqr = f"{c.iqr_s * 1e3:.4f}" if timed else "-"
                speedup = f"{c.speedup:.2f}x" if timed else "-"
                note = c.reason or ("winner" if c.name == b.winner else "")
                lines.append(f"  {c.name:<12}{'yes' if c.verified else 'no':<10}{median:>11}{iqr:>10}{speedup:>10}  "
                             f"{note}")
        return "\n".join(lines)


def _fmt(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def tune_bucket(
    op: Op, shape: dict, *, seeds: int = MIN_SEEDS, min_run_time: float = DEFAULT_MIN_RUN_TIME,
    num_threads: int | None = None,
) -> BucketReport:
    """Verify every candidate of `op` at `shape` (plus edge cases), time the survivors and the reference, pick.

    Touches no cache: `autotune` stores the result, `bench/` only prints it.
    """
    threads = num_threads or torch.get_num_threads()
    cases = build_cases(op, shape, seeds)
    results = {REFERENCE: CandidateResult(REFERENCE, verified=True, max_abs_err=0.0)}
    for name, fn in op.candidates.items():
        verdict = verify(op, fn, cases)
        results[name] = CandidateResult(name, verdict.ok, verdict.reason, verdict.max_abs_err)
    inputs = op.make_inputs(shape, 0)
    implementations = op.implementations()
    timings = {name: time_kernel(implementations[name], inputs, min_run_time=min_run_time, num_threads=threads)
               for name, result in results.items() if result.verified}
    reference_s = timings[REFERENCE].median_s
    for name, timing in timings.items():
        result = results[name]
        result.median_s, result.iqr_s, result.speedup = timing.median_s, timing.iqr_s, reference_s / timing.median_s
    dtype, device = describe(inputs)
    return BucketReport(shape=dict(shape), bucket=op.bucket(inputs), dtype=dtype, device=device, num_threads=threads,
                        winner=pick_winner(timings), candidates=list(results.values()))


def autotune(
    op: str, shapes: list[dict], *, force: bool = False, seeds: int = MIN_SEEDS,
    min_run_time: float = DEFAULT_MIN_RUN_TIME, num_threads: int | None = None,
) -> TuneReport:
    """Tune `op` for the bucket of each shape: a cached winner is returned as is unless `force`; otherwise the
    bucket is tuned at that shape and the winner stored. Shapes falling into the same bucket are tuned once.

    `min_run_time` is the timing budget per implementation and bucket; `num_threads` defaults to torch's current
    setting, which is also what `dispatch` looks winners up by.
    """
    spec = get_op(op)
    threads = num_threads or torch.get_num_threads()
    path = winners_path()
    stored = {} if force else read_entries(path)
    report, seen = TuneReport(op), set()
    for shape in shapes:
        inputs = spec.make_inputs(shape, 0)
        key = cache_key(spec, spec.bucket(inputs), *describe(inputs), threads)
        if key in seen:
            continue
        seen.add(key)
        cached = _cached_report(spec, stored.get(key))
        if cached is None:
            cached = tune_bucket(spec, shape, seeds=seeds, min_run_time=min_run_time, num_threads=threads)
            write_entry(path, key, cached.to_entry())
        report.buckets.append(cached)
    return report


def _cached_report(op: Op, entry: dict | None) -> BucketReport | None:
    """The stored report for a bucket if it is well-formed and names an implementation that still exists."""
    if not isinstance(entry, dict):
        return None
    try:
        report = BucketReport.from_entry(entry)
    except (KeyError, TypeError):
        return None
    if report.winner not in op.implementations():
        return None
    report.cache_hit = True
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: tune the given ops at the given shapes, print a summary or the full report."""
    parser = argparse.ArgumentParser(prog="python -m kernels.autotune", description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", required=True, help=f"ops to tune; registered: {registered_ops()}")
    parser.add_argument("--shapes", nargs="+", required=True, help="shapes spelled like 256x64 (TxN for gae)")
    parser.add_argument("--report", action="store_true", help="print the full report as a table and as JSON")
    parser.add_argument("--force", action="store_true", help="re-tune buckets that already have a cached winner")
    parser.add_argument("--min-run-time", type=float, default=DEFAULT_MIN_RUN_TIME,
                        help="timing budget in seconds per implementation and bucket")
    parser.add_argument("--seeds", type=int, default=MIN_SEEDS, help="random seeds verified per bucket")
    args = parser.parse_args(argv)
    reports = []
    for name in args.ops:
        try:
            spec = get_op(name)
            shapes = [spec.parse_shape(text) for text in args.shapes]
        except (KeyError, ValueError) as exc:
            parser.error(exc.args[0])
        reports.append(autotune(name, shapes, force=args.force, seeds=args.seeds, min_run_time=args.min_run_time))
    for report in reports:
        if args.report:
            print(report.table())
        else:
            for b in report.buckets:
                print(f"{report.op} {_fmt(b.bucket)}: {b.winner}{' (cache hit)' if b.cache_hit else ''}")
    if args.report:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    print(f"winners cached in {winners_path()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from kernels.autotune import main as package_main  # the package's copy, not this __main__ duplicate

    sys.exit(package_main())
