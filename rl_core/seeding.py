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
