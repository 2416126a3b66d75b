"""Dynamics randomization ranges, as configuration: the envs (`rl_core.envs.randomization`) draw from them."""
from __future__ import annotations

from dataclasses import dataclass

Range = tuple[float, float]


@dataclass(frozen=True)
class DynamicsRandomization:
    """Uniform multiplicative ranges (low, high); (1.0, 1.0) leaves that quantity as the MJCF defines it."""

    mass: Range = (1.0, 1.0)  # body masses (and inertias)
    friction: Range = (1.0, 1.0)  # geom friction coefficients (sliding, torsional, rolling)
    damping: Range = (1.0, 1.0)  # joint (dof) damping

    def __post_init__(self) -> None:
        for name in ("mass", "friction", "damping"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"randomization {name} range must satisfy 0 < low <= high, got ({low}, {high})")

    @classmethod
    def symmetric(cls, fraction: float) -> "DynamicsRandomization":
        """Every quantity scaled by U(1 - fraction, 1 + fraction)."""
        if not 0 <= fraction < 1:
            raise ValueError(f"randomization fraction must be in [0, 1), got {fraction}")
        span = (1.0 - fraction, 1.0 + fraction)
        return cls(mass=span, friction=span, damping=span)

    @property
    def is_identity(self) -> bool:
        """True when nothing is randomized."""
        return all(getattr(self, name) == (1.0, 1.0) for name in ("mass", "friction", "damping"))
