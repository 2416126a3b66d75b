"""Population-based training's decision after a generation (Jaderberg et al., 2017: truncation selection, then
perturbation): the members in the bottom quantile of the generation's scores exploit a member drawn from the top
quantile (they continue from its weights) and explore (each mutable field times a factor drawn from the given ones,
kept in its bounds).

The decision is a pure function of the generation, the scores, the members' values and the settings: its draws come
from a generator seeded by (the sweep's seed, the generation), so a sweep killed and run again decides the same, on
any machine (PCG64 is platform-independent). Ties rank by member name; a score that is not finite ranks last.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_core.seeding import derive_seed


@dataclass(frozen=True)
class Exploit:
    """Member `member` continues from `source`'s weights with the mutable fields' `values`."""

    member: str
    source: str
    values: dict[str, Any]


def ranked(scores: dict[str, float]) -> list[str]:
    """Members best first; ties by name, non-finite scores last."""
    return sorted(scores, key=lambda m: (-scores[m] if math.isfinite(scores[m]) else math.inf, m))


def decide(seed: int, generation: int, scores: dict[str, float], values: dict[str, dict[str, Any]],
           quantile: float, bounds: dict[str, tuple[float, float]], factors: tuple[float, ...]) -> list[Exploit]:
    """The exploits after `generation`: one per member of the bottom `quantile` of `scores`, in name order.

    `values` holds every member's mutable fields; an integer field stays an integer (rounded, then kept in bounds).
    """
    order = ranked(scores)
    cut = int(len(order) * quantile)
    if cut < 1:
        raise ValueError(f"a population of {len(order)} has no member in its {quantile:g} quantile")
    top, bottom = order[:cut], sorted(order[-cut:])
    rng = np.random.default_rng(derive_seed(seed, generation))
    out = []
    for member in bottom:
        source = top[int(rng.integers(len(top)))]
        explored = {}
        for field in sorted(bounds):
            low, high = bounds[field]
            value = values[source][field] * factors[int(rng.integers(len(factors)))]
            if isinstance(values[source][field], int):
                explored[field] = int(min(max(round(value), math.ceil(low)), math.floor(high)))
            else:
                explored[field] = float(min(max(value, low), high))
        out.append(Exploit(member, source, explored))
    return out
