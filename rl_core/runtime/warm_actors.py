"""Actor processes that outlive their run, for the next run of the same process: a sweep's members.

A short member spends most of its time starting its env workers and trainer ranks (a Python process each, importing
torch and building MuJoCo models: CPU-bound). Inside `reusing_actors()` a run that ends parks its actors here, and the
next run that needs an actor of the same class and options takes one and gives it its own config (the actor's `reuse`,
which builds again everything its constructor builds). Nothing a run leaves in such a process changes what the next
one computes: its seeds, weights and envs come from its config and its store, so results are bit-identical to fresh
processes (tests/flows/test_sweep_warm_actors.py).

On a local Ray, at most one actor per core starts at a time, the runs that began first before the others, and a run
waits instead of starting one while another run is expected to park an actor of that kind sooner than a new one would
start (both times measured as the sweep goes). Many short members begun together then share a few processes instead of
each starting its own at once on a machine that cannot run them; long members start theirs.

Parked actors hold their Ray resources. A new actor is created only when none of its kind is idle; when Ray has no
CPU free for it, or it has not started after `PENDING_S`, the idle actors are stopped, so a run never waits for
resources an idle actor holds.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import ray

from rl_core.runtime.local_ray import actor_options, is_local_ray

logger = logging.getLogger("rl_core.runtime")

REUSE_TIMEOUT_S = 60.0
"""How long a parked actor may take to accept a new run's config before it is stopped and a new one started (a
parked actor still inside a call of a failed run answers only when that call ends)."""


WAIT_POLL_S = 0.1
"""How often a request waiting for a parked actor checks whether it should start one after all."""

PENDING_S = 10.0
"""How long a new actor may take to start before the idle actors are stopped, in case it waits for their resources."""

WATCH_THREAD = "gymflow-actor-start-watch"
"""The name of the threads that wait `PENDING_S` for a new actor's start."""


class ParkedActors:
    """Idle actors by kind (class and options), and the start slots: `slots` actors starting at once (None: any
    number), granted to the waiting requests of the run that asked first. A request waits instead of starting an actor
    while a run is expected to park one of its kind sooner than a new one would start (both times measured here)."""

    def __init__(self, slots: int | None) -> None:
        self._changed = threading.Condition()
        self._idle: dict[str, list[ray.actor.ActorHandle]] = {}
        self._free = slots
        self._runs: dict[str, int] = {}  # run -> its rank in the order runs first asked
        self._starting: list[tuple[int, int]] = []  # (run's rank, request number) of the requests waiting to start
        self._requests = 0
        self._held: dict[str, dict[int, float]] = {}  # kind -> id of an actor a run holds -> since when
        self._start_s: float | None = None  # how long a new actor takes to start (moving average)
        self._hold_s: float | None = None  # how long a run holds an actor (moving average)
        self._timers: list[threading.Timer] = []
        self._kinds: dict[int, str] = {}  # id of every handle `start_actor` gave out -> its kind
        self.started_count = self.reused_count = 0

    def take_or_start(self, kind: str, run: str) -> ray.actor.ActorHandle | None:
        """An idle actor of `kind`, or None once a start slot is held for a new one (`started` gives it back)."""
        with self._changed:
            self._requests += 1
            me = (self._runs.setdefault(run, len(self._runs)), self._requests)
            try:
                while True:
                    if idle := self._idle.get(kind):
                        handle = idle.pop()
                        self._held.setdefault(kind, {})[id(handle)] = time.monotonic()
                        return handle
                    if self._free is None:
                        return None
                    if self._park_expected(kind):
                        if me in self._starting:
                            self._starting.remove(me)
                    else:
                        if me not in self._starting:
                            self._starting.append(me)
                        if self._free > 0 and min(self._starting) == me:
                            self._free -= 1
                            return None
                    self._changed.wait(timeout=WAIT_POLL_S)
            finally:
                if me in self._starting:
                    self._starting.remove(me)
                self._changed.notify_all()

    def _park_expected(self, kind: str) -> bool:
        """Whether a run holding an actor of `kind` is expected to park it before a new one would start (and is not
        overdue by more than that)."""
        if self._start_s is None or self._hold_s is None:
            return False
        now = time.monotonic()
        return any(-self._start_s < since + self._hold_s - now < self._start_s
                   for since in self._held.get(kind, {}).values())

    def started(self, kind: str, handle_id: int, seconds: float | None) -> None:
        """An actor (`id()` of its handle) holding a start slot has started after `seconds` (None: it failed to)."""
        with self._changed:
            if seconds is not None:
                self._start_s = _averaged(self._start_s, seconds)
                self._held.setdefault(kind, {})[handle_id] = time.monotonic()
            if self._free is not None:
                self._free += 1
            self._changed.notify_all()

    def dropped(self, kind: str, handle: ray.actor.ActorHandle) -> None:
        """A taken actor turned out dead or stuck, and was stopped."""
        with self._changed:
            self._held.get(kind, {}).pop(id(handle), None)

    def tally(self, reused: bool) -> None:
        with self._changed:
            if reused:
                self.reused_count += 1
            else:
                self.started_count += 1

    def gave(self, kind: str, handle: ray.actor.ActorHandle) -> ray.actor.ActorHandle:
        """Remember `handle`'s kind, for `put`; returns it."""
        with self._changed:
            self._kinds[id(handle)] = kind
        return handle

    def put(self, handles: list[ray.actor.ActorHandle]) -> list[ray.actor.ActorHandle]:
        """Park `handles`, each under the kind it was given out as; returns those not given out here."""
        with self._changed:
            now, unknown = time.monotonic(), []
            for handle in handles:
                kind = self._kinds.get(id(handle))
                if kind is None:
                    unknown.append(handle)
                    continue
                since = self._held.get(kind, {}).pop(id(handle), None)
                if since is not None:
                    self._hold_s = _averaged(self._hold_s, now - since)
                self._idle.setdefault(kind, []).append(handle)
            self._changed.notify_all()
        return unknown

    def watch(self, ready: Future) -> None:
        """Stop the idle actors if a new actor (`ready`: its start) has not started after `PENDING_S`, in case it waits
        for resources they hold: Ray's count of free CPUs lags."""
        timer = threading.Timer(PENDING_S, lambda: ready.done() or self.stop_idle())
        timer.name, timer.daemon = WATCH_THREAD, True
        with self._changed:
            self._timers.append(timer)
        timer.start()

    def close(self) -> None:
        """Stop the idle actors and the watches. No thread of this object outlives it: one that dropped a reference of
        Ray's while Ray shuts down would end the process ("the core worker has already been shutdown")."""
        with self._changed:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
            timer.join()
        self.stop_idle()

    def stop_idle(self) -> None:
        with self._changed:
            idle, self._idle = [h for handles in self._idle.values() for h in handles], {}
        for handle in idle:
            ray.kill(handle, no_restart=True)


def _averaged(average: float | None, value: float) -> float:
    """A moving average that follows the last few values."""
    return value if average is None else 0.7 * average + 0.3 * value


_parked: ParkedActors | None = None
"""Set inside `reusing_actors()`: the idle actors of this process's finished runs."""


@contextmanager
def reusing_actors() -> Iterator[ParkedActors]:
    """Within this block, runs of this process park their actors when they end and take parked ones when they start;
    at its end the parked actors are stopped. Nested blocks share the outer one's actors. Yields the block's tally
    (`started_count`, `reused_count`)."""
    global _parked
    if _parked is not None:
        yield _parked
        return
    _parked = ParkedActors(len(os.sched_getaffinity(0)) if is_local_ray() else None)
    try:
        yield _parked
    finally:
        parked, _parked = _parked, None
        parked.close()


def _kind(cls: type, options: dict[str, Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__} {json.dumps(options, sort_keys=True)}"


def start_actor(cls: type, run: str, name: str, init_args: tuple, **options: Any) -> ray.actor.ActorHandle:
    """An actor of `cls` (1 CPU, `options`) for run `run`, built from `init_args`. Outside `reusing_actors()`: the
    actor named `name`, created if there is none (a retry, or another object of the same run, finds it). Inside: a
    parked actor of the same kind given `init_args` through its `reuse` method, else a new one without a name (a
    parked actor keeps its name, which another run may then ask for)."""
    options = {**options, **actor_options()}
    remote = ray.remote(num_cpus=1)(cls)
    parked = _parked
    if parked is None:
        return remote.options(name=name, get_if_exists=True, **options).remote(*init_args)
    kind = _kind(cls, options)
    while (handle := parked.take_or_start(kind, run)) is not None:
        try:
            ray.get(handle.reuse.remote(*init_args), timeout=REUSE_TIMEOUT_S)
            parked.tally(reused=True)
            return parked.gave(kind, handle)
        except ray.exceptions.RayTaskError:  # the config was refused: a new actor will refuse it the same way
            ray.kill(handle, no_restart=True)
        except (ray.exceptions.RayError, TimeoutError) as err:  # died, or stuck in a call of a failed run
            logger.warning("a parked %s actor could not be reused (%s); starting a new one", cls.__name__, err)
            ray.kill(handle, no_restart=True)
        parked.dropped(kind, handle)
    if ray.available_resources().get("CPU", 0) < 1:
        parked.stop_idle()  # their resources go to the new actor
    actor = remote.options(**options).remote(*init_args)
    parked.tally(reused=False)
    created, ready, handle_id = time.monotonic(), actor.__ray_ready__.remote().future(), id(actor)
    ready.add_done_callback(lambda done: parked.started(
        kind, handle_id, None if done.exception() else time.monotonic() - created))
    parked.watch(ready)
    return parked.gave(kind, actor)


def park(handles: list[ray.actor.ActorHandle]) -> bool:
    """Inside `reusing_actors()`: keep `handles` (actors `start_actor` gave out) for the next run, stop any others, and
    return True. Outside: False, and the caller stops them."""
    parked = _parked
    if parked is None:
        return False
    for handle in parked.put(handles):
        ray.kill(handle, no_restart=True)
    return True
