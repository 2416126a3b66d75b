"""The hot-op registry: what an op is, so the tuner and dispatch can treat every op the same way.

An `Op` bundles everything needed to swap implementations safely: the reference (the readable definition of
correct), the candidates (faster ways to compute the same thing), an input generator that also produces edge cases
(so verification covers what a random draw would miss), a shape bucket (so one tuning result serves every call of a
similar size) and tolerances by dtype (so "the same thing" has a number attached).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch

Kernel = Callable[..., Any]
"""One implementation of an op: takes the op's positional arguments, returns a tensor or a tuple of tensors."""

REFERENCE = "reference"
"""Name under which an op's reference implementation appears next to its candidates."""


class CandidateUnavailable(RuntimeError):
    """Raised by a candidate that cannot run here (missing compiler, failed build); the tuner records the reason."""


@dataclass(frozen=True)
class Tolerance:
    """`torch.allclose` tolerances for comparing a candidate's output to the reference's."""

    rtol: float
    atol: float


DEFAULT_TOLERANCES: Mapping[torch.dtype, Tolerance] = MappingProxyType(
    {torch.float32: Tolerance(rtol=1e-4, atol=1e-4), torch.bfloat16: Tolerance(rtol=1e-2, atol=1e-2)}
)

COMPILE = "compile"
"""Opt-in group of `torch.compile` candidates: a cold inductor compile costs minutes on a small CPU, so they are only
tried when asked for (`autotune(..., opt_in={COMPILE})`, `--compile`, or GYMFLOW_KERNELS_COMPILE=1)."""


def candidate(
    *, devices: tuple[str, ...] = ("cpu", "cuda"), opt_in: str | None = None, per_process_setup: bool = False,
    source: str = "",
) -> Callable[[Kernel], Kernel]:
    """Mark a candidate's traits, read by `Op.eligible` and the tuner.

    `devices`: device types it can run on (Triton: cuda only), so it is not even listed elsewhere.
    `opt_in`: group name; candidates in a group run only when that group is asked for (costly builds).
    `per_process_setup`: its first call in every process pays a setup (JIT compile) that the tuner weighs against
    the expected calls per run; a build cached on disk (C++) is paid once per machine and is not weighed.
    `source`: text beyond the Python source that defines what runs (C++, Triton), hashed into the cache key.
    """

    def mark(fn: Kernel) -> Kernel:
        fn.__kernel_devices__ = devices
        fn.__kernel_opt_in__ = opt_in
        fn.__kernel_per_process_setup__ = per_process_setup
        fn.__kernel_source__ = getattr(fn, "__kernel_source__", "") + source
        return fn

    return mark


def per_process_setup(fn: Kernel) -> bool:
    """Whether `fn`'s first call in a process pays a setup worth weighing (see `candidate`)."""
    return bool(getattr(fn, "__kernel_per_process_setup__", False))


@dataclass(frozen=True)
class Op:
    """A hot op: a reference implementation plus interchangeable candidates and what is needed to check them."""

    name: str
    reference: Kernel
    """The readable definition of correct; every candidate is compared against it and it wins all ties."""
    candidates: Mapping[str, Kernel]
    """Alternative implementations by name; each must accept the reference's arguments and match its outputs."""
    make_inputs: Callable[[dict, int], tuple]
    """`make_inputs(shape, seed)` -> positional arguments; shape keys beyond the dims select edge cases."""
    bucket: Callable[[tuple], dict]
    """`bucket(inputs)` -> shape bucket of a real call, the unit a tuning result is stored and looked up by."""
    dims: tuple[str, ...]
    """Shape keys in the order the CLI spelling "AxB" gives them, e.g. ("T", "N") for "256x64"."""
    edge_cases: tuple[dict, ...] = ()
    """Shape dicts that `make_inputs` turns into corner cases every candidate must also pass."""
    tolerances: Mapping[torch.dtype, Tolerance] = field(default_factory=lambda: DEFAULT_TOLERANCES)
    grad_argnums: tuple[int, ...] = ()
    """Positions of the arguments gradients flow to (losses): verified like outputs, and timed forward + backward."""
    default_shapes: tuple[dict, ...] = ()
    """Shapes tuned when none are given (CLI, bench): the sizes the flows call the op at."""
    calls_per_run: int = 100
    """Expected calls per process of a run: a per-process setup cost (JIT compile) is spread over this many calls."""

    def __post_init__(self) -> None:
        if REFERENCE in self.candidates:
            raise ValueError(
                f"op {self.name!r}: candidate name {REFERENCE!r} is reserved for the reference; rename the candidate"
            )
        # Freeze the candidate set: the cache key hashes it, so it must not change under a computed hash.
        object.__setattr__(self, "candidates", MappingProxyType(dict(self.candidates)))

    def implementations(self) -> dict[str, Kernel]:
        """The reference and every candidate, by name (reference first)."""
        return {REFERENCE: self.reference, **self.candidates}

    def eligible(self, device: str, opt_in: frozenset[str] | set[str] = frozenset()) -> dict[str, Kernel]:
        """Candidates that can run on `device` and are not in an opt-in group that was not asked for."""
        return {
            name: fn for name, fn in self.candidates.items()
            if device in getattr(fn, "__kernel_devices__", ("cpu", "cuda"))
            and getattr(fn, "__kernel_opt_in__", None) in {None, *opt_in}
        }

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        """Tolerance for outputs of `dtype`; a dtype without one cannot be verified, so it is an error."""
        try:
            return self.tolerances[dtype]
        except KeyError:
            known = ", ".join(str(d) for d in self.tolerances)
            raise KeyError(
                f"op {self.name!r} has no tolerance for {dtype}; known: {known}; add one to the op's tolerances"
            ) from None

    @functools.cached_property
    def source_hash(self) -> str:
        """Hash of the reference's and candidates' sources: a tuned winner is stale once any of them changes."""
        digest = hashlib.sha256()
        for name, fn in sorted(self.implementations().items()):
            digest.update(name.encode())
            digest.update(_source_of(fn).encode())
        return digest.hexdigest()[:16]

    def parse_shape(self, text: str) -> dict:
        """Turn the CLI spelling "256x64" into {"T": 256, "N": 64} using the op's dims."""
        parts = text.lower().split("x")
        if len(parts) != len(self.dims) or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(
                f"op {self.name!r}: expected a shape like {'x'.join(['64'] * len(self.dims))} "
                f"({'x'.join(self.dims)}), found {text!r}"
            )
        return dict(zip(self.dims, map(int, parts)))


def _source_of(fn: Kernel) -> str:
    """Source text that identifies an implementation; `__kernel_source__` covers code that is not Python (C++)."""
    extra = getattr(fn, "__kernel_source__", "")
    try:
        return inspect.getsource(fn) + extra
    except (OSError, TypeError):  # defined in a REPL or built at runtime: fall back to its bytecode
        code = getattr(fn, "__code__", None)
        return f"{getattr(fn, '__qualname__', repr(fn))}:{code.co_code.hex() if code else ''}{extra}"


def describe(inputs: tuple) -> tuple[str, str]:
    """(dtype, device type) of a call, taken from its first tensor argument: part of the cache key."""
    for value in inputs:
        if isinstance(value, torch.Tensor):
            return str(value.dtype).removeprefix("torch."), value.device.type
    raise TypeError(f"expected at least one tensor argument, found types {[type(v).__name__ for v in inputs]}")


_REGISTRY: dict[str, Op] = {}


def register(op: Op, *, replace: bool = False) -> Op:
    """Make `op` available to `autotune` and `dispatch` by name."""
    if op.name in _REGISTRY and not replace:
        raise ValueError(f"op {op.name!r} is already registered; pass replace=True to swap it")
    _REGISTRY[op.name] = op
    return op


def unregister(name: str) -> None:
    """Remove an op (tests register throw-away ops and clean up after themselves)."""
    _REGISTRY.pop(name, None)


def get_op(name: str) -> Op:
    """The registered op called `name`."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; registered ops: {', '.join(sorted(_REGISTRY)) or 'none'}") from None


def registered_ops() -> list[str]:
    """Names of every registered op, sorted."""
    return sorted(_REGISTRY)
