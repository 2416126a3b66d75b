"""One rank of the trainer group: the learner's updates with gradients averaged over a torch.distributed group.

Like env workers, a rank remembers which checkpoint version its learner holds and restores from the
store when asked to train from another, so retried and resumed steps start from committed state.
Inside an iteration, rank 0 saves the learner after every `epoch_checkpoint_every` epochs (once the update has
run `epoch_checkpoint_min_s` since it started or last saved); a retried update restores the newest of those and
runs only the epochs that remain. Whether a save happened never changes the result, only how much a retry redoes.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from rl_core.algos.base import (
    Epochs,
    Tensors,
    UpdateHooks,
    build_learner,
    single_process,
)
from rl_core.checkpoint import CheckpointStore
from rl_core.config.agent import parse_run_config
from rl_core.config.threads import learner_threads
from rl_core.data import RunLayout, read_tensors, write_tensors
from rl_core.envs.registry import import_env_module
from rl_core.optim.instability import UnstableUpdate
from rl_core.runtime.faults import maybe_fail
from rl_core.runtime.free_memory import release_free_memory
from rl_core.runtime.version_state import learner_state

logger = logging.getLogger("rl_core.runtime")


class TrainerRank:
    """Rank `rank` of `world_size`; `connect` joins the process group once, `train` runs per iteration."""

    def __init__(self, config_json: str, rank: int, world_size: int) -> None:
        self.cfg = parse_run_config(config_json)
        torch.set_num_threads(learner_threads(self.cfg))
        import_env_module(self.cfg.env.module)  # the run's own envs, registered in this process too
        self.rank, self.world_size = rank, world_size
        self.layout = RunLayout(self.cfg.run_url)
        self.store = CheckpointStore(self.layout.checkpoints, full_every=self.cfg.storage.full_every)
        self.learner = build_learner(self.cfg)
        self.learner_version: int | None = None
        self._completed: tuple[int, int, dict[str, float]] | None = None  # (iteration, version, metrics)

    def reuse(self, config_json: str, rank: int, world_size: int) -> None:
        """Become a rank of another run (a sweep's next member: `rl_core.runtime.warm_actors`): leave the old group
        and build again everything the constructor builds; `connect` then joins the new group."""
        self.close()
        self.__init__(config_json, rank, world_size)

    def connect(self, init_method: str) -> None:
        """Join the gloo (CPU) or NCCL (CUDA) group at `init_method` (a `file://` store on one machine, else
        `tcp://host:port`); blocks until every rank has joined."""
        if init_method.startswith(("file://", "tcp://127.0.0.1:")):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep gloo's own connections on loopback too
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(
            backend, init_method=init_method, rank=self.rank,
            world_size=self.world_size, timeout=timedelta(seconds=self.cfg.collective_timeout_s),
        )

    def _all_reduce_mean(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(self.world_size)

    @staticmethod
    def _all_reduce_max(tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)

    def _sync(self, version: int) -> None:
        """Hold the learner of `version`: a rank that does not (a retry, a new process) reads it from the store,
        or from what its iteration staged while its commit is in flight (`version_state`)."""
        if self.learner_version != version:
            self.learner.load_state(learner_state(self.store, self.layout, version))
            self.learner_version = version

    def initial_state(self) -> Tensors:
        """The seeded learner state of a new run (version 0)."""
        return self.learner.state()

    def warm_start(self, uri: str) -> dict[str, float]:
        """Prepare a new run's version 0 with the learner's warm start (GRPO: SFT on demonstrations) and write the
        learner state to `uri`; the metrics of the warm start."""
        metrics = self.learner.warm_start()
        write_tensors(uri, self.learner.state(), {"warm_start": metrics})
        release_free_memory()
        self.learner_version = None  # the store's version 0 is what every rank loads from now on
        return metrics

    def train(self, iteration: int, version: int) -> dict:
        """The learner's update on iteration's scored batch, from checkpoint `version`; rank 0 stages the result.

        Asked again for an update it already finished (its sibling rank failed after it), a rank
        returns the same result without training twice.
        """
        if self._completed and self._completed[:2] == (iteration, version) and self.learner_version == version + 1:
            return self._completed[2]
        self._sync(version)
        self.learner_version = None  # mid-update until it completes
        batch, _ = read_tensors(self.layout.scored(iteration))
        if maybe_fail("train.batch", iteration=iteration, rank=self.rank):  # action=poison: NaN advantages
            batch["advantages"] = np.full_like(batch["advantages"], np.nan)
        progress = CheckpointStore(self.layout.train_progress(iteration), full_every=self.cfg.storage.full_every)
        hooks = UpdateHooks(
            rank=self.rank, world_size=self.world_size,
            all_reduce_mean=self._all_reduce_mean if self.world_size > 1 else single_process,
            all_reduce_max=self._all_reduce_max if self.world_size > 1 else single_process,
            resume=lambda: self._restore_progress(progress, iteration, version),
            on_epoch_end=self._progress_saver(progress, iteration, version),
        )
        try:
            metrics = self.learner.update(batch, iteration, hooks)
        except UnstableUpdate as unstable:
            metrics = self._roll_back(iteration, version, unstable)
        if self.rank == 0:
            write_tensors(self.layout.staged_learner(iteration), self.learner.state(),
                          {"iteration": iteration, "parent_version": version})
        self.learner_version = version + 1
        self._completed = (iteration, version, metrics)
        release_free_memory()  # the update's activations and the staged copy: the generator and the commit need them
        return metrics

    def _roll_back(self, iteration: int, version: int, unstable: UnstableUpdate) -> dict[str, float]:
        """The guard gave up on iteration's update: the learner returns to committed `version` (weights, optimizer,
        statistics), which the iteration then stages unchanged, so the next version equals it and the next iteration
        trains on fresh data. Every rank reaches this together (the guard decides on all-reduced gradients)."""
        self.learner.load_state(learner_state(self.store, self.layout, version))
        if self.rank == 0:
            logger.warning("iteration %d: %s; rolled back to version %d (the next version repeats its weights)",
                           iteration, unstable, version)
        return {"rolled_back": 1.0, "rolled_back_to": float(version), "skipped_updates": float(unstable.skipped)}

    def _progress_saver(self, progress: CheckpointStore, iteration: int, version: int
                        ) -> Callable[[Epochs, bool], None]:
        """on_epoch_end: rank 0 saves the learner every `epoch_checkpoint_every` epochs once
        `epoch_checkpoint_min_s` passed since the update started or last saved (never after the last epoch:
        the staged result follows); every rank passes the fault-injection point."""
        storage = self.cfg.storage
        last_save = time.monotonic()

        def on_epoch_end(epochs: Epochs, last: bool) -> None:
            nonlocal last_save
            waited = time.monotonic() - last_save >= storage.epoch_checkpoint_min_s
            due = storage.epoch_checkpoint_every and len(epochs) % storage.epoch_checkpoint_every == 0 and waited
            if self.rank == 0 and due and not last:
                progress.commit(self.learner.state(), {"iteration": iteration, "version": version, "history": epochs})
                last_save = time.monotonic()
            maybe_fail("train.epoch_end", iteration=iteration, rank=self.rank, epoch=int(epochs[-1]["epoch"]))

        return on_epoch_end

    def _restore_progress(self, progress: CheckpointStore, iteration: int, version: int) -> Epochs:
        """Epoch history of a partly done update of (iteration, version), with the learner restored to it."""
        if progress.latest() is None:
            return []
        snapshot = progress.load()
        if (snapshot.meta["iteration"], snapshot.meta["version"]) != (iteration, version):
            return []
        self.learner.load_state(snapshot.tensors)
        return list(snapshot.meta["history"])

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()
