"""Verification: a candidate is only eligible to win if it matches the reference on every case.

Cases are the tuned shape under several seeds plus the op's edge cases (T=1, all done, no done, odd and long
sizes): random draws alone rarely hit the corners where fast rewrites go wrong. A candidate that raises, mutates
its inputs, returns the wrong shape/dtype/device, produces NaN/inf where the reference does not, or differs by more
than the dtype's tolerance is rejected, and the reason is kept for the report. For ops with `grad_argnums` (losses)
the gradients are held to the same standard: the backward pass is half of what a fused loss rewrites.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gymflow_kernels.registry import CandidateUnavailable, Kernel, Op

MIN_SEEDS = 3


FRESH_SEED = 1000
"""First seed of the fresh inputs a suspiciously large speedup is re-verified on (far from the tuning seeds)."""


@dataclass(frozen=True)
class Case:
    """One verification input and the reference's output (and, for differentiable ops, gradients) on it."""

    label: str
    inputs: tuple
    expected: tuple[Tensor, ...]
    cotangents: tuple[Tensor | None, ...] = ()
    """Fixed random weights of each differentiable output in the backward pass (None: output not differentiated)."""
    expected_grads: tuple[Tensor, ...] = ()
    """Reference gradients w.r.t. the op's `grad_argnums`, in that order."""


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one candidate over all cases."""

    ok: bool
    reason: str | None
    max_abs_err: float
    """Largest |candidate - reference| seen over the cases that were compared."""
    nonfinite: int
    """NaN/inf values the candidate produced where the reference's output is finite."""


def build_cases(op: Op, shape: dict, seeds: int = MIN_SEEDS, *, first_seed: int = 0, edges: bool = True) -> list[Case]:
    """The cases every candidate of `op` is checked on: `shape` under `seeds` seeds, then the op's edge cases.

    Edge cases take the tuned shape's "dtype" and "device", so a bucket is verified as it will be called.
    """
    if seeds < MIN_SEEDS:
        raise ValueError(f"verification needs at least {MIN_SEEDS} seeds, found {seeds}")
    specs = [(f"seed {seed} at {shape}", shape, seed) for seed in range(first_seed, first_seed + seeds)]
    placement = {k: shape[k] for k in ("dtype", "device") if k in shape}
    specs += [(f"edge case {edge}", {**edge, **placement}, 0) for edge in (op.edge_cases if edges else ())]
    cases = []
    for index, (label, case_shape, seed) in enumerate(specs):
        inputs = op.make_inputs(case_shape, seed)
        outputs, grad_inputs = run_with_grads(op, op.reference, clone_inputs(inputs))
        cotangents = tuple(
            torch.randn(out.shape, generator=torch.Generator().manual_seed(index)).to(out)
            if out.requires_grad else None for out in outputs
        ) if op.grad_argnums else ()
        grads = _grads(outputs, grad_inputs, cotangents) if op.grad_argnums else ()
        cases.append(Case(label, inputs, tuple(o.detach() for o in outputs), cotangents, grads))
    return cases


def run_with_grads(op: Op, fn: Kernel, inputs: tuple) -> tuple[tuple, list[Tensor]]:
    """`fn(*inputs)` with gradients enabled on `op.grad_argnums` (made leaves here); (outputs, those leaves)."""
    inputs = list(inputs)
    for i in op.grad_argnums:
        inputs[i] = inputs[i].detach().requires_grad_(True)
    return _as_tuple(fn(*inputs)), [inputs[i] for i in op.grad_argnums]


def _grads(outputs: tuple, grad_inputs: list[Tensor], cotangents: tuple) -> tuple[Tensor, ...]:
    """d(sum of cotangent-weighted outputs)/d(grad_inputs); an input the outputs do not reach gets zeros."""
    pairs = [(o, c) for o, c in zip(outputs, cotangents) if c is not None]
    if not pairs:
        return tuple(torch.zeros_like(x) for x in grad_inputs)
    grads = torch.autograd.grad([o for o, _ in pairs], grad_inputs, [c for _, c in pairs], allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(grad_inputs, grads))


def verify(op: Op, candidate: Kernel, cases: list[Case]) -> Verdict:
    """Run `candidate` on every case and compare with the reference's outputs; stops at the first failure."""
    max_err, nonfinite = 0.0, 0
    for case in cases:
        inputs = clone_inputs(case.inputs)  # the candidate gets copies: it can neither see nor spoil the originals
        try:
            found, grad_inputs = run_with_grads(op, candidate, inputs)
            if not all(_same(a, b) for a, b in zip(inputs, case.inputs)):
                return Verdict(False, f"{case.label}: modified its input arguments", max_err, nonfinite)
            problem, err, bad = _compare(op, case.expected, tuple(_detached(found)))
            if problem is None and op.grad_argnums:
                problem, err, bad = _compare_grads(op, case, found, grad_inputs, err, bad)
        except CandidateUnavailable as exc:
            return Verdict(False, f"unavailable: {exc}", max_err, nonfinite)
        except Exception as exc:  # noqa: BLE001 - any exception disqualifies the candidate, with its message
            return Verdict(False, f"{case.label}: raised {type(exc).__name__}: {exc}", max_err, nonfinite)
        max_err, nonfinite = max(max_err, err), nonfinite + bad
        if problem:
            return Verdict(False, f"{case.label}: {problem}", max_err, nonfinite)
    return Verdict(True, None, max_err, nonfinite)


def _compare_grads(
    op: Op, case: Case, found: tuple, grad_inputs: list[Tensor], err: float, bad: int
) -> tuple[str | None, float, int]:
    """Check the candidate's gradients like its outputs; a differentiable output that carries none is a failure."""
    for i, (out, cotangent) in enumerate(zip(found, case.cotangents)):
        if cotangent is not None and not (isinstance(out, Tensor) and out.requires_grad):
            return f"output {i} carries no gradient, but the reference's does", err, bad
    grads = _grads(found, grad_inputs, case.cotangents)
    problem, grad_err, grad_bad = _compare(op, case.expected_grads, grads, what="gradient w.r.t. argument",
                                           index=op.grad_argnums)
    return problem, max(err, grad_err), bad + grad_bad


def _detached(outputs: tuple) -> list:
    return [o.detach() if isinstance(o, Tensor) else o for o in outputs]


def _compare(
    op: Op, expected: tuple[Tensor, ...], found: tuple, *, what: str = "output", index: tuple[int, ...] = ()
) -> tuple[str | None, float, int]:
    """(problem or None, max abs error, count of unexpected NaN/inf) for one case's outputs (or gradients)."""
    if len(found) != len(expected) or not all(isinstance(f, Tensor) for f in found):
        kinds = [type(f).__name__ for f in found]
        return f"expected {len(expected)} tensor {what}s, found {kinds}", 0.0, 0
    max_err, nonfinite = 0.0, 0
    for n, (want, got) in enumerate(zip(expected, found)):
        i = index[n] if index else n
        if (got.shape, got.dtype, got.device) != (want.shape, want.dtype, want.device):
            return (f"{what} {i}: expected {tuple(want.shape)} {want.dtype} on {want.device}, "
                    f"found {tuple(got.shape)} {got.dtype} on {got.device}"), max_err, nonfinite
        if not want.is_floating_point():
            if not torch.equal(got, want):
                return f"{what} {i}: differs from the reference", max_err, nonfinite
            continue
        got = got.detach()
        bad = int((~torch.isfinite(got) & torch.isfinite(want)).sum())
        nonfinite += bad
        if bad:
            return f"{what} {i}: {bad} NaN/inf values where the reference is finite", max_err, nonfinite
        tol = op.tolerance(want.dtype)
        both = torch.isfinite(want)
        diff = (got - want).abs().where(both, torch.zeros_like(want))
        max_err = max(max_err, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(got, want, rtol=tol.rtol, atol=tol.atol, equal_nan=True):
            excess = diff - (tol.atol + tol.rtol * want.abs().where(both, torch.zeros_like(want)))
            at = tuple(int(j) for j in torch.unravel_index(excess.argmax(), want.shape))
            return (f"{what} {i} differs beyond rtol={tol.rtol:g}, atol={tol.atol:g}: at index {at} expected "
                    f"{float(want[at]):.6g}, found {float(got[at]):.6g} (max |diff| {max_err:.3g})"), max_err, nonfinite
    return None, max_err, nonfinite


def _as_tuple(outputs: object) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def clone_inputs(inputs: tuple) -> tuple:
    """Copies of the tensor arguments (others as they are): each run gets inputs it cannot spoil for the next."""
    return tuple(x.clone() if isinstance(x, Tensor) else x for x in inputs)


def _same(a: object, b: object) -> bool:
    if not isinstance(a, Tensor):
        return a == b
    a = a.detach()
    if (a.shape, a.dtype) != (b.shape, b.dtype):
        return False
    return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) if a.is_floating_point() else torch.equal(a, b)
