"""RL algorithms behind one seam (`base.py`): each registers its learner, policy and phase functions by name.

Importing the package registers the built-in algorithms, so a config's `algorithm.name` always finds them.
"""
from rl_core.algos import grpo_learner, ppo_learner  # noqa: F401  (register "grpo" and "ppo")
