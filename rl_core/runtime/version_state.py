"""A checkpoint version's learner and env state, whether or not its commit has landed yet.

The control flow commits version v (checkpoint_diff of iteration v-1) beside train_shard(v), once simulate(v) and
score(v) are done: the commit then runs on the core a one-rank update leaves idle, instead of taking CPU from the
env workers, which keep every core busy while they simulate. Until it lands, v lives in iteration v-1's step
outputs: the learner state its train_shard staged, and the envs' end states in its experience shards. A worker or a
rank that must restore v meanwhile (a retry, a replacement) reads it there. Iteration v trains from version v, so
the iteration before a version is always `version - 1`.
"""
from __future__ import annotations

from collections.abc import Callable

import fsspec

from rl_core.algos.base import Tensors
from rl_core.algos.ppo.batches import ENV_STATE_PREFIX
from rl_core.checkpoint import CheckpointStore, Snapshot
from rl_core.data import RunLayout, TensorFileError, read_tensors
from rl_core.runtime.commits import join_env_states

Loader = Callable[[int], Snapshot]
"""Reads a committed version: a caller that needs both a version's learner and its envs passes one that keeps the
last version read, so the version is read and verified once."""


def committed(store: CheckpointStore, version: int) -> bool:
    """Whether `version` has landed (versions land in order)."""
    return (store.latest() or 0) >= version


def learner_state(store: CheckpointStore, layout: RunLayout, version: int, load: Loader | None = None,
                  prefix: str | None = None) -> Tensors:
    """Version `version`'s learner state (with `prefix`, the arrays whose names start with it: a policy's
    `model.` weights without the optimizer's state): committed (read with `load`, `store.load` by default), or while
    its commit is in flight the state staged for it."""
    if not committed(store, version):
        try:
            return read_tensors(layout.staged_learner(version - 1), prefix)[0]
        except TensorFileError:  # its commit landed meanwhile and removed it, or it is lost
            if not committed(store, version):
                raise _lost(store, version, "the learner state its train_shard staged") from None
    tensors = (load or store.load)(version).tensors
    return tensors if prefix is None else {name: value for name, value in tensors.items() if name.startswith(prefix)}


def env_states(store: CheckpointStore, layout: RunLayout, version: int, load: Loader | None = None) -> Tensors:
    """Every env's state of version `version` in global env order, keys without their prefix: committed (read with
    `load`), or before its commit lands the end states iteration version-1's env workers wrote with their
    experience."""
    tensors = None
    if not committed(store, version):
        fs, folder = fsspec.core.url_to_fs(layout.iteration(version - 1))
        shards = sorted(fs.glob(f"{folder}/experience-*.safetensors"))  # worker order: the index is zero-padded
        if shards:
            tensors = join_env_states([fs.unstrip_protocol(shard) for shard in shards])
        elif not committed(store, version):  # not landed meanwhile (it removes the shards once it has)
            raise _lost(store, version, "the experience its env workers wrote")
    if tensors is None:
        tensors = (load or store.load)(version).tensors
    return {k[len(ENV_STATE_PREFIX):]: v for k, v in tensors.items() if k.startswith(ENV_STATE_PREFIX)}


def _lost(store: CheckpointStore, version: int, what: str) -> RuntimeError:
    return RuntimeError(f"checkpoint version {version} of {store.url} is not committed and iteration {version - 1} "
                        f"left none of {what}; rerun the flow to continue from the newest version")
