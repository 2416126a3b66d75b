"""Adam as `torch.optim.Adam(fused=True)` computes it, without `torch.optim`: the same kernel, the same bits.

Why: a process's first `torch.optim` optimizer imports `torch._dynamo` (its methods are wrapped to disable the
compiler, and the wrapper imports it on first call): ~2 s of CPU and ~70 MB in every process that trains. In a flow
run that landed in the first update (a quick HalfCheetah iteration took 1.43 s instead of 0.44 s), on a machine whose
start-up already keeps every core busy. PPO's learner needs none of what `torch.optim` adds (parameter groups,
hooks, closures, AMSGrad, capturable steps): one group of float32 CPU parameters, stepped by the two calls
`torch.optim.adam._fused_adam` makes, with the state `torch.optim.Adam` keeps (`step`, `exp_avg`, `exp_avg_sq` per
parameter, created zero on the first step) in the layout of its `state_dict()`, so checkpoints do not change
(tests/core/test_fused_adam.py checks the bits against `torch.optim.Adam` step after step, reloads included).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

SLOTS = ("step", "exp_avg", "exp_avg_sq")
"""A parameter's state, in the order `torch.optim.Adam` creates it."""


class FusedAdam:
    """Adam over `params` (float32, CPU) with `torch._fused_adam_`; `param_groups[0]["lr"]` may change between steps."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, eps: float = 1e-8,
                 betas: tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.0) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("FusedAdam got no parameters to optimize")
        for p in self.params:
            if not (p.is_cpu and p.dtype is torch.float32):
                raise TypeError(f"FusedAdam steps float32 CPU parameters, found {p.dtype} on {p.device}")
        self.param_groups: list[dict[str, Any]] = [
            {"params": self.params, "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}]
        self.state: list[dict[str, torch.Tensor]] = [{} for _ in self.params]

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step from the parameters' current `.grad`."""
        if not self.state[0]:
            for p, slots in zip(self.params, self.state):
                slots.update(step=torch.zeros((), dtype=torch.float32), exp_avg=torch.zeros_like(p),
                             exp_avg_sq=torch.zeros_like(p))
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        steps = [s["step"] for s in self.state]
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(self.params, [p.grad for p in self.params], [s["exp_avg"] for s in self.state],
                           [s["exp_avg_sq"] for s in self.state], [], steps, amsgrad=False, lr=group["lr"],
                           beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                           maximize=False, grad_scale=None, found_inf=None)

    def state_dict(self) -> dict[str, Any]:
        """`{"state": {index: {slot: tensor}}}` as `torch.optim.Adam.state_dict()` holds it (no entry before the
        first step); the tensors are the live state, as torch's are."""
        return {"state": {i: dict(slots) for i, slots in enumerate(self.state) if slots}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` gave (copies); parameters it has no entry for start fresh."""
        loaded = state_dict["state"]
        if loaded and set(loaded) != set(range(len(self.params))):
            raise ValueError(f"optimizer state for parameters {sorted(loaded)}, this optimizer has "
                             f"{len(self.params)}")
        for i, (p, slots) in enumerate(zip(self.params, self.state)):
            slots.clear()
            for name, value in loaded.get(i, {}).items():
                if name not in SLOTS:
                    raise ValueError(f"unknown Adam state {name!r} for parameter {i}")
                shape = torch.Size(()) if name == "step" else p.shape
                if value.shape != shape:
                    raise ValueError(f"Adam state {name!r} of parameter {i} has shape {tuple(value.shape)}, "
                                     f"expected {tuple(shape)}")
                slots[name] = value.detach().to(dtype=torch.float32 if name == "step" else p.dtype).clone()
