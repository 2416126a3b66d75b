"""Where the heavy work runs: Ray env-worker pool and the torch.distributed trainer group (`ControlActors` owns both
for one run), and the version commits between iterations."""
