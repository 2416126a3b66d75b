"""Turning step outputs into committed checkpoint versions: version v is the state after v iterations.

A version holds the learner (weights, Adam, statistics) and every env's state (joined across workers
in global env order, so the pool can be re-split), plus JSON meta: counters and the configuration.
Committing is idempotent: asking again for a version that exists returns it instead of writing twice.
"""
from __future__ import annotations

import fsspec
import numpy as np

from rl_core.algos.base import Tensors
from rl_core.algos.batches import ENV_STATE_PREFIX
from rl_core.checkpoint import CheckpointStore
from rl_core.config import RunConfig
from rl_core.data import RunLayout, read_tensors

RNG_SCHEME = "counter-based: every stream is seeded from (seed, iteration, env index, episode index)"


def _store(cfg: RunConfig) -> CheckpointStore:
    return CheckpointStore(RunLayout(cfg.run_url).checkpoints, full_every=cfg.storage.full_every)


def _summary(store: CheckpointStore, version: int) -> dict:
    report = store.size_report(version)
    return {"version": version, "encoded_bytes": report["encoded_bytes"], "raw_bytes": report["raw_bytes"],
            "env_steps": store.manifest(version)["meta"]["env_steps"]}


def commit_initial(cfg: RunConfig, learner_state: Tensors) -> dict:
    """Version 0 (the seeded learner; envs start fresh from the seed), unless the run already has versions."""
    store = _store(cfg)
    latest = store.latest()
    if latest is None:
        latest = store.commit(learner_state, {"iteration": 0, "env_steps": 0, "seed": cfg.seed,
                                              "rng": RNG_SCHEME, "config": cfg.model_dump(mode="json")})
    return _summary(store, latest)


def commit_iteration(cfg: RunConfig, iteration: int, version: int, staged: str, experience: list[str]) -> dict:
    """Commit version+1 from the staged learner and the workers' end env states; clean the step outputs."""
    store = _store(cfg)
    latest = store.latest()
    if latest == version + 1:
        return _summary(store, latest)
    if latest != version:
        raise RuntimeError(f"iteration {iteration} trained from version {version} but the newest committed "
                           f"version of {cfg.run_url} is {latest}; rerun the flow to continue from {latest}")
    tensors, _ = read_tensors(staged)
    env_parts = [read_tensors(uri)[0] for uri in experience]
    for key in (k for k in env_parts[0] if k.startswith(ENV_STATE_PREFIX)):
        tensors[key] = np.concatenate([part[key] for part in env_parts], axis=0)
    parent_meta = store.manifest(version)["meta"]
    steps = parent_meta["env_steps"] + cfg.batch_size
    new = store.commit(tensors, {"iteration": iteration + 1, "env_steps": steps, "seed": cfg.seed,
                                 "rng": RNG_SCHEME, "config": cfg.model_dump(mode="json")})
    summary = _summary(store, new)
    fs, path = fsspec.core.url_to_fs(RunLayout(cfg.run_url).iteration(iteration))
    fs.rm(path, recursive=True)  # the committed version now holds everything the step outputs carried
    return summary
