"""Policies and the observation normalizer they read through."""
from rl_core.policies.mlp import ActorCritic
from rl_core.policies.normalizer import Moments, ObservationNormalizer

__all__ = ["ActorCritic", "Moments", "ObservationNormalizer"]
