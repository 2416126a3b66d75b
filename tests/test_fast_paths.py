"""The fast paths that rest on what we do not control: private torch ops (the fused Adam step, oneDNN's linear),
MuJoCo's pybind11 wrapper layout (the native env step) and a C++ compiler (the fixed-order attention kernel). Each is
probed once at start and falls back, elsewhere, to a slower or less exact path; on the reference machine a fallback
is a failure, not a warning or a skip.

The reference machine is the one CI runs on: .ci/run sets GYMFLOW_REQUIRE_FAST_PATHS=1 (set it by hand to check a
machine the same way). Without it an unavailable fast path skips here, with the reason.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from gymflow_kernels.causal_attention import causal_attention_problem
from rl_core.envs.native_step import native_step_problem
from rl_core.optim.adam import fused_adam_available
from rl_core.policies.onednn_linear import onednn_available

REQUIRED = os.environ.get("GYMFLOW_REQUIRE_FAST_PATHS", "") not in ("", "0")


def _onednn() -> str | None:
    return None if onednn_available() else (
        f"torch {torch.__version__} does not run torch.ops.mkldnn._linear_pointwise on a plain and a packed weight "
        "(rl_core/policies/onednn_linear.py); LM policies' layers run F.linear, whose rows' bits depend on the batch")


def _fixed_order_attention() -> str | None:
    problem = causal_attention_problem()
    return None if problem is None else (
        f"{problem} (kernels/gymflow_kernels/causal_attention.py); LM policies attend through float64 "
        "scaled_dot_product_attention, where decoding and the full forward now and then differ in the last bit")


def _fused_adam() -> str | None:
    return None if fused_adam_available() else (
        f"torch {torch.__version__} does not run torch._foreach_add_ and torch._fused_adam_ as Adam "
        "(rl_core/optim/adam.py); Adam steps in public ops, with other bits than torch.optim.Adam(fused=True)")


PROBES: dict[str, Callable[[], str | None]] = {
    "native-env-step": native_step_problem,  # rl_core/envs/native_step.py
    "onednn-linear": _onednn,
    "fixed-order-attention": _fixed_order_attention,
    "fused-adam": _fused_adam,
}


@pytest.mark.parametrize("probe", PROBES.values(), ids=PROBES.keys())
def test_the_fast_path_is_available(probe: Callable[[], str | None]) -> None:
    problem = probe()
    if problem is None:
        return
    if REQUIRED:
        pytest.fail(f"fast path unavailable on the reference machine (GYMFLOW_REQUIRE_FAST_PATHS is set): {problem}. "
                    f"Fix the machine (compiler, torch {torch.__version__} as pyproject pins it) or the probe's module "
                    "for this torch/MuJoCo; unset GYMFLOW_REQUIRE_FAST_PATHS only on a machine that is not the "
                    "reference")
    pytest.skip(f"fast path unavailable here, its fallback runs: {problem}")
