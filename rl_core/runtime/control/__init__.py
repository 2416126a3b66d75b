"""The control flow's Ray actors: the env-worker pool that steps batched MuJoCo."""
