"""The Adam fast path (rl_core/optim/adam.py). `FusedAdam` computes what `torch.optim.Adam(fused=True)` computes, keeps
its state layout, and never imports `torch._dynamo` (the reason it exists); `AdamStep` is `optimizer.step()` without
torch.optim's per-call Python. The same bits, step after step, and where the probe of torch's private ops fails, the
public-op fallback gives `torch.optim.Adam(foreach=False)`'s."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_core.optim import adam
from rl_core.optim.adam import AdamStep, FusedAdam
from rl_core.optim.gradients import flat_grad_views
from rl_core.optim.instability import NonFiniteGuard
from rl_core.optim.optimizer_state import load_optimizer_arrays, optimizer_arrays

REPO = Path(__file__).resolve().parents[2]


def _train(make: type, updates: int = 3, steps: int = 25, **torch_adam: object) -> tuple[dict, dict]:
    """Updates with an annealed learning rate (as `ppo_update` sets it), a reload of the state through the
    checkpoint's arrays (a resumed run) before the last one; the weights and the state arrays at the end."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(17, 64), torch.nn.Tanh(), torch.nn.Linear(64, 6))
    grad = flat_grad_views(tuple(model.parameters()))
    optimizer = (FusedAdam(model.parameters(), lr=3e-4, eps=1e-5) if make is FusedAdam
                 else torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, **(torch_adam or {"fused": True})))
    noise = torch.Generator().manual_seed(1)
    for update in range(updates + 1):
        if update == updates:
            load_optimizer_arrays(optimizer, optimizer_arrays(optimizer))
        optimizer.param_groups[0]["lr"] = 3e-4 * (1 - update / (updates + 1))
        for _ in range(steps):
            grad.copy_(torch.randn(grad.numel(), generator=noise) * 10 ** torch.randint(-3, 3, (1,), generator=noise))
            optimizer.step()
    return {k: v.clone() for k, v in model.state_dict().items()}, optimizer_arrays(optimizer)


def _assert_same(found: tuple[dict, dict], expected: tuple[dict, dict]) -> None:
    (weights, arrays), (torch_weights, torch_arrays) = found, expected
    for name, value in torch_weights.items():
        assert torch.equal(weights[name], value), name
    assert list(arrays) == list(torch_arrays)  # the names a checkpoint holds, in the same order
    for name, value in torch_arrays.items():
        assert arrays[name].dtype == value.dtype and arrays[name].shape == value.shape, name
        assert (arrays[name] == value).all(), name


def test_the_bits_and_the_state_arrays_of_torch_fused_adam() -> None:
    if not adam.fused_adam_available():
        pytest.skip("this torch fails the fused Adam probe (tests/test_fast_paths.py fails for it on the reference "
                    "machine); the fallback's bits are checked below")
    torch.set_num_threads(1)
    _assert_same(_train(FusedAdam), _train(torch.optim.Adam))


def test_the_probe_fails_where_torch_lacks_the_private_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    assert adam.fused_adam_available.__wrapped__() == hasattr(torch, "_fused_adam_")
    monkeypatch.delattr(torch, "_fused_adam_")
    assert not adam.fused_adam_available.__wrapped__()  # the cached answer's function, run again


def test_without_the_private_ops_the_bits_of_torch_single_tensor_adam(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe fails, FusedAdam steps in public ops: `torch.optim.Adam(foreach=False)`'s arithmetic."""
    monkeypatch.setattr(adam, "fused_adam_available", lambda: False)
    torch.set_num_threads(1)
    _assert_same(_train(FusedAdam), _train(torch.optim.Adam, foreach=False))


def test_no_state_before_the_first_step_and_bad_state_is_refused() -> None:
    layer = torch.nn.Linear(3, 2)
    optimizer = FusedAdam(layer.parameters(), lr=1e-3)
    assert optimizer_arrays(optimizer) == {}
    load_optimizer_arrays(optimizer, {})  # version 0: nothing to restore
    with pytest.raises(ValueError, match="shape"):
        load_optimizer_arrays(optimizer, {f"optim.{i}.exp_avg": torch.zeros(7).numpy() for i in range(2)})
    with pytest.raises(ValueError, match="parameters"):
        load_optimizer_arrays(optimizer, {"optim.0.exp_avg": torch.zeros(2, 3).numpy()})
    with pytest.raises(ValueError, match="expected all of"):  # a slot missing: no step count to continue from
        load_optimizer_arrays(optimizer, {f"optim.{i}.exp_avg": p.detach().numpy()
                                          for i, p in enumerate(layer.parameters())})
    with pytest.raises(ValueError, match="no parameters"):
        FusedAdam([], lr=1e-3)
    with pytest.raises(TypeError, match="float32 CPU"):
        FusedAdam(torch.nn.Linear(3, 2).double().parameters(), lr=1e-3)


def test_a_ppo_update_never_imports_torch_dynamo() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    code = ("import sys\n"
            "from rl_core.config.presets import build_control_config\n"
            "from rl_core.algos.ppo.in_process import train_in_process\n"
            "train_in_process(build_control_config('tiny', run_name='no-dynamo', store='memory://no-dynamo', num_ranks=1,\n"
            "                              iterations=2))\n"
            "assert 'torch._dynamo' not in sys.modules, 'a torch.optim optimizer (or something else) imported it'\n"
            "print('clean')\n")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-3000:]


def _model_and_adam(**options: object) -> tuple[torch.nn.Module, torch.Tensor, torch.optim.Adam]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(17, 64), torch.nn.Tanh(), torch.nn.Linear(64, 6))
    grad = flat_grad_views(tuple(model.parameters()))
    return model, grad, torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, **options)


def _train_step(options: dict, step_with: str, updates: int = 3, steps: int = 25) -> dict[str, torch.Tensor]:
    """Several updates (a new stepper each, the learning rate annealed between them, as `ppo_update` does), then a
    reload of the optimizer's state (a resumed run) and one more; the weights and Adam's state at the end."""
    model, grad, optimizer = _model_and_adam(**options)
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


@pytest.mark.parametrize("options", [{"fused": True}, {"fused": True, "weight_decay": 0.01}, {"foreach": True},
                                  {"fused": True, "amsgrad": True}],
                         ids=["fused", "fused-weight-decay", "foreach", "amsgrad"])
def test_adam_step_gives_the_bits_of_optimizer_step(options: dict) -> None:
    torch.set_num_threads(1)
    expected, found = _train_step(options, "optimizer.step"), _train_step(options, "AdamStep")
    assert expected.keys() == found.keys()
    for name, value in expected.items():
        assert torch.equal(found[name], value), name


@pytest.mark.parametrize("options, optimizer_steps", [({"fused": True}, 1), ({"foreach": True}, 4),
                                                    ({"fused": True, "amsgrad": True}, 4)],
                         ids=["fused", "foreach", "amsgrad"])
def test_adam_step_skips_optimizer_step_only_where_it_reproduces_it(options: dict, optimizer_steps: int) -> None:
    """After the first call (which creates a fresh optimizer's state), only plain fused Adam is stepped directly."""
    if not adam.fused_adam_available():
        pytest.skip("this torch fails the fused Adam probe: every step goes through optimizer.step()")
    _, grad, optimizer = _model_and_adam(**options)
    calls: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: calls.append(1))
    step = AdamStep(optimizer)
    grad.fill_(0.5)
    for _ in range(4):
        step()
    assert len(calls) == optimizer_steps


def test_adam_step_without_the_private_ops_is_optimizer_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adam, "fused_adam_available", lambda: False)
    _, grad, optimizer = _model_and_adam(fused=True)
    calls: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: calls.append(1))
    step = AdamStep(optimizer)
    grad.fill_(0.5)
    for _ in range(4):
        step()
    assert len(calls) == 4


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
