"""Adam's step without `torch.optim`'s per-call Python: the fused kernel `torch.optim.Adam(fused=True)` runs, called
with the lists it would build.

A PPO update takes hundreds of minibatch steps on a small model, and `Adam.step()` spends most of each call in
Python (grouping the tensors by device, re-reading every parameter's state, the profiler hook) around a short
kernel. Within one update the parameters, their gradient views and their state do not change identity, so the
lists are built once and each step is the two calls `torch.optim.adam._fused_adam` makes: the step counters, then
the fused update. Same kernel, same arguments: the same bits as `optimizer.step()` (tests/core/test_adam_step.py).
Any optimizer this does not cover (not fused, AMSGrad, several groups, a tensor learning rate...) steps through
`optimizer.step()`.
"""
from __future__ import annotations

import torch


class AdamStep:
    """`optimizer.step()` for one update, over gradients that stay the same tensors (`flat_grad_views`)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self._group = optimizer.param_groups[0]
        self._direct = _direct_step_applies(optimizer)
        self._lists: tuple[list[torch.Tensor], ...] | None = None

    def __call__(self) -> None:
        if self._lists is None:  # a fresh optimizer creates its state in its first step
            self._optimizer.step()
            if self._direct and _state_ready(self._optimizer):
                self._lists = _fused_lists(self._optimizer)
            return
        group = self._group
        params, grads, exp_avgs, exp_avg_sqs, steps = self._lists
        beta1, beta2 = group["betas"]
        with torch.no_grad():
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                               beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                               maximize=False, grad_scale=None, found_inf=None)


def _direct_step_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` is exactly `_fused_adam`'s two calls on one group of float32 CPU tensors."""
    if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1 \
            or not hasattr(torch, "_fused_adam_"):
        return False
    group = optimizer.param_groups[0]
    plain = (group.get("fused") and not group.get("amsgrad") and not group.get("maximize")
             and not group.get("capturable") and not group.get("differentiable")
             and not group.get("decoupled_weight_decay") and not isinstance(group["lr"], torch.Tensor)
             and not any(isinstance(b, torch.Tensor) for b in group["betas"]))
    return bool(plain) and all(p.is_cpu and p.dtype is torch.float32 for p in group["params"])


def _state_ready(optimizer: torch.optim.Optimizer) -> bool:
    """Every parameter has a gradient and the state a step left (step, exp_avg, exp_avg_sq)."""
    return all(p.grad is not None and {"step", "exp_avg", "exp_avg_sq"} <= optimizer.state[p].keys()
               for p in optimizer.param_groups[0]["params"])


def _fused_lists(optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], ...]:
    params = list(optimizer.param_groups[0]["params"])
    state = [optimizer.state[p] for p in params]
    return (params, [p.grad for p in params], [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state],
            [s["step"] for s in state])
