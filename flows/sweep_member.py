"""Members of a sweep trained as subflows, at most `max_concurrent` at a time, for both strategies (flows/sweep.py,
flows/sweep_pbt.py), and the JSON records a sweep keeps under its page (each written whole or not at all)."""
from __future__ import annotations

import json
from typing import Any

import fsspec
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from rl_core.checkpoint.objects import StoreObjects
from rl_core.config.sweep import SweepSpec

SCORE = {"control": "final_return", "agent": "accuracy_final"}
"""A member's score: its run's final evaluation (deterministic episodes, held-out problems)."""
KEPT = ("policy_sha256", "iterations", "run_dir")


@task(name="sweep_member", cache_policy=NO_CACHE, task_run_name="{name}")
def sweep_member(kind: str, name: str, options: dict[str, Any], record: str) -> dict[str, Any]:
    """Train run `name` to its iterations as a subflow (a continued run where it has versions) and record its result
    at `record` as soon as it has one. No retries here: the member's own steps retry, and a member that fails is
    resumed by the next sweep run."""
    if kind == "agent":
        from flows.train_agent import train_agent as member_flow
    else:
        from flows.train_control import train_control as member_flow
    summary = member_flow.with_options(flow_run_name=name)(**options)
    result = {"score": summary[SCORE[kind]], **{k: summary[k] for k in KEPT}}
    write_record(record, result)
    return result


def train_members(spec: SweepSpec, runs: dict[str, tuple[str, dict[str, Any]]], page: str) -> tuple[
        dict[str, dict[str, Any]], dict[str, str]]:
    """Train each member's run (member -> (run name, launch options)) at most `max_concurrent` at a time, each result
    recorded at `<page>/<member>.json`; returns the results of those that completed and, for the others, why not."""
    with ThreadPoolTaskRunner(max_workers=spec.max_concurrent) as pool:
        futures = {member: pool.submit(sweep_member, {"kind": spec.flow, "name": run, "options": options,
                                                      "record": f"{page}/{member}.json"})
                   for member, (run, options) in runs.items()}
        wait(list(futures.values()))
    done = {member: future.result() for member, future in futures.items() if future.state.is_completed()}
    return done, {member: future.state.message or future.state.name for member, future in futures.items()
                  if member not in done}


def read_record(url: str) -> Any | None:
    """The JSON record at `url`, None where there is none yet."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def write_record(url: str, value: Any) -> None:
    """Write a JSON record."""
    put_whole(url, json.dumps(value, indent=1).encode())


def put_whole(url: str, data: bytes) -> None:
    """Write a file of the sweep's page whole or not at all (a sweep killed mid-write leaves the old one or none)."""
    folder, _, name = url.rpartition("/")
    objects = StoreObjects(folder)
    objects.put_whole(f"{objects.root}/{name}", data)
