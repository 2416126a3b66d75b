"""Turning step outputs into committed checkpoint versions: version v is the state after v iterations.

A version holds the learner (weights, optimizer, statistics) and, for algorithms whose experience comes from env
workers, every env's state (joined across workers in global env order, so the pool can be re-split), plus JSON
meta: the algorithm's counters (env steps; tokens and the trajectories an update consumed), the seed and the
configuration. Committing is idempotent: asking again for a version that exists returns it instead of writing twice.
"""
from __future__ import annotations

from collections.abc import Callable

import fsspec
import numpy as np

from rl_core.algos.base import Tensors, algorithm_of
from rl_core.algos.ppo.batches import ENV_STATE_PREFIX
from rl_core.checkpoint import CheckpointStore
from rl_core.config.common import RunSpec
from rl_core.data import RunLayout, read_tensors
from rl_core.runtime.free_memory import release_free_memory


def writer_store(cfg: RunSpec) -> CheckpointStore:
    """The run's checkpoint store, as its only writer opens it (the flow run holding the run's lease): a claim
    that a killed run left mid-commit is withdrawn, so iteration i still commits version i + 1. A writer that keeps
    it across its commits (see `commit_iteration`) saves each commit listing, reading and decoding the base again."""
    return CheckpointStore(RunLayout(cfg.run_url).checkpoints, full_every=cfg.storage.full_every, sole_writer=True)


def _summary(store: CheckpointStore, version: int) -> dict:
    """The version, its sizes and its numeric counters (iteration, env steps or tokens...)."""
    report = store.size_report(version)
    counters = {k: v for k, v in store.meta(version).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {**counters, "version": version, "encoded_bytes": report["encoded_bytes"],
            "raw_bytes": report["raw_bytes"]}


def _meta(cfg: RunSpec, iteration: int, experience: list[str], parent_meta: dict | None) -> dict:
    counting = algorithm_of(cfg).counters
    counters = counting(cfg, experience, parent_meta) if counting else {}
    return {"iteration": iteration, **counters, "seed": cfg.seed, "config": cfg.model_dump(mode="json")}


def join_env_states(experience: list[str]) -> Tensors:
    """Every env's end state from the workers' experience shards, in global env order (none in other experience)."""
    parts = [read_tensors(uri)[0] for uri in experience]
    return {key: np.concatenate([part[key] for part in parts], axis=0)
            for key in (parts[0] if parts else {}) if key.startswith(ENV_STATE_PREFIX)}


def newest_valid_version(store: CheckpointStore) -> tuple[int | None, list[str]]:
    """The newest committed version that verifies (every object and decoded chunk), and what was set aside to find
    it: a newer version that fails (a chunk corrupted or lost, say by a power loss) is set aside, one message each
    naming the store, the version and the failure, so a resumed run continues from the version before it instead
    of failing on every retry."""
    set_aside: list[str] = []
    while (latest := store.latest()) is not None:
        errors = store.verify(latest)["errors"]
        if not errors:
            return latest, set_aside
        where = store.set_aside(latest)
        set_aside.append(f"checkpoint version {latest} of {store.url} fails verification ({errors[latest]}); set "
                         f"aside ({where}): the run continues from version {store.latest()}")
    return None, set_aside


def commit_initial(cfg: RunSpec, learner_state: Tensors | Callable[[], Tensors] | None) -> dict:
    """Where the run stands: its newest valid version (see `newest_valid_version`; its `set_aside` messages are in
    the summary, and `lineage`, how many versions were ever set aside), or version 0 (the initial learner; envs
    start fresh from the seed) for a run without one.
    `learner_state` may be a function giving it, called only when version 0 is to be committed; None commits
    nothing, and a run without a version then answers version None."""
    store = writer_store(cfg)
    latest, set_aside = newest_valid_version(store)
    if latest is None and learner_state is not None:
        state = learner_state() if callable(learner_state) else learner_state
        latest = store.commit(state, _meta(cfg, 0, [], None))
    summary = _summary(store, latest) if latest is not None else {"version": None}
    return {**summary, "set_aside": set_aside, "lineage": store.set_aside_count()}


def remove_staged(uris: list[str]) -> None:
    """Delete step outputs a committed version now holds (ignoring ones already gone)."""
    for uri in uris:
        fs, path = fsspec.core.url_to_fs(uri)
        if fs.exists(path):
            fs.rm(path)


def commit_iteration(cfg: RunSpec, iteration: int, version: int, staged: str, experience: list[str],
                     store: CheckpointStore | None = None) -> dict:
    """Commit version+1 from the staged learner and the workers' end env states; clean the step outputs.

    ``store``: the run's `writer_store`, kept by a caller that is the run's only writer (a flow run holding the
    run's lease) across its commits: each then encodes against the base and the probes the previous commit left in
    memory (in a quick flow run, re-reading them was 14% of the step's profile samples). None opens the store afresh."""
    store = store or writer_store(cfg)
    latest = store.latest()
    if latest == version + 1:
        return _summary(store, latest)
    if latest != version:
        raise RuntimeError(f"iteration {iteration} trained from version {version} but the newest committed "
                           f"version of {cfg.run_url} is {latest}; rerun the flow to continue from {latest}")
    tensors, _ = read_tensors(staged)
    meta = _meta(cfg, iteration + 1, experience, store.meta(version))
    new = store.commit({**tensors, **join_env_states(experience)}, meta)
    summary = _summary(store, new)
    fs, path = fsspec.core.url_to_fs(RunLayout(cfg.run_url).iteration(iteration))
    fs.rm(path, recursive=True)  # the committed version now holds everything the step outputs carried
    del tensors
    release_free_memory()  # the staged state read and the encoding buffers, while the next steps run beside
    return summary
