"""PPO for control runs: collection from MuJoCo env workers, GAE scoring, the clipped-surrogate update."""
