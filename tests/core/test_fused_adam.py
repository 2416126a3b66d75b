"""`FusedAdam` computes what `torch.optim.Adam(fused=True)` computes, keeps its state layout, and never imports
`torch._dynamo` (the reason it exists)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_core.optim.fused_adam import FusedAdam
from rl_core.optim.gradients import flat_grad_views
from rl_core.optim.optimizer_state import load_optimizer_arrays, optimizer_arrays

REPO = Path(__file__).resolve().parents[2]


def _train(make: type, updates: int = 3, steps: int = 25) -> tuple[dict, dict]:
    """Updates with an annealed learning rate (as `ppo_update` sets it), a reload of the state through the
    checkpoint's arrays (a resumed run) before the last one; the weights and the state arrays at the end."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(17, 64), torch.nn.Tanh(), torch.nn.Linear(64, 6))
    grad = flat_grad_views(tuple(model.parameters()))
    optimizer = (FusedAdam(model.parameters(), lr=3e-4, eps=1e-5) if make is FusedAdam
                 else torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, fused=True))
    noise = torch.Generator().manual_seed(1)
    for update in range(updates + 1):
        if update == updates:
            load_optimizer_arrays(optimizer, optimizer_arrays(optimizer))
        optimizer.param_groups[0]["lr"] = 3e-4 * (1 - update / (updates + 1))
        for _ in range(steps):
            grad.copy_(torch.randn(grad.numel(), generator=noise) * 10 ** torch.randint(-3, 3, (1,), generator=noise))
            optimizer.step()
    return {k: v.clone() for k, v in model.state_dict().items()}, optimizer_arrays(optimizer)


def test_the_bits_and_the_state_arrays_of_torch_fused_adam() -> None:
    torch.set_num_threads(1)
    weights, arrays = _train(FusedAdam)
    torch_weights, torch_arrays = _train(torch.optim.Adam)
    for name, value in torch_weights.items():
        assert torch.equal(weights[name], value), name
    assert list(arrays) == list(torch_arrays)  # the names a checkpoint holds, in the same order
    for name, value in torch_arrays.items():
        assert arrays[name].dtype == value.dtype and arrays[name].shape == value.shape, name
        assert (arrays[name] == value).all(), name


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
            "from rl_core.config.control_presets import build_config\n"
            "from rl_core.algos.ppo.in_process import train_in_process\n"
            "train_in_process(build_config('tiny', run_name='no-dynamo', store='memory://no-dynamo', num_ranks=1,\n"
            "                              iterations=2))\n"
            "assert 'torch._dynamo' not in sys.modules, 'a torch.optim optimizer (or something else) imported it'\n"
            "print('clean')\n")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-3000:]
