"""The commit of an iteration's version, as one object both flows use: it owns the run's writer and holds at most
one commit in flight, so the commit can overlap the next iteration without the flow body scheduling it by hand.

Why overlapping is safe (the argument, in one place):
- **Versions land in order.** Version v+1 is a delta on v. The pipeline holds one pending commit; `add` refuses a
  second until `land` has returned the first, so checkpoint_diff(i) always lands before checkpoint_diff(i+1) starts.
- **A version in flight still exists.** Until v+1 lands it lives in iteration v's step outputs: the learner state its
  train_shard staged and the envs' end states in its experience shards. A retried or replaced worker or rank that
  must restore v+1 meanwhile reads it there (`rl_core.runtime.version_state`), and the commit removes those outputs
  only once the version holds them.
- **A crash loses no work that cannot be redone exactly.** A commit that has not landed is redone by the rerun, with
  the update that followed it; every finished step comes back from Prefect's cache, and a claim the killed commit
  left is withdrawn by the sole writer (`rl_core.runtime.commits.writer_store`).
- **One writer.** The flow run holds the run's lease, so it is the store's only writer; the pipeline opens the store
  once per flow run and every commit reuses it (each encodes against the base the previous left in memory). A rerun
  builds a new pipeline, so it opens the store afresh.

The control flow starts a commit beside the next iteration's train_shard, once its simulate and score are done (they
keep every core busy; the update of one rank leaves one idle). The agent flow starts it at once, beside the next
rollout and update: its generator syncs a version in flight from what train_shard staged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import Task
from prefect.futures import PrefectFuture

from rl_core.checkpoint import CheckpointStore
from rl_core.config.agent import AnyRunConfig
from rl_core.iteration_clock import StepWaits
from rl_core.runtime.commits import writer_store


@dataclass
class Landed:
    """A commit that has landed: checkpoint_diff's summary and what its iteration handed `add` to report."""

    committed: dict
    iteration: int
    context: Any


@dataclass
class _Pending:
    arguments: tuple
    iteration: int
    version: int
    context: Any
    future: PrefectFuture | None = None


class CommitPipeline:
    """checkpoint_diff of one iteration at a time, started when the flow says and landed before the next is added."""

    def __init__(self, cfg: AnyRunConfig, step: Task) -> None:
        self.cfg, self.step = cfg, step
        self.writer: CheckpointStore | None = writer_store(cfg)
        self._pending: _Pending | None = None

    def add(self, incarnation: str, iteration: int, version: int, staged: str, experience: list[str],
            context: Any = None) -> None:
        """Queue the commit of version+1 (iteration `iteration`'s result); `context` comes back with it from `land`."""
        if self._pending is not None:
            raise RuntimeError(f"iteration {iteration}'s commit added while iteration {self._pending.iteration}'s "
                               "has not landed: versions land in order")
        self._pending = _Pending((self.cfg, incarnation, iteration, version, staged, experience, self.writer),
                                 iteration, version + 1, context)

    def start(self) -> None:
        """Submit the queued commit, if any and not yet started."""
        if self._pending is not None and self._pending.future is None:
            self._pending.future = self.step.submit(*self._pending.arguments)

    def land(self, waits: StepWaits) -> Landed | None:
        """Wait for the queued commit (starting it first if nothing did), counted as `waits`'s checkpoint time."""
        if self._pending is None:
            return None
        self.start()
        with waits("checkpoint"):
            committed = self._pending.future.result()
        done, self._pending = self._pending, None
        if committed["version"] != done.version:
            raise RuntimeError(f"iteration {done.iteration} committed version {committed['version']}, expected "
                               f"{done.version}; rerun the flow to continue from the newest version")
        return Landed(committed, done.iteration, done.context)

    def close(self) -> None:
        """Drop the writer at the flow run's end: it holds the base's tensors, which a long-lived worker process would
        otherwise keep until its next run."""
        self.writer = None
