"""The run's generator on a Ray actor that outlives task retries: a `Generator` backend plus the store it syncs from.

The actor holds one policy version at a time. `sync(version)` loads that version's policy weights from the
checkpoint store (or, while its commit is in flight, from what train_shard staged for it) into the backend
(`update_weights(state, version)`) unless it already holds them; `generate` is refused for any other version
(`VersionMismatchError`), so every generation is stamped with the weights that made it. A rollout step syncs first,
then generates: a retried step, a resumed run or a replaced actor all start from stored weights. `GeneratorClient`
is the driver's side: it creates the named actor, and replaces it after it died (the next `sync` restores the
weights).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import ray
import torch

from rl_core.algos.base import policy_sha256
from rl_core.checkpoint import CheckpointStore
from rl_core.config.agent import AgentRunConfig, parse_run_config
from rl_core.config.threads import learner_threads
from rl_core.data import RunLayout
from rl_core.envs.registry import import_env_module
from rl_core.generation import Generation, GenerationRequest, Generator
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.policies.lm_policy import PREFIX, build_language_model, hf_state
from rl_core.runtime.faults import maybe_fail
from rl_core.runtime.free_memory import release_free_memory
from rl_core.runtime.local_ray import actor_cpus, actor_options, ensure_ray, wait_until_names_free
from rl_core.runtime.version_state import learner_state

NO_VERSION = -1
"""What a new actor holds: no committed version, so it must sync before it generates."""
CLOSE_TIMEOUT_S = 30.0
"""How long a vLLM actor may take to stop its engine and remove its temp folder before it is killed regardless (the
next generator then removes the folder of the killed process)."""


class GeneratorDied(RuntimeError):
    """The generator actor died mid-call; the next sync starts a replacement from the store."""


class WeightSyncTimeout(RuntimeError):
    """The generator did not load a version's weights in time; it is replaced on the next use."""


class GeneratorWorker:
    """A TorchGenerator on the run's model, fed committed versions from the run's checkpoint store."""

    def __init__(self, config_json: str) -> None:
        self.cfg = parse_run_config(config_json)
        torch.set_num_threads(learner_threads(self.cfg))
        import_env_module(self.cfg.env.module)  # the run's own envs, registered in this process too
        model, _ = build_language_model(self.cfg)
        if self.cfg.generator == "vllm":
            from rl_core.generation.vllm_generator import VLLMGenerator

            self.backend: Generator = VLLMGenerator.from_model(model, version=NO_VERSION)
        else:
            self.backend = TorchGenerator(model, version=NO_VERSION)
        self.layout = RunLayout(self.cfg.run_url)
        self.store = CheckpointStore(self.layout.checkpoints, full_every=self.cfg.storage.full_every)
        self._calls = 0  # generate calls since the last change of version (for fault drills)
        self._sha256 = ""

    def ping(self) -> int:
        """The version held (liveness)."""
        return self.backend.version

    def sync(self, version: int) -> str:
        """Hold `version`'s policy weights (loaded from the store unless already held); returns their sha256
        (`policy_sha256` of the version's `model.` tensors)."""
        if self.backend.version != version:
            maybe_fail("generator.sync", version=version)
            weights = hf_state(learner_state(self.store, self.layout, version, prefix=PREFIX))  # not Adam's
            self.backend.update_weights(weights, version)
            self._calls = 0
            self._sha256 = policy_sha256({f"model.{k}": v for k, v in weights.items()})
            del weights
            release_free_memory()  # the version read from the store, once the backend holds its own copy
        return self._sha256

    def generate(self, requests: Sequence[GenerationRequest], version: int) -> list[Generation]:
        """One generation per request from `version`, which must be the version held."""
        self._calls += 1
        maybe_fail("generator.generate", version=version, call=self._calls)
        return self.backend.generate(requests, version)

    def close(self) -> None:
        """Stop the backend's engine and remove its temp folder (vLLM's; the torch backend has neither): `ray.kill`
        ends the actor running no exit handler."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


class GeneratorClient:
    """The driver's handle on the run's generator actor, created on first use and replaced after it died."""

    def __init__(self, cfg: AgentRunConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._actor: ray.actor.ActorHandle | None = None

    @property
    def name(self) -> str:
        return f"gymflow-{self.cfg.run_name}-generator"

    def _handle(self) -> ray.actor.ActorHandle:
        with self._lock:
            if self._actor is None:
                ensure_ray(actor_cpus(self.cfg))
                gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0  # a GPU, where the cluster has one
                remote = ray.remote(num_cpus=1, num_gpus=gpus)(GeneratorWorker).options(
                    name=self.name, get_if_exists=True, max_concurrency=1, **actor_options())
                self._actor = remote.remote(self.cfg.model_dump_json())
            return self._actor

    def start(self) -> None:
        """Create the actor without waiting (it imports torch and builds the model meanwhile)."""
        self._handle()

    def sync(self, version: int) -> str:
        """Make the actor hold `version` within `weight_sync_timeout_s`; the sha256 of its weights. The bound is
        the sync's alone: a new actor first finishes starting (importing torch, building the model), which on a busy
        machine can take longer than a sync ever should."""
        timeout = self.cfg.weight_sync_timeout_s
        self._call(lambda actor: actor.ping.remote())
        try:
            return self._call(lambda actor: actor.sync.remote(version), timeout)
        except ray.exceptions.GetTimeoutError:
            self._discard(self._handle())
            raise WeightSyncTimeout(f"the generator of run {self.cfg.run_name} did not load policy version {version} "
                                    f"within {timeout:g} s (weight_sync_timeout_s); it was stopped, and a retry "
                                    "starts a fresh one") from None

    def generate(self, requests: Sequence[GenerationRequest], version: int) -> list[Generation]:
        return self._call(lambda actor: actor.generate.remote(list(requests), version))

    def _call(self, submit, timeout: float | None = None):
        actor = self._handle()
        try:
            return ray.get(submit(actor), timeout=timeout)
        except ray.exceptions.RayActorError as err:
            self._discard(actor)
            raise GeneratorDied(f"the generator of run {self.cfg.run_name} died: {err}; a retry starts a "
                                "replacement that loads the version it is asked for from the store") from err

    def _discard(self, actor: ray.actor.ActorHandle) -> None:
        with self._lock:
            if self._actor is actor:
                ray.kill(actor, no_restart=True)
                self._actor = None
                wait_until_names_free([self.name])

    def shutdown(self) -> None:
        with self._lock:
            actor, self._actor = self._actor, None
        if actor is not None:
            if self.cfg.generator == "vllm":
                with contextlib.suppress(ray.exceptions.RayError):  # dead or stuck: its folder outlives it
                    ray.get(actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
            ray.kill(actor, no_restart=True)
            wait_until_names_free([self.name])
