"""Where the heavy work runs: Ray env-worker pool and the torch.distributed trainer group."""
