"""`AdamStep` is `optimizer.step()` without torch.optim's per-call Python: the same bits, step after step."""
from __future__ import annotations

import pytest
import torch

from rl_core.optim.adam_step import AdamStep
from rl_core.optim.gradients import flat_grad_views
from rl_core.optim.instability import NonFiniteGuard


def _model_and_adam(**adam: object) -> tuple[torch.nn.Module, torch.Tensor, torch.optim.Adam]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(17, 64), torch.nn.Tanh(), torch.nn.Linear(64, 6))
    grad = flat_grad_views(tuple(model.parameters()))
    return model, grad, torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, **adam)


def _train(adam: dict, step_with: str, updates: int = 3, steps: int = 25) -> dict[str, torch.Tensor]:
    """Several updates (a new stepper each, the learning rate annealed between them, as `ppo_update` does), then a
    reload of the optimizer's state (a resumed run) and one more; the weights and Adam's state at the end."""
    model, grad, optimizer = _model_and_adam(**adam)
    noise = torch.Generator().manual_seed(1)
    for update in range(updates + 1):
        if update == updates:
            optimizer.load_state_dict(optimizer.state_dict())
        optimizer.param_groups[0]["lr"] = 3e-4 * (1 - update / (updates + 1))
        step = AdamStep(optimizer) if step_with == "AdamStep" else optimizer.step
        for _ in range(steps):
            grad.copy_(torch.randn(grad.numel(), generator=noise) * 10 ** torch.randint(-3, 3, (1,), generator=noise))
            step()
    state = {f"weight.{k}": v.clone() for k, v in model.state_dict().items()}
    for i, slots in optimizer.state_dict()["state"].items():
        state.update({f"adam.{i}.{k}": v.clone() for k, v in slots.items()})
    return state


@pytest.mark.parametrize("adam", [{"fused": True}, {"fused": True, "weight_decay": 0.01}, {"foreach": True},
                                  {"fused": True, "amsgrad": True}],
                         ids=["fused", "fused-weight-decay", "foreach", "amsgrad"])
def test_adam_step_gives_the_bits_of_optimizer_step(adam: dict) -> None:
    torch.set_num_threads(1)
    expected, found = _train(adam, "optimizer.step"), _train(adam, "AdamStep")
    assert expected.keys() == found.keys()
    for name, value in expected.items():
        assert torch.equal(found[name], value), name


@pytest.mark.parametrize("adam, optimizer_steps", [({"fused": True}, 1), ({"foreach": True}, 4),
                                                    ({"fused": True, "amsgrad": True}, 4)],
                         ids=["fused", "foreach", "amsgrad"])
def test_adam_step_skips_optimizer_step_only_where_it_reproduces_it(adam: dict, optimizer_steps: int) -> None:
    """After the first call (which creates a fresh optimizer's state), only plain fused Adam is stepped directly."""
    _, grad, optimizer = _model_and_adam(**adam)
    calls: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: calls.append(1))
    step = AdamStep(optimizer)
    grad.fill_(0.5)
    for _ in range(4):
        step()
    assert len(calls) == optimizer_steps


def test_the_guard_trusts_a_finite_norm_and_checks_the_elements_behind_a_non_finite_one() -> None:
    guard = NonFiniteGuard("PPO", limit=3)
    huge = torch.full((8,), 3e19)  # finite, but its squares overflow float32: the norm is inf
    norm = torch.linalg.vector_norm(huge)
    assert not torch.isfinite(norm)
    assert guard.admit(huge, "a huge but finite gradient", norm)
    poisoned = torch.ones(8)
    poisoned[3] = float("nan")
    assert not guard.admit(poisoned, "a NaN element", torch.linalg.vector_norm(poisoned))
    assert guard.admit(torch.ones(8), "a finite gradient", torch.linalg.vector_norm(torch.ones(8)))
    assert guard.skipped == 1
