"""RL algorithms: PPO's update and advantage estimation (through `kernels.dispatch`)."""
