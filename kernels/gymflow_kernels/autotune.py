"""The tuner: per shape bucket, verify every candidate, time the survivors, and cache the winner.

Usage: python -m gymflow_kernels --ops gae,ppo_loss --report   (see kernels/gymflow_kernels/cli.py for every option)
"""

from __future__ import annotations

import os
import time

import torch
from torch import Tensor

from gymflow_kernels.cache import cache_key, read_entries, winners_path, write_entry
from gymflow_kernels.proposers import CandidateProposer, evaluate_proposals
from gymflow_kernels.registry import COMPILE, REFERENCE, Kernel, Op, describe, get_op, per_process_setup
from gymflow_kernels.report import BucketReport, CandidateResult, TuneReport
from gymflow_kernels.timing import Timing, pick_winner, time_kernels
from gymflow_kernels.verify import FRESH_SEED, MIN_SEEDS, build_cases, clone_inputs, run_with_grads, verify

DEFAULT_MIN_RUN_TIME = 0.2
"""Seconds of timing per implementation and bucket: enough for a stable median of millisecond kernels."""

REVERIFY_SPEEDUP = 10.0
"""A speedup above this is too good to take on trust: re-verified and re-timed on fresh inputs first."""


def default_opt_in() -> frozenset[str]:
    """Opt-in candidate groups asked for through the environment: GYMFLOW_KERNELS_COMPILE=1 adds torch.compile."""
    wanted = os.environ.get("GYMFLOW_KERNELS_COMPILE", "").lower() in {"1", "true", "yes"}
    return frozenset({COMPILE}) if wanted else frozenset()


def tune_bucket(
    op: Op, shape: dict, *, seeds: int = MIN_SEEDS, min_run_time: float = DEFAULT_MIN_RUN_TIME,
    num_threads: int | None = None, opt_in: frozenset[str] | None = None, calls_per_run: int | None = None,
) -> BucketReport:
    """Verify every eligible candidate of `op` at `shape` (plus edge cases), time the survivors and the reference,
    pick the cheapest per call once a JIT's per-process setup is spread over `calls_per_run` (default: the op's).

    Touches no cache: `autotune` stores the result, `bench/` only prints it.
    """
    threads = num_threads or torch.get_num_threads()
    candidates = op.eligible(shape.get("device", "cpu"), default_opt_in() if opt_in is None else opt_in)
    implementations: dict[str, Kernel] = {REFERENCE: op.reference, **candidates}
    inputs = op.make_inputs(shape, 0)
    first_call = {name: _first_call_s(op, fn, inputs) for name, fn in implementations.items()}  # builds, compiles
    cases = build_cases(op, shape, seeds)
    results = {REFERENCE: CandidateResult(REFERENCE, verified=True, max_abs_err=0.0)}
    for name, fn in candidates.items():
        verdict = verify(op, fn, cases)
        results[name] = CandidateResult(name, verdict.ok, verdict.reason, verdict.max_abs_err,
                                        nonfinite=verdict.nonfinite)
    timing = _time(op, {n: implementations[n] for n, r in results.items() if r.verified}, inputs, min_run_time,
                   threads)
    for name, t in timing.items():
        _record(results[name], t, timing[REFERENCE], first_call[name])
    _reverify_large_speedups(op, shape, seeds, implementations, results, timing, min_run_time, threads)
    calls = calls_per_run or op.calls_per_run
    setup = {name: (results[name].build_s or 0.0) / calls for name in timing
             if per_process_setup(implementations[name])}
    dtype, device = describe(inputs)
    return BucketReport(shape=dict(shape), bucket=op.bucket(inputs), dtype=dtype, device=device, num_threads=threads,
                        winner=pick_winner(timing, setup), candidates=list(results.values()))


def _first_call_s(op: Op, fn: Kernel, inputs: tuple) -> float | None:
    """Seconds of the first call (and backward) in this process, which pays any build; None if it raised
    (verification then records why)."""
    start = time.perf_counter()
    try:
        outputs, wrt = run_with_grads(op, fn, clone_inputs(inputs))
        differentiable = [o for o in outputs if isinstance(o, Tensor) and o.requires_grad]
        if differentiable and wrt:
            torch.autograd.grad(differentiable, wrt, [torch.ones_like(o) for o in differentiable], allow_unused=True)
    except Exception:  # noqa: BLE001 - verification reports the failure with its case
        return None
    return time.perf_counter() - start


def _time(op: Op, fns: dict[str, Kernel], inputs: tuple, min_run_time: float, threads: int) -> dict[str, Timing]:
    return time_kernels(fns, inputs, min_run_time=min_run_time, num_threads=threads, grad_argnums=op.grad_argnums)


def _record(result: CandidateResult, timing: Timing, reference: Timing, first_call_s: float | None) -> None:
    result.median_s, result.iqr_s = timing.median_s, timing.iqr_s
    result.speedup = reference.median_s / timing.median_s
    if first_call_s is not None:
        result.build_s = max(first_call_s - timing.median_s, 0.0)


def _reverify_large_speedups(
    op: Op, shape: dict, seeds: int, implementations: dict[str, Kernel], results: dict[str, CandidateResult],
    timing: dict[str, Timing], min_run_time: float, threads: int,
) -> None:
    """Re-verify every speedup over `REVERIFY_SPEEDUP` on fresh seeds and re-time it against the reference on fresh
    inputs. A candidate failing verification is rejected (and loses its timing, so it cannot win); one passing keeps
    the lower of its two speedups, so a lucky measurement cannot carry it."""
    suspects = [n for n, r in results.items() if n != REFERENCE and r.speedup and r.speedup > REVERIFY_SPEEDUP]
    if not suspects:
        return
    fresh_cases = build_cases(op, shape, seeds, first_seed=FRESH_SEED, edges=False)
    for name in suspects:
        result, verdict = results[name], verify(op, implementations[name], fresh_cases)
        if not verdict.ok:
            result.verified = False
            result.reason = f"{result.speedup:.0f}x speedup not confirmed on fresh inputs: {verdict.reason}"
            del timing[name]
    confirmed = [n for n in suspects if results[n].verified]
    if not confirmed:
        return
    fns = {n: implementations[n] for n in (REFERENCE, *confirmed)}
    fresh = _time(op, fns, op.make_inputs(shape, FRESH_SEED), min_run_time, threads)
    for name in confirmed:
        result = results[name]
        result.speedup = min(result.speedup, fresh[REFERENCE].median_s / fresh[name].median_s)
        result.median_s = timing[REFERENCE].median_s / result.speedup
        result.reverified = True
        timing[name] = Timing(result.median_s, result.iqr_s, timing[name].runs)


def autotune(
    op: str, shapes: list[dict] | None = None, *, force: bool = False, seeds: int = MIN_SEEDS,
    min_run_time: float = DEFAULT_MIN_RUN_TIME, num_threads: int | None = None,
    opt_in: frozenset[str] | None = None, calls_per_run: int | None = None,
    proposer: CandidateProposer | None = None,
) -> TuneReport:
    """Tune `op` for the bucket of each shape (default: the op's `default_shapes`): a cached winner is returned as
    is unless `force`, or unless it was tuned without a candidate eligible now (e.g. compile was opted in since);
    otherwise the bucket is tuned at that shape and the winner stored. Shapes in one bucket are tuned once.

    `num_threads` defaults to torch's current setting, which is also what `dispatch` looks winners up by.
    `proposer` adds proposals checked in a subprocess: reported and saved for review, never dispatched.
    """
    spec = get_op(op)
    threads = num_threads or torch.get_num_threads()
    opt_in = default_opt_in() if opt_in is None else opt_in
    path = winners_path()
    stored = {} if force else read_entries(path)
    report, seen = TuneReport(op), set()
    for shape in shapes or list(spec.default_shapes):
        inputs = spec.make_inputs(shape, 0)
        key = cache_key(spec, spec.bucket(inputs), *describe(inputs), threads)
        if key in seen:
            continue
        seen.add(key)
        wanted = {REFERENCE, *spec.eligible(shape.get("device", "cpu"), opt_in)}
        bucket = _cached_report(spec, stored.get(key), wanted)
        if bucket is None:
            bucket = tune_bucket(spec, shape, seeds=seeds, min_run_time=min_run_time, num_threads=threads,
                                 opt_in=opt_in, calls_per_run=calls_per_run)
        if proposer is not None:
            bucket.proposals = evaluate_proposals(spec, shape, proposer, seeds=seeds, min_run_time=min_run_time)
        if not bucket.cache_hit or proposer is not None:
            write_entry(path, key, bucket.to_entry())
        report.buckets.append(bucket)
    if not report.buckets:
        raise ValueError(f"op {op!r}: no shapes given and the op has no default_shapes; pass shapes to tune")
    return report


def _cached_report(op: Op, entry: dict | None, wanted: set[str]) -> BucketReport | None:
    """The stored report for a bucket if it is well-formed, names an implementation that still exists, and tried
    every implementation wanted now."""
    if not isinstance(entry, dict):
        return None
    try:
        report = BucketReport.from_entry(entry)
    except (KeyError, TypeError):
        return None
    if report.winner not in op.implementations() or not wanted <= {c.name for c in report.candidates}:
        return None
    report.cache_hit = True
    return report

