"""An optimizer's state as flat named arrays (`optim.<param index>.<slot>`), the form a checkpoint holds."""
from __future__ import annotations

import torch

from rl_core.data.tensorfile import Tensors
from rl_core.optim.adam import FusedAdam

PREFIX = "optim."


def optimizer_arrays(optimizer: FusedAdam | torch.optim.Optimizer | None) -> Tensors:
    """Every per-parameter slot (Adam: step, exp_avg, exp_avg_sq) as `optim.<index>.<slot>`; none before the
    optimizer exists or has stepped."""
    slots = optimizer.state_dict()["state"] if optimizer is not None else {}
    return {f"{PREFIX}{idx}.{key}": value.detach().numpy().copy()
            for idx, values in slots.items() for key, value in values.items()}


def load_optimizer_arrays(optimizer: FusedAdam | torch.optim.Optimizer, state: Tensors) -> None:
    """Restore the slots `optimizer_arrays` wrote (other keys of `state` are ignored)."""
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if key.startswith(PREFIX):
            _, idx, name = key.split(".", 2)
            slots.setdefault(int(idx), {})[name] = torch.from_numpy(value.copy())
    optim_state = optimizer.state_dict()
    optim_state["state"] = slots
    optimizer.load_state_dict(optim_state)
