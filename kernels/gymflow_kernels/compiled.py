"""`torch.compile` (inductor) candidates, opt-in because compiling is slow on a small CPU.

On a 2-core machine a cold compile can take minutes, and a warm one (an inductor cache hit) still pays a setup in
every process. So these candidates sit in the opt-in group `COMPILE`: tried only when asked for, and the tuner weighs
the first call's setup against the op's expected calls per run before letting one win. Inductor's cache goes to
`<cache dir>/kernels/inductor` (unless TORCHINDUCTOR_CACHE_DIR is set), next to the C++ builds.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from gymflow_kernels.cache import cache_dir
from gymflow_kernels.registry import COMPILE, CandidateUnavailable, Kernel, candidate


def compiled(fn: Kernel, *, dynamic: bool = False) -> Kernel:
    """A candidate running `torch.compile(fn)`; compiled on first call, so merely registering it costs nothing.

    Static by default: every new shape or scalar argument compiles again. With automatic dynamic shapes, torch 2.13
    reused a ppo_loss graph compiled for clip_coef=0.1 on a call with clip_coef=0.2 and returned the wrong loss (the
    verifier caught it); specializing is slower to warm up but computes what the code says.
    """
    state: dict[str, Any] = {}

    def run(*args: Any) -> Any:
        if "fn" not in state:
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "kernels" / "inductor"))
            state["fn"] = torch.compile(fn, backend="inductor", dynamic=dynamic)
        try:
            return state["fn"](*args)
        except Exception as exc:
            from torch._dynamo.exc import BackendCompilerFailed  # noqa: PLC0415 - dynamo is only loaded once used

            if isinstance(exc, BackendCompilerFailed):  # no working compiler here: unavailable, not wrong
                raise CandidateUnavailable(f"inductor could not compile {fn.__name__}: {exc}") from exc
            raise

    run.__name__ = run.__qualname__ = f"compiled_{fn.__name__}"
    run.__doc__ = f"torch.compile(inductor) of {fn.__name__}."
    source = f"torch.compile(dynamic={dynamic}) of:\n{inspect.getsource(fn)}{getattr(fn, '__kernel_source__', '')}"
    return candidate(opt_in=COMPILE, per_process_setup=True, source=source)(run)
