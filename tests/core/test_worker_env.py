"""What a Ray actor is handed from the driver's environment: the GYMFLOW_* settings workers act on, never a secret."""
from __future__ import annotations

from rl_core.runtime import local_ray
from rl_core.runtime.faults import gymflow_env_vars


def test_actors_get_worker_settings_but_never_the_proposers_api_key(monkeypatch) -> None:
    monkeypatch.setenv("GYMFLOW_KERNEL_PROPOSER_API_KEY", "sk-do-not-ship")
    monkeypatch.setenv("GYMFLOW_KERNEL_PROPOSER_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("GYMFLOW_METRIC_SINKS", "my.sinks:Sink")
    monkeypatch.setenv("GYMFLOW_FAULTS", "train.epoch_end:iteration=1")
    monkeypatch.setenv("GYMFLOW_CACHE_DIR", "/tmp/kernels")
    handed = gymflow_env_vars()
    assert handed == {"GYMFLOW_FAULTS": "train.epoch_end:iteration=1", "GYMFLOW_CACHE_DIR": "/tmp/kernels"}
    monkeypatch.setattr(local_ray, "_inherited_env", None)  # a cluster: the settings go in the runtime_env
    options = local_ray.actor_options()
    assert options["runtime_env"]["env_vars"] == handed and "sk-do-not-ship" not in repr(options)
