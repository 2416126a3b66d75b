"""Where the heavy work runs: Ray env-worker pool and the torch.distributed trainer group."""
# Imported first so Ray's environment (loopback, no usage stats, worker niceness) is set before any module
# of this package imports ray.
from rl_core.runtime import local_ray  # noqa: F401
