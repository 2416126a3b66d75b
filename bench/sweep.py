"""Many models at once: a sweep's members trained together against one after another, a long queue through the
concurrency limit, and a fork of a long run, in one process (issue 46, item 5).

1. Together or in turn: one spec of `--members` control members of the `--preset` (tiny: the issue's members, whose
   time is mostly start-up; `--members / 2` seeds x 2 learning rates, one env worker and one trainer rank each),
   swept twice under two names into two stores: all at once (`max_concurrent` = `--members`), then one at a time
   (`max_concurrent` = 1). Both train the same members to the same weights (`identical_work`: every member's policy
   hash equals its twin's). On both sides a member takes the actor processes an earlier member of its sweep parked
   (`rl_core.runtime.warm_actors`); each sweep starts with none, and its log says how many it started and reused.
   Timed on each side: the sweep flow's call, from its start to its report written (the members' actors starting,
   their iterations and final evaluations, the report). Counted on neither side: the interpreter and its imports,
   Prefect's temporary API, a one-member warm-up sweep (the driver's first import of the control flow and its
   kernels' lookup), and Ray's start (`ray_start_s`): one local Ray serves the whole bench, started first with the
   logical CPUs the concurrent sweep asks for (`ensure_ray`: CPUs for `max_concurrent` members), which every sweep's
   own `ensure_ray` then finds running. `concurrent_over_sequential_with_ray_start` adds that start to both sides, as
   two commands would each pay it. The concurrent side runs first, so whatever running earlier warms helps the
   sequential side. Env steps/s: every member's training env steps (their final evaluations not counted) over the
   side's wall time. Where the time goes: `*_cores_busy`, the cores this bench's processes kept busy on average (2 is
   a saturated 2-core machine; `*_machine_cores_busy` above it is someone else's load), `*_driver_cores_busy`, the
   share of it that this process took (Python's lock lets it use about one core, however many members it runs), and
   `concurrent_last_start_s`, when the last member's run began after the concurrent sweep's call (with a slot for
   every member, all begin at once unless something holds them back).
2. The queue: `--queued` members (seeds 0..N-1) through `--queue-limit` at a time: how many completed, whether every
   committed version of every member verifies (`CheckpointStore.verify`), the wall time.
3. Fork: bench/fork.py's measurement (`measure_fork`) of a `--versions`-version run: the fork's bytes written over
   the run's bytes (`fork_bytes_fraction`), and its seconds against a full copy's.

    python bench/sweep.py [--members 8] [--iterations 2] [--preset tiny] [--queued 40] [--queue-limit 4]
                          [--versions 100]

Last line: one JSON object. Stores, Prefect's home and its temporary API's database live in a private temp dir,
removed at exit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, NamedTuple

import psutil
from fork import measure_fork  # bench/fork.py: a run of many versions, forked and copied

from rl_core.private_temp import use_private_temp_dir

LEARNING_RATES = (1e-3, 3e-4)
"""The grid of the together-or-in-turn sweeps: two groups, `--members / 2` seeds each."""


def member_options(preset: str, iterations: int) -> dict[str, Any]:
    """A control member: one env worker and one trainer rank (two of Ray's logical CPUs)."""
    return {"preset": preset, "iterations": iterations, "num_workers": 1, "num_ranks": 1}


class CpuSeconds:
    """CPU seconds spent by this process and its descendants (the Prefect API, Ray and its workers), sampled on a
    thread every `every_s`, and by the whole machine. Sampled because Ray's raylet ignores SIGCHLD: a worker that
    exits is reaped without its times reaching the raylet's children's times, so a process counts as its last
    sample (what it spends in its last `every_s` is missed)."""

    def __init__(self, every_s: float = 0.2) -> None:
        self._last: dict[tuple[int, float], float] = {}  # (pid, start time) -> its CPU seconds when last sampled
        self._lock = threading.Lock()
        threading.Thread(target=self._every, args=(every_s,), name="cpu-seconds", daemon=True).start()

    def _every(self, every_s: float) -> None:
        while True:
            self.now()
            time.sleep(every_s)

    def now(self) -> tuple[float, float, float]:
        """(this tree's CPU seconds so far, the machine's busy seconds so far: idle, I/O waits and steal left out, this
        process's own: the driver, whose threads run every member's flow)."""
        me = psutil.Process()
        driver = me.cpu_times()
        for proc in (me, *me.children(recursive=True)):
            try:
                with proc.oneshot():
                    key, times = (proc.pid, proc.create_time()), proc.cpu_times()
            except psutil.Error:
                continue
            with self._lock:
                self._last[key] = times.user + times.system + times.children_user + times.children_system
        machine = psutil.cpu_times()
        busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
        with self._lock:
            return sum(self._last.values()), busy, driver.user + driver.system


class Timed(NamedTuple):
    """One sweep flow call: its wall time, the cores kept busy meanwhile (this bench's, the machine's, the driver
    process's), when each
    member's run began (seconds after the call), and the flow's final state (a failed member fails it)."""

    wall_s: float
    cores_busy: float
    machine_cores_busy: float
    driver_cores_busy: float
    member_starts_s: list[float]
    state: Any


def timed_sweep(spec: Any, cpu: CpuSeconds) -> Timed:
    """Run the sweep flow on `spec` (a SweepSpec), timed."""
    from flows.sweep import sweep

    given = spec.model_dump(mode="json", include={"name", "seeds", "grid", "options", "store", "max_concurrent"})
    called_at, started, before = time.time(), time.perf_counter(), cpu.now()
    state = sweep(**given, return_state=True)
    wall_s = time.perf_counter() - started
    own, machine, driver = ((b - a) / wall_s for a, b in zip(before, cpu.now()))
    return Timed(wall_s, own, machine, driver, [t - called_at for t in member_starts(spec)], state)


def member_starts(spec: Any) -> list[float]:
    """When each member's flow run began (epoch seconds), from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    names = [m.name for m in spec.members()]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)))
    return sorted(r.start_time.timestamp() for r in runs if r.start_time is not None)


def outcome(spec: Any) -> dict[tuple[str, int], dict[str, Any]]:
    """Per member of `spec` (by group and seed), from its store: whether it completed (its newest version is its
    iterations and the sweep recorded its result), whether every committed version verifies, its training env steps
    and its policy's hash."""
    from flows.sweep import recorded_result
    from rl_core.checkpoint import CheckpointStore
    from rl_core.data import RunLayout
    from rl_core.reporting import read_metrics

    found = {}
    for member in spec.members():
        result = recorded_result(spec, member)
        checked = CheckpointStore(RunLayout(member.config.run_url).checkpoints).verify()
        records = read_metrics(member.config.run_url)
        found[(member.group, member.seed)] = {
            "completed": result is not None,
            "verified": bool(checked["checked"]) and checked["errors"] == {},
            "env_steps": records[-1]["env_steps_total"] if records else 0,
            "policy_sha256": None if result is None else result["policy_sha256"]}
    return found


def together_or_in_turn(work: str, members: int, options: dict[str, Any], cpu: CpuSeconds) -> dict[str, Any]:
    """Part 1: the same spec (members of `options`) swept all at once, then one at a time."""
    from rl_core.config.sweep import load_spec

    sides: dict[str, tuple[Timed, dict]] = {}
    for side, max_concurrent in (("concurrent", members), ("sequential", 1)):
        spec = load_spec({"name": side, "seeds": list(range(members // 2)),
                          "grid": {"learning_rate": LEARNING_RATES}, "options": options,
                          "store": f"file://{work}/{side}", "max_concurrent": max_concurrent})
        timed = timed_sweep(spec, cpu)
        if not timed.state.is_completed():
            raise SystemExit(f"the {side} sweep failed: {timed.state.message}")
        sides[side] = (timed, outcome(spec))
        print(f"{side}: {members} members in {timed.wall_s:.1f} s, cores busy {timed.cores_busy:.2f} (machine "
              f"{timed.machine_cores_busy:.2f}, driver {timed.driver_cores_busy:.2f}), members began "
              f"{[round(s, 1) for s in timed.member_starts_s]} s "
              "after the call", file=sys.stderr)
    (together, together_found), (in_turn, in_turn_found) = sides["concurrent"], sides["sequential"]
    figures: dict[str, Any] = {"members": members, "preset": options["preset"], "iterations": options["iterations"],
                               "concurrent_over_sequential": round(in_turn.wall_s / together.wall_s, 3)}
    for side, (timed, found) in sides.items():
        figures.update({f"{side}_s": round(timed.wall_s, 2),
                        f"{side}_env_steps_per_s": round(sum(m["env_steps"] for m in found.values()) / timed.wall_s,
                                                         1),
                        f"{side}_cores_busy": round(timed.cores_busy, 2),
                        f"{side}_machine_cores_busy": round(timed.machine_cores_busy, 2),
                        f"{side}_driver_cores_busy": round(timed.driver_cores_busy, 2)})
    figures["concurrent_last_start_s"] = round(max(together.member_starts_s), 2)
    figures["identical_work"] = together_found.keys() == in_turn_found.keys() and all(
        m["policy_sha256"] is not None and m["policy_sha256"] == in_turn_found[k]["policy_sha256"]
        for k, m in together_found.items())
    return figures


def queue(work: str, queued: int, limit: int, options: dict[str, Any], cpu: CpuSeconds) -> dict[str, Any]:
    """Part 2: `queued` members of `options` through `limit` at a time."""
    from rl_core.config.sweep import load_spec

    spec = load_spec({"name": "queue", "seeds": list(range(queued)), "options": options,
                      "store": f"file://{work}/queue", "max_concurrent": limit})
    timed = timed_sweep(spec, cpu)
    found = outcome(spec)
    print(f"queue: {queued} members, {limit} at a time, in {timed.wall_s:.1f} s ({timed.state.name})",
          file=sys.stderr)
    return {"queued": queued, "queue_limit": limit, "queued_completed": sum(m["completed"] for m in found.values()),
            "queued_all_verified": all(m["verified"] for m in found.values()), "queued_s": round(timed.wall_s, 2),
            "queued_cores_busy": round(timed.cores_busy, 2),
            "queued_machine_cores_busy": round(timed.machine_cores_busy, 2)}


def fork(work: str, versions: int, params: int) -> dict[str, Any]:
    """Part 3: bench/fork.py's fork of a `versions`-version run against a full copy (medians of 3)."""
    measured = measure_fork(f"file://{work}/fork", versions, params, repeats=3)
    return {"fork_versions": versions, "fork_run_bytes": int(measured["run_bytes"]),
            "fork_bytes": int(measured["fork_bytes"]),
            "fork_bytes_fraction": round(measured["fork_bytes"] / measured["run_bytes"], 7),
            "fork_s": round(measured["fork_s"], 4), "copy_s": round(measured["copy_s"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=8, help="members of the together-or-in-turn sweeps (even)")
    parser.add_argument("--iterations", type=int, default=2, help="iterations of every member")
    parser.add_argument("--preset", default="tiny", help="the members' size preset (quick: members whose iterations, "
                                                         "not their start-up, take the time)")
    parser.add_argument("--queued", type=int, default=40, help="members of the queued sweep")
    parser.add_argument("--queue-limit", type=int, default=4, help="the queued sweep's max_concurrent")
    parser.add_argument("--versions", type=int, default=100, help="versions of the forked run")
    parser.add_argument("--params", type=int, default=250_000,
                        help="float32 entries of each of the forked run's 3 tensors (bench/fork.py's --params)")
    args = parser.parse_args()
    if args.members < 2 or args.members % 2:
        parser.error(f"--members: an even number >= 2 (seeds x {len(LEARNING_RATES)} learning rates), "
                     f"got {args.members}")
    work = use_private_temp_dir("gymflow-bench-sweep-")
    os.environ["PREFECT_HOME"] = str(work / "prefect")  # before Prefect's import: its settings read it once

    from flows.tooling.orphan_guard import guard
    from flows.tooling.startup import api_for_the_run, start_temporary_api
    from rl_core.config.presets import build_control_config
    from rl_core.config.sweep import load_spec
    from rl_core.runtime.local_ray import actor_cpus, ensure_ray, shutdown_local_ray

    guard()  # the API server and Ray end with this process, even a SIGKILLed one
    api = start_temporary_api()
    options = member_options(args.preset, args.iterations)
    cpus = max(args.members, args.queue_limit) * actor_cpus(build_control_config(**options))
    started = time.perf_counter()
    ensure_ray(cpus)
    ray_start_s = time.perf_counter() - started
    try:
        with api_for_the_run(api):
            cpu = CpuSeconds()
            warmup = timed_sweep(load_spec({"name": "warmup", "grid": {"learning_rate": LEARNING_RATES[:1]},
                                            "options": options,
                                            "store": f"file://{work}/warmup"}), cpu)
            result = {**together_or_in_turn(str(work), args.members, options, cpu),
                      **queue(str(work), args.queued, args.queue_limit, options, cpu)}
    finally:
        shutdown_local_ray()
        if api is not None:
            api.stop()
    result.update(fork(str(work), args.versions, args.params))
    sequential_s, concurrent_s = result["sequential_s"], result["concurrent_s"]
    result.update({
        "concurrent_over_sequential_with_ray_start": round((sequential_s + ray_start_s) / (concurrent_s + ray_start_s),
                                                           3),
        "ray_start_s": round(ray_start_s, 2), "ray_cpus": cpus, "warmup_s": round(warmup.wall_s, 2),
        "timed": "each sweep flow call, start to report; not Ray's start (ray_start_s, once, before every sweep), "
                 "Prefect's API or the warm-up sweep",
    })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
