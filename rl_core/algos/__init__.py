"""RL algorithms behind one seam (`base.py`): each registers its learner, policy and phase functions by name.

Importing the package registers the built-in algorithms, so a config's `algorithm.name` always finds them.
"""
from rl_core.algos.grpo import learner as grpo_learner  # noqa: F401  (registers "grpo")
from rl_core.algos.ppo import learner as ppo_learner  # noqa: F401  (registers "ppo")
