"""Population-based training, the sweep's `pbt` strategy: the members train in generations of `pbt.interval`
iterations; after each, the bottom quantile forks (zero-copy) from the top and perturbs its mutable fields.

    for each generation g, ending at version e_g (g+1 intervals; the last one at the run's iterations):
        every member's current run trains to e_g and is evaluated (subflows, at most max_concurrent at a time;
        `stop_after` e_g, so its schedules span all its iterations as an uninterrupted run's do)
        unless it is the last: decide (rl_core.population.pbt, seeded by the sweep and g)
                               each exploiting member forks its source's version e_g as the run <member>-g<g+1>,
                               with its own seed and the perturbed values; that run is its current run from then on

Everything decided is recorded before it is acted on, under `<sweep>/pbt/`: each member's result in a generation
(`g<g>/<member>.json`) and each generation's decision (`g<g>.json`). Run again after a kill, the sweep replays the
records: it skips the members that reached a generation's end, continues the others from their newest version,
reads the decision instead of drawing it, and makes only the forks that are missing. Each step then does what an
undisturbed sweep does, so the population ends bit-identical to it.

A member that exploits takes its source's launch options (what its weights were trained with) and changes only its
seed (its own luck from here on: counter-based streams make that a clean change), the mutable fields and how far it
trains; a fork refuses anything else (`rl_core.data.run_fork`).
"""
from __future__ import annotations

import hashlib
from typing import Any

import fsspec

from flows.sweep_member import read_record, train_members, write_record
from flows.tooling.fork import borrow
from rl_core.config.common import ConfigError
from rl_core.config.sweep import Member, SweepSpec
from rl_core.data import RunLayout
from rl_core.data.run_fork import plan_fork
from rl_core.data.run_info import read_run_json
from rl_core.population.pbt import decide

Slot = dict[str, Any]
"""A member's current run: {"run": its name, "options": its launch options, "values": its mutable fields}."""


def sweep_seed(name: str) -> int:
    """The seed of a sweep's decisions: its name's digest (the same sweep decides the same on any machine)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=7).digest(), "big")


def generation_ends(interval: int, iterations: int) -> list[int]:
    """The version each generation ends at: every `interval` iterations, the last at `iterations`."""
    return [*range(interval, iterations, interval), iterations]


def train_population(spec: SweepSpec, members: list[Member], log: Any) -> tuple[
        dict[str, dict[str, Any] | None], dict[str, str], list[dict[str, Any]]]:
    """Train the population through its generations. Returns its members' last results (None where a member has
    none), the members that failed (name -> why: the sweep stops at that generation) and the generations' records."""
    assert spec.pbt is not None
    ends = generation_ends(spec.pbt.interval, members[0].config.iterations)
    slots = {m.name: {"run": m.name, "options": m.options, "values": spec.mutable_values(m.config)} for m in members}
    by_name = {m.name: m for m in members}
    results: dict[str, dict[str, Any] | None] = {}
    records: list[dict[str, Any]] = []
    for generation, end in enumerate(ends):
        results, failed = train_generation(spec, slots, generation, end)
        if failed:
            return results, failed, records
        record = {"generation": generation, "version": end,
                  "members": {m: {"run": slots[m]["run"], "values": slots[m]["values"], **results[m]}
                              for m in slots}}
        if end < ends[-1]:
            record["exploits"] = decision(spec, generation, record)
            for exploit in record["exploits"]:
                slots[exploit["member"]] = fork_member(spec, by_name[exploit["member"]], slots[exploit["source"]],
                                                       exploit["values"], generation, end)
            log.info("sweep %s, generation %d (version %d): %s", spec.name, generation, end,
                     "; ".join(f"{e['member']} <- {e['source']} {e['values']}" for e in record["exploits"]))
        records.append(record)
    return results, {}, records


def train_generation(spec: SweepSpec, slots: dict[str, Slot], generation: int, end: int) -> tuple[
        dict[str, dict[str, Any] | None], dict[str, str]]:
    """Every member's current run trained to version `end` (the recorded ones skipped); their results, and the
    members that failed with why."""
    page = f"{spec.page}/pbt/g{generation}"
    results = {m: read_record(f"{page}/{m}.json") for m in slots}
    done, failed = train_members(spec, {m: (s["run"], {**s["options"], "stop_after": end}) for m, s in slots.items()
                                        if results[m] is None}, page)
    return {**results, **done}, failed


def decision(spec: SweepSpec, generation: int, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The generation's exploits: the recorded ones, or drawn now and recorded before any is acted on."""
    url = f"{spec.page}/pbt/g{generation}.json"
    recorded = read_record(url)
    if recorded is not None:
        return recorded["exploits"]
    assert spec.pbt is not None
    members = record["members"]
    exploits = decide(sweep_seed(spec.name), generation, {m: r["score"] for m, r in members.items()},
                      {m: r["values"] for m, r in members.items()}, spec.pbt.quantile, spec.pbt.mutable,
                      spec.pbt.factors)
    chosen = [{"member": e.member, "source": e.source, "values": e.values} for e in exploits]
    write_record(url, {"generation": generation, "version": record["version"], "exploits": chosen})
    return chosen


def fork_member(spec: SweepSpec, member: Member, source: Slot, values: dict[str, Any], generation: int,
                version: int) -> Slot:
    """`member`'s next run: a zero-copy fork of `source`'s run at `version` (made now, unless an earlier sweep run
    made it), with the member's seed and the perturbed `values`. Returns the member's new slot."""
    run = f"{member.name}-g{generation + 1}"
    options = spec.with_values({**source["options"], "run_name": run, "seed": member.seed}, values)
    layout = RunLayout(f"{spec.store.rstrip('/')}/{run}")
    try:
        made = read_run_json(*fsspec.core.url_to_fs(layout.run_info), layout.run_info)
    except FileNotFoundError:
        made = None
    if made is None:
        changes = {("algorithm." if k in spec.algorithm_fields() else "") + k: v for k, v in values.items()}
        plan = plan_fork(spec.store, source["run"], run, version, {**changes, "seed": member.seed})
        borrow(plan)
    elif (made.get("forked_from") or {}).get("run") != source["run"] or made["forked_from"]["version"] != version:
        raise ConfigError(f"run {run} exists under {spec.store} and is not the fork of {source['run']}@{version} "
                          f"this sweep decided (it records forked_from {made.get('forked_from')}); delete it or name "
                          "a new sweep")
    return {"run": run, "options": options, "values": values}
