"""Optimizer code shared by both flows: the Adam fast path, flat gradients, the instability guard."""
