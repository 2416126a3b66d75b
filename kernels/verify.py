"""Verification: a candidate is only eligible to win if it matches the reference on every case.

Cases are the tuned shape under several seeds plus the op's edge cases (T=1, all done, no done, odd and long
sizes): random draws alone rarely hit the corners where fast rewrites go wrong. A candidate that raises, mutates
its inputs, returns the wrong shape/dtype/device, produces NaN/inf where the reference does not, or differs by more
than the dtype's tolerance is rejected, and the reason is kept for the report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kernels.registry import CandidateUnavailable, Kernel, Op

MIN_SEEDS = 3


@dataclass(frozen=True)
class Case:
    """One verification input and the reference's output on it."""

    label: str
    inputs: tuple
    expected: tuple[Tensor, ...]


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one candidate over all cases."""

    ok: bool
    reason: str | None
    max_abs_err: float
    """Largest |candidate - reference| seen over the cases that were compared."""
    nonfinite: int
    """NaN/inf values the candidate produced where the reference's output is finite."""


def build_cases(op: Op, shape: dict, seeds: int = MIN_SEEDS) -> list[Case]:
    """The cases every candidate of `op` is checked on: `shape` under `seeds` seeds, then the op's edge cases."""
    if seeds < MIN_SEEDS:
        raise ValueError(f"verification needs at least {MIN_SEEDS} seeds, found {seeds}")
    specs = [(f"seed {seed} at {shape}", shape, seed) for seed in range(seeds)]
    specs += [(f"edge case {edge}", edge, 0) for edge in op.edge_cases]
    cases = []
    for label, case_shape, seed in specs:
        inputs = op.make_inputs(case_shape, seed)
        expected = _as_tuple(op.reference(*_clone(inputs)))
        cases.append(Case(label, inputs, expected))
    return cases


def verify(op: Op, candidate: Kernel, cases: list[Case]) -> Verdict:
    """Run `candidate` on every case and compare with the reference's outputs; stops at the first failure."""
    max_err, nonfinite = 0.0, 0
    for case in cases:
        inputs = _clone(case.inputs)  # the candidate works on copies, so it can neither see nor spoil the originals
        try:
            found = _as_tuple(candidate(*inputs))
        except CandidateUnavailable as exc:
            return Verdict(False, f"unavailable: {exc}", max_err, nonfinite)
        except Exception as exc:  # noqa: BLE001 - any exception disqualifies the candidate, with its message
            return Verdict(False, f"{case.label}: raised {type(exc).__name__}: {exc}", max_err, nonfinite)
        if not all(_same(a, b) for a, b in zip(inputs, case.inputs)):
            return Verdict(False, f"{case.label}: modified its input arguments", max_err, nonfinite)
        problem, err, bad = _compare(op, case.expected, found)
        max_err, nonfinite = max(max_err, err), nonfinite + bad
        if problem:
            return Verdict(False, f"{case.label}: {problem}", max_err, nonfinite)
    return Verdict(True, None, max_err, nonfinite)


def _compare(op: Op, expected: tuple[Tensor, ...], found: tuple) -> tuple[str | None, float, int]:
    """(problem or None, max abs error, count of unexpected NaN/inf) for one case's outputs."""
    if len(found) != len(expected) or not all(isinstance(f, Tensor) for f in found):
        kinds = [type(f).__name__ for f in found]
        return f"expected {len(expected)} tensor outputs, found {kinds}", 0.0, 0
    max_err, nonfinite = 0.0, 0
    for i, (want, got) in enumerate(zip(expected, found)):
        if (got.shape, got.dtype, got.device) != (want.shape, want.dtype, want.device):
            return (f"output {i}: expected {tuple(want.shape)} {want.dtype} on {want.device}, "
                    f"found {tuple(got.shape)} {got.dtype} on {got.device}"), max_err, nonfinite
        got = got.detach()
        bad = int((~torch.isfinite(got) & torch.isfinite(want)).sum())
        nonfinite += bad
        if bad:
            return f"output {i}: {bad} NaN/inf values where the reference is finite", max_err, nonfinite
        tol = op.tolerance(want.dtype)
        both = torch.isfinite(want)
        diff = (got - want).abs().where(both, torch.zeros_like(want))
        max_err = max(max_err, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(got, want, rtol=tol.rtol, atol=tol.atol, equal_nan=True):
            excess = diff - (tol.atol + tol.rtol * want.abs().where(both, torch.zeros_like(want)))
            at = tuple(int(j) for j in torch.unravel_index(excess.argmax(), want.shape))
            return (f"output {i} differs beyond rtol={tol.rtol:g}, atol={tol.atol:g}: at index {at} expected "
                    f"{float(want[at]):.6g}, found {float(got[at]):.6g} (max |diff| {max_err:.3g})"), max_err, nonfinite
    return None, max_err, nonfinite


def _as_tuple(outputs: object) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _clone(inputs: tuple) -> tuple:
    return tuple(x.clone() if isinstance(x, Tensor) else x for x in inputs)


def _same(a: object, b: object) -> bool:
    if not isinstance(a, Tensor):
        return a == b
    return (a.shape, a.dtype) == (b.shape, b.dtype) and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
