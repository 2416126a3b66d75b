"""Where the heavy work runs: Ray env-worker pool and the torch.distributed trainer group (`RunActors` owns both
for one run), and the version commits between iterations."""
