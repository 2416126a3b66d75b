"""Counter-based seeds: every random stream is a pure function of (run seed, counters).

Nothing random keeps hidden state across steps, so a resumed run draws exactly what an
uninterrupted one would, and a checkpoint needs the seed and counters only.
"""
from __future__ import annotations

import numpy as np
import torch


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integer parts, well mixed by numpy's SeedSequence."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def torch_generator(*parts: int) -> torch.Generator:
    """A fresh torch.Generator seeded from `parts`."""
    return torch.Generator().manual_seed(derive_seed(*parts))


def action_noise(seed: int, iteration: int, first_env: int, num_envs: int, steps: int, action_dim: int) -> torch.Tensor:
    """Standard-normal action noise (steps, num_envs, action_dim) of envs [first_env, first_env + num_envs) in
    `iteration`. Each env draws from its own generator of (seed, iteration, env index), so the noise an env gets
    does not depend on how the run's envs are split over workers: a run re-split over more or fewer workers
    draws what it would have drawn unsplit."""
    per_env = [torch.randn(steps, action_dim, generator=torch_generator(seed, iteration, first_env + e))
               for e in range(num_envs)]
    return torch.stack(per_env, dim=1)
