"""C++ candidates: plain C entry points built by `load_inline` and called through ctypes.

Why this shape: with no torch or pybind11 headers a build takes about a second instead of about a minute, so a C++
candidate can be built on demand the first time it is tried. Libraries land in `<cache dir>/kernels/cpp/<hash>`
(hash of source, torch version and CPU model and flags), so later processes only load them; the CPU is part of the
hash because libraries are built with -march=native (AVX2/FMA where present), which another CPU may not run. Any
reason a library cannot be had (no compiler, no ninja, failed build) is reported as `CandidateUnavailable`, never as
a wrong answer.

The sources are files in `csrc/` (packaged with the wheel): one `.cpp` per kernel, and `.h` files for code two
kernels share (`mlp_layers.h`, `two_halves.h`). `cpp_source` turns a kernel's file into the one text `load_inline`
compiles: each `#include "<file>"` line replaced by that csrc file's text, once per file. A file's opening `//`
comment lines and a header's `#pragma once` are left out of that text; the compiler would ignore them anyway, and
so the text is what the kernels' Python strings held before the files existed: the same build hash (no rebuild),
the same source hash for tuned winners (no re-tune), the same bits.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from gymflow_kernels.cache import cache_dir, cpu_signature
from gymflow_kernels.registry import CandidateUnavailable

CSRC = Path(__file__).parent / "csrc"
"""The kernels' C++ sources."""

_LOCAL_INCLUDE = re.compile(r'#include "([^"]+)"')


def cpp_source(filename: str) -> str:
    """The text `load_inline` compiles for csrc/`filename`: its `#include "..."` lines replaced by those csrc files'
    text (each file once), opening `//` comment lines and `#pragma once` left out (see the module's docstring)."""
    return _expand(filename, set())


def _expand(filename: str, included: set[str]) -> str:
    if filename in included:
        return ""
    included.add(filename)
    lines = (CSRC / filename).read_text(encoding="utf-8").splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("//"):
        start += 1
    if start < len(lines) and lines[start].strip() == "#pragma once":
        start += 1
    text = []
    for line in lines[start:]:
        match = _LOCAL_INCLUDE.match(line)
        text.append(_expand(match.group(1), included) if match else line)
    return "".join(text)


def load_function(name: str, source: str, symbol: str, argtypes: tuple) -> Callable[..., None]:
    """Entry point `symbol` (C linkage, returns void) of the library built from `source`, built on first use."""
    library = _load(name, source)
    if isinstance(library, str):
        raise CandidateUnavailable(library)
    function = getattr(library, symbol)
    if function.argtypes is None:
        function.argtypes, function.restype = list(argtypes), None
    return function


@functools.cache
def _load(name: str, source: str) -> ctypes.CDLL | str:
    """Library or the reason it is unavailable; decided once per process (a failed build is not retried per call)."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"C++ compiler {compiler!r} not found; install g++ (or set CXX) to enable this candidate"
    if not cpp_extension.is_ninja_available():
        return "ninja not found; `pip install ninja` into the venv to enable this candidate"
    digest = hashlib.sha256((source + torch.__version__ + cpu_signature()).encode()).hexdigest()[:12]
    build_dir = cache_dir() / "kernels" / "cpp" / digest
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        path = cpp_extension.load_inline(
            name=f"gymflow_{name}_{digest}", cpp_sources=source, build_directory=str(build_dir),
            extra_cflags=["-O3", "-march=native"], no_implicit_headers=True, is_python_module=False,
        )
        return ctypes.CDLL(path)
    except Exception as exc:  # noqa: BLE001 - any build or load failure just makes the candidate unavailable
        return f"building the C++ candidate {name!r} in {build_dir} failed: {type(exc).__name__}: {exc}"


def float32_cpu(op: str, *tensors: Tensor) -> list[Tensor]:
    """`tensors`, made contiguous where they are not, checked to be float32 on CPU (what the C loops read).

    A C loop reading another dtype would read garbage, not raise, so anything else is refused with the reason.
    Cheap on purpose (no detach, no copies of contiguous tensors): it runs on every call of a microsecond kernel.
    """
    if not all(x.dtype is torch.float32 and x.is_cpu for x in tensors):
        found = {(x.dtype, x.device.type) for x in tensors}
        raise TypeError(
            f"this {op} candidate reads float32 CPU memory directly, found "
            f"{', '.join(sorted(f'{t} on {d}' for t, d in found))}; kernels.dispatch only routes calls it was tuned for"
        )
    return [x if x.is_contiguous() else x.contiguous() for x in tensors]


PTR, I64, F64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
"""ctypes argument types of the entry points: pointers are passed as `tensor.data_ptr()`."""


_CORES = contextvars.ContextVar("gymflow_kernel_cores", default=1)


def parallel_cores() -> int:
    """How many cores a kernel called from this thread may use: 1 unless the caller is inside `using_cores`."""
    return _CORES.get()


@contextlib.contextmanager
def using_cores(cores: int) -> Iterator[None]:
    """Let kernels called from this thread (and this context) use up to `cores` cores.

    Why the caller decides: only it knows whether a core is idle meanwhile (a PPO update on one rank while the env
    workers wait) or busy (another rank, a collection running beside the update), and a helper thread on a busy core
    only adds context switches. Kernels that use it (`ppo_grad`'s C++ candidate) compute the same bits at any count.
    """
    if cores < 1:
        raise ValueError(f"using_cores needs at least 1 core, got {cores}")
    token = _CORES.set(cores)
    try:
        yield
    finally:
        _CORES.reset(token)
