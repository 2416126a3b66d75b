"""Adam as `torch.optim.Adam(fused=True)` computes it on CPU, without `torch.optim`'s cost: the same kernel, the same
bits. One fast path (`_adam_update`: the two private ops `torch.optim.adam._fused_adam` calls), probed once by
`fused_adam_available()`, and two ways in:

- `FusedAdam`, an optimizer of its own. A process's first `torch.optim` optimizer imports `torch._dynamo` (its
  methods are wrapped to disable the compiler, and the wrapper imports it on first call): a heavy import, in CPU and
  memory, in every process that trains, on a machine whose start-up already keeps every core busy. PPO's learner
  needs none of what `torch.optim` adds (parameter groups, hooks, closures, AMSGrad, capturable steps): one group of
  float32 CPU parameters, with the state `torch.optim.Adam` keeps (`step`, `exp_avg`, `exp_avg_sq` per parameter,
  created zero on the first step) in the layout of its `state_dict()`, so checkpoints do not change.
- `AdamStep`, `optimizer.step()` of an existing `torch.optim.Adam(fused=True)` without its per-call Python (grouping
  the tensors by device, re-reading every parameter's state, the profiler hook) around a short kernel: within one
  update the parameters, their gradient views and their state keep their identity, so the lists are built once.
  Any optimizer this does not cover (not fused, AMSGrad, several groups, a tensor learning rate...) steps through
  `optimizer.step()`.

Where the probe fails (a torch whose private ops changed), `FusedAdam` steps with the same arithmetic in public ops
(`torch.optim.Adam(foreach=False)`'s bits) and `AdamStep` calls `optimizer.step()`. tests/core/test_adam.py checks the
bits against `torch.optim.Adam` step after step, reloads included, on both paths; tests/test_fast_paths.py fails on
the reference machine when the probe does.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

SLOTS = ("step", "exp_avg", "exp_avg_sq")
"""A parameter's state, in the order `torch.optim.Adam` creates it."""


@functools.cache
def fused_adam_available() -> bool:
    """Whether this torch runs the private ops of `torch.optim.Adam(fused=True)`'s CPU step, `torch._foreach_add_`
    (the step counts) and `torch._fused_adam_` (the update), as Adam: checked once by a first step of one parameter."""
    try:
        param, grad, exp_avg, exp_avg_sq = torch.ones(1), torch.ones(1), torch.zeros(1), torch.zeros(1)
        step = torch.zeros(())
        with torch.no_grad():
            torch._foreach_add_([step], 1)
            torch._fused_adam_([param], [grad], [exp_avg], [exp_avg_sq], [], [step], amsgrad=False, lr=0.5, beta1=0.9,
                               beta2=0.999, weight_decay=0.0, eps=0.0, maximize=False, grad_scale=None, found_inf=None)
        # the first step's moments are (1 - beta1) g and (1 - beta2) g^2, bias-corrected to g and g^2: p - lr * g / |g|
        return (step.item() == 1 and torch.allclose(exp_avg, torch.tensor([0.1]))
                and torch.allclose(exp_avg_sq, torch.tensor([0.001])) and torch.allclose(param, torch.tensor([0.5])))
    except (AttributeError, RuntimeError, TypeError):
        return False


def _adam_update(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                 exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], group: dict[str, Any],
                 fused: bool) -> None:
    """Adam's update of every parameter, their step counts already advanced: `torch._fused_adam_` where `fused`, else
    `torch.optim.Adam(foreach=False)`'s arithmetic in public ops, parameter by parameter."""
    beta1, beta2 = group["betas"]
    lr, weight_decay, eps = group["lr"], group["weight_decay"], group["eps"]
    if fused:
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr, beta1=beta1,
                           beta2=beta2, weight_decay=weight_decay, eps=eps, maximize=False, grad_scale=None,
                           found_inf=None)
        return
    for param, grad, exp_avg, exp_avg_sq, step_t in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = step_t.item()
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-(lr / (1 - beta1**step)))


class FusedAdam:
    """Adam over `params` (float32, CPU) on the fast path where probed; `param_groups[0]["lr"]` may change between
    steps."""

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
        self._fused = fused_adam_available()
        # Every parameter's step count is a 0-d view of this one tensor, so a step adds 1 to them all in one op:
        # one `add_` pays torch's per-call overhead once, where `torch._foreach_add_` over the 13 scalars of PPO's
        # actor-critic pays a multiple of it, a visible share of a small minibatch step. The same float32
        # additions, so the same counts and bits.
        self._counts: torch.Tensor | None = None
        self._slot_lists: tuple[list[torch.Tensor], ...] = ()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step from the parameters' current `.grad`."""
        if self._counts is None:
            self._start_state([{"step": torch.zeros((), dtype=torch.float32), "exp_avg": torch.zeros_like(p),
                                "exp_avg_sq": torch.zeros_like(p)} for p in self.params])
        exp_avgs, exp_avg_sqs, steps = self._slot_lists
        self._counts.add_(1)
        _adam_update(self.params, [p.grad for p in self.params], exp_avgs, exp_avg_sqs, steps, self.param_groups[0],
                     self._fused)

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
        params, grads, exp_avgs, exp_avg_sqs, steps = self._lists
        with torch.no_grad():
            torch._foreach_add_(steps, 1)
            _adam_update(params, grads, exp_avgs, exp_avg_sqs, steps, self._group, fused=True)


def _direct_step_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` is exactly `_fused_adam`'s two calls on one group of float32 CPU tensors, and this
    torch runs them (`fused_adam_available`)."""
    if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1 or not fused_adam_available():
        return False
    group = optimizer.param_groups[0]
    plain = (group.get("fused") and not group.get("amsgrad") and not group.get("maximize")
             and not group.get("capturable") and not group.get("differentiable")
             and not group.get("decoupled_weight_decay") and not isinstance(group["lr"], torch.Tensor)
             and not any(isinstance(b, torch.Tensor) for b in group["betas"]))
    return bool(plain) and all(p.is_cpu and p.dtype is torch.float32 for p in group["params"])


def _state_ready(optimizer: torch.optim.Optimizer) -> bool:
    """Every parameter has a gradient and the state a step left (step, exp_avg, exp_avg_sq)."""
    return all(p.grad is not None and set(SLOTS) <= optimizer.state[p].keys()
               for p in optimizer.param_groups[0]["params"])


def _fused_lists(optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], ...]:
    params = list(optimizer.param_groups[0]["params"])
    state = [optimizer.state[p] for p in params]
    return (params, [p.grad for p in params], [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state],
            [s["step"] for s in state])
