"""Start or join Ray, keeping a machine-local Ray on 127.0.0.1.

A local Ray otherwise advertises the machine's network address and listens on every interface. With
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (read when `ray` is first imported; despite its name it applies
on Linux) it uses 127.0.0.1 for everything. We set it only when no cluster is named in `RAY_ADDRESS`.
"""
from __future__ import annotations

import os

if not os.environ.get("RAY_ADDRESS"):
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray starts workers at nice 15; here the workers *are* the job, and niced they lose the cores to the
# driver and the Prefect API whenever the machine is busy.
os.environ.setdefault("RAY_worker_niceness", "0")

import ray  # noqa: E402  (must follow the environment set-up above)


def ensure_ray(num_cpus: int | None = None) -> None:
    """Join `RAY_ADDRESS` if set, else start a local Ray with at least `num_cpus` logical CPUs.

    Logical CPUs may exceed the cores: env workers and trainer ranks take turns (simulate, then
    train), so reserving a core each for both would leave half of them idle.
    """
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(namespace="gymflow", log_to_driver=False)
        return
    cpus = max(os.cpu_count() or 1, num_cpus or 0)
    ray.init(num_cpus=cpus, namespace="gymflow", include_dashboard=False, log_to_driver=False)
