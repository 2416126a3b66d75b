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
        # Every parameter's step count is a 0-d view of this one tensor, so a step adds 1 to them all in one op:
        # `torch._foreach_add_` over the 13 scalars of PPO's actor-critic took 21 us a call here, `add_` 2.4 us (of
        # a ~0.5 ms minibatch step). The same float32 additions, so the same counts and bits.
        self._counts: torch.Tensor | None = None
        self._slot_lists: tuple[list[torch.Tensor], ...] = ()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step from the parameters' current `.grad`."""
        if self._counts is None:
            self._start_state([{"step": torch.zeros((), dtype=torch.float32), "exp_avg": torch.zeros_like(p),
                                "exp_avg_sq": torch.zeros_like(p)} for p in self.params])
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        exp_avgs, exp_avg_sqs, steps = self._slot_lists
        self._counts.add_(1)
        torch._fused_adam_(self.params, [p.grad for p in self.params], exp_avgs, exp_avg_sqs, [], steps,
                           amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
                           weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, grad_scale=None,
                           found_inf=None)

    def _start_state(self, slots: list[dict[str, torch.Tensor]]) -> None:
        """Take `slots` (every parameter's, each with all of SLOTS) as the state: step counts packed into one tensor
        of which each parameter's "step" is a view, and the lists `torch._fused_adam_` takes, built once."""
        self._counts = torch.stack([s["step"] for s in slots])
        for i, (own, given) in enumerate(zip(self.state, slots)):
            own.clear()
            own.update(step=self._counts[i], exp_avg=given["exp_avg"], exp_avg_sq=given["exp_avg_sq"])
        self._slot_lists = ([s["exp_avg"] for s in self.state], [s["exp_avg_sq"] for s in self.state],
                            [s["step"] for s in self.state])

    def state_dict(self) -> dict[str, Any]:
        """`{"state": {index: {slot: tensor}}}` as `torch.optim.Adam.state_dict()` holds it (no entry before the
        first step); the tensors are the live state, as torch's are."""
        return {"state": {i: dict(slots) for i, slots in enumerate(self.state) if slots}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` gave (copies): every parameter's three slots, or none (a fresh start)."""
        loaded = state_dict["state"]
        if loaded and set(loaded) != set(range(len(self.params))):
            raise ValueError(f"optimizer state for parameters {sorted(loaded)}, this optimizer has "
                             f"{len(self.params)}")
        slots: list[dict[str, torch.Tensor]] = []
        for i, p in enumerate(self.params):
            given = loaded.get(i, {})
            for name, value in given.items():
                if name not in SLOTS:
                    raise ValueError(f"unknown Adam state {name!r} for parameter {i}")
                shape = torch.Size(()) if name == "step" else p.shape
                if value.shape != shape:
                    raise ValueError(f"Adam state {name!r} of parameter {i} has shape {tuple(value.shape)}, "
                                     f"expected {tuple(shape)}")
            if loaded and set(given) != set(SLOTS):
                raise ValueError(f"Adam state of parameter {i} has {sorted(given)}, expected all of {list(SLOTS)}")
            slots.append({name: value.detach().to(dtype=torch.float32 if name == "step" else p.dtype).clone()
                          for name, value in given.items()})
        for own in self.state:
            own.clear()
        self._counts, self._slot_lists = None, ()
        if loaded:
            self._start_state(slots)
