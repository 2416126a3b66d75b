"""Forking a run: a new run in the same store that starts from a committed version of another run, sharing that
version's checkpoint objects instead of copying them (rl_core/checkpoint/fork.py says how, gc.py why the parent's gc
keeps them).

`plan_fork` reads the parent's run.json, applies the `--set field=value` changes and validates the result once, as the
run's configuration model; it refuses the fields a fork cannot change, naming each with the reason. `make_fork` then
borrows the versions into the new run's checkpoint store and writes the new run's run.json; both record `forked_from`
(the parent run, the version and its manifest's sha256). From then on the fork is an ordinary run: the training
command of its name continues it from the borrowed version, committing its own versions in its own folder.

A fork is a new run, so it may change more than a continued run may (`run_info.CONTINUABLE_FIELDS`): how it learns
from here on (learning rate, epochs, clipping, sampling, iterations, ranks, evaluation) is its own. It may not change
what the borrowed state is: the store, the task and its envs, the model's shape, the algorithm and its learner's
layout (`CONTROL_FIXED`, `AGENT_FIXED`). The seed may change: every random stream is counter-based, drawn from (seed,
stream, iteration, ...), and a version holds no generator state, so a new seed changes only the draws from the fork's
first iteration on ("same point, other luck"); except with randomized dynamics, whose per-env factors are drawn from
the seed while the envs are mid-episode.
"""
from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import fsspec
from pydantic import ValidationError

from rl_core.checkpoint import CheckpointError, CheckpointStore
from rl_core.checkpoint.objects import StoreObjects
from rl_core.config.agent import AgentRunConfig, AnyRunConfig, parse_run_config
from rl_core.config.common import ConfigError, StorageConfig, format_validation_error
from rl_core.config.control import ControlRunConfig, migrate_flat_config
from rl_core.config.launch_options import agent_launch_options, launch_options
from rl_core.data.run_info import ENV_COUNT, dotted_fields, read_run_json
from rl_core.data.run_layout import RunLayout

STORE_REASON = "a fork lives in its parent's store: its first version borrows the parent's checkpoint objects in place"
CONTROL_FIXED = {
    "storage.url": STORE_REASON,
    "env.name": "the task: the version holds its envs' states and a policy sized to its observations and actions",
    "env.module": "it registers the task whose envs the version holds",
    "env.randomization": "each env's dynamics, and the version's envs are mid-episode",
    ENV_COUNT: "the version holds every env's state (the envs may be split over other workers, keeping their number)",
    "algorithm.name": "the version holds this algorithm's learner state",
    "algorithm.hidden": "the policy's layer widths: the version's weights have these shapes",
    "algorithm.log_std_init": "it only builds version 0; the version holds the log std the run has learned",
}
"""A control run's fields a fork refuses to change, with why."""
AGENT_FIXED = {
    "storage.url": STORE_REASON,
    "env.name": "the task: its problems and, for a built model, the alphabet that is the model's vocabulary",
    "env.module": "it registers the task",
    "model": "the policy the version holds (its files, sizes and adapters)",
    "sft": "it only makes version 0, the warm start every later version has trained on",
    "algorithm.name": "the version holds this algorithm's learner state",
}
"""An agent run's fields (or whole sections) a fork refuses to change, with why."""


@dataclass(frozen=True)
class ForkPlan:
    """A validated fork, nothing written yet: the new run's config and what it starts from."""

    cfg: AnyRunConfig
    parent: str
    version: int
    parent_checkpoints: str
    rests_on: dict[str, str] | None


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """`field=value` pairs as {field: value}; a value is read as JSON when it parses (numbers, true, null, lists),
    else kept as text. A field is dotted (`algorithm.learning_rate`) or a launch option's name (`num_workers`)."""
    out: dict[str, Any] = {}
    for item in sets:
        field, sep, text = item.partition("=")
        if not sep or not field.strip():
            raise ConfigError(f"--set {item!r}: expected field=value, e.g. algorithm.learning_rate=1e-4")
        try:
            out[field.strip()] = json.loads(text)
        except ValueError:
            out[field.strip()] = text
    return out


def plan_fork(store: str, parent: str, new: str, version: int | None, changes: dict[str, Any]) -> ForkPlan:
    """Validate a fork of run `parent` (at `version`, None: its newest committed version) under `store` as run `new`
    with `changes` ({dotted field: value}); ConfigError naming every refused or invalid field."""
    store = StorageConfig(url=store).url
    parent_layout, new_layout = RunLayout(f"{store.rstrip('/')}/{parent}"), RunLayout(f"{store.rstrip('/')}/{new}")
    fs, path = fsspec.core.url_to_fs(parent_layout.run_info)
    try:
        stored = read_run_json(fs, path, parent_layout.run_info)
    except FileNotFoundError:
        raise ConfigError(f"no run {parent!r} under {store} ({path} does not exist); check RUN and --store") from None
    new_fs, new_path = fsspec.core.url_to_fs(new_layout.run_info)
    if new_fs.exists(new_path):
        raise ConfigError(f"run {new!r} exists under {store} ({new_path}); a fork starts a new run: choose another "
                          "name")
    if "run_name" in changes:
        raise ConfigError(f"--set run_name: the fork's name is {new!r}, the command's NEW")
    checkpoints = CheckpointStore(parent_layout.checkpoints)
    committed = checkpoints.versions()
    version = committed[-1] if version is None and committed else version
    if version not in committed:
        raise ConfigError(f"run {parent!r} has no committed version {version} (committed: "
                          f"{', '.join(map(str, committed)) or 'none'}); fork one of those")
    _refuse_unless_restorable(checkpoints, parent, version, version)
    before = _stored_config(stored["config"], store, parent)
    cfg = _validated(_changed(before, {**_dotted_names(changes, before), "run_name": new}))
    refused = fork_refusals(before, cfg.model_dump(mode="json"), version)
    if refused:
        raise ConfigError("a fork cannot change:\n" + "\n".join(f"  {field}: {why}" for field, why in refused.items()))
    return ForkPlan(cfg, parent, version, parent_layout.checkpoints, stored.get("rests_on"))


def fork_refusals(before: dict[str, Any], after: dict[str, Any], version: int) -> dict[str, str]:
    """The fields of the config dict `after` (a fork at `version`) that `before` (its parent's) must keep, with why;
    empty when the fork is allowed."""
    agent = before.get("flow") == "agent"
    sections = AgentRunConfig.SECTIONS if agent else ControlRunConfig.SECTIONS
    was, now = dotted_fields(before, sections), dotted_fields(after, sections)
    if not agent:
        was[ENV_COUNT] = before["env"]["num_workers"] * before["env"]["envs_per_worker"]
        now[ENV_COUNT] = after["env"]["num_workers"] * after["env"]["envs_per_worker"]
    changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    fixed = AGENT_FIXED if agent else CONTROL_FIXED
    refused = {}
    for field in changed:
        rule = next((k for k in fixed if field == k or field.startswith(k + ".")), None)
        if rule is not None:
            refused[field] = f"{fixed[rule]} (was {was.get(field)!r}, now {now.get(field)!r})"
    if not agent and "seed" in changed and now.get("env.randomization") is not None:
        refused["seed"] = ("each env's randomized dynamics are drawn from the seed, and the version's envs are "
                           f"mid-episode (was {was['seed']!r}, now {now['seed']!r})")
    if agent and (was.get("algorithm.beta", 0) > 0) != (now.get("algorithm.beta", 0) > 0):
        refused["algorithm.beta"] = ("the version holds the frozen reference exactly when beta > 0: a fork may change "
                                     f"beta, not turn the reference on or off (was {was.get('algorithm.beta')!r}, now "
                                     f"{now.get('algorithm.beta')!r})")
    if now["iterations"] <= version:
        refused["iterations"] = (f"the fork starts at version {version} ({version} iterations done) and would train "
                                 f"none (iterations {now['iterations']}): ask for more, --set iterations=N")
    return refused


def make_fork(plan: ForkPlan, versions: list[int]) -> dict[str, Any]:
    """Borrow `versions` (the plan's version, and any older one the fork's run reads), each verified first, into the
    new run's checkpoint store, then write its run.json (created exclusively: it makes the run exist). Returns the new
    run's `forked_from` and versions.

    A process killed between the two leaves a fork's checkpoints without a run.json; running the same fork again
    finds them and writes the run.json."""
    cfg, layout = plan.cfg, RunLayout(plan.cfg.run_url)
    fork = CheckpointStore(layout.checkpoints)
    if not fork.versions():
        parent = CheckpointStore(plan.parent_checkpoints)
        for version in versions:  # the plan's own is verified; an older one the fork reads may not restore
            if version != plan.version:
                _refuse_unless_restorable(parent, plan.parent, version, plan.version)
        meta = {"config": cfg.model_dump(mode="json"), "seed": cfg.seed}  # what the fork is, as its commits say
        parent.fork(layout.checkpoints, versions, meta=meta, lineage={"run": plan.parent})
    elif not _forked_already(fork, plan, versions):
        raise ConfigError(f"{layout.checkpoints} holds checkpoint versions {fork.versions()} that are not this fork's "
                          f"(versions {versions} of run {plan.parent!r}); delete {layout.run_url} and fork again")
    forked_from = fork.meta(plan.version)["forked_from"]
    record = {"incarnation": uuid.uuid4().hex, "created": datetime.now(timezone.utc).isoformat(),
              "config": cfg.model_dump(mode="json"), "forked_from": forked_from}
    if plan.rests_on:
        record["rests_on"] = plan.rests_on
    run = StoreObjects(layout.run_url)
    run.create_exclusive(f"{run.root}/run.json", json.dumps(record, indent=2).encode())
    return {"run": cfg.run_name, "run_url": cfg.run_url, "forked_from": forked_from, "versions": versions}


def _refuse_unless_restorable(checkpoints: CheckpointStore, parent: str, version: int, forked: int) -> None:
    """CheckpointError naming `version` of run `parent` (and the chunk, tensor or manifest at fault) when it fails
    verification: a fork at version `forked` reads it, so the fork's run could not start."""
    errors = checkpoints.verify(version)["errors"]
    if errors:
        which = "it" if version == forked else f"version {forked}, which reads it,"
        raise CheckpointError(f"version {version} of run {parent!r} does not restore, so {which} cannot be forked: "
                              f"{errors[version]}")


def _forked_already(fork: CheckpointStore, plan: ForkPlan, versions: list[int]) -> bool:
    """Whether an earlier run of this same fork borrowed these versions and stopped before writing the run.json."""
    if fork.versions() != versions:
        return False
    return all(fork.meta(v).get("forked_from", {}).get("run") == plan.parent for v in versions)


def _stored_config(config: dict[str, Any], store: str, name: str) -> dict[str, Any]:
    """The parent's stored config as a dict of today's layout, with the store as given (it may have moved)."""
    values = copy.deepcopy(config if config.get("flow") == "agent" else migrate_flat_config(config))
    values.setdefault("storage", {})["url"] = store
    return parse_run_config(values).model_dump(mode="json") | {"run_name": name}


def _dotted_names(changes: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`changes` with each launch option's name (`num_workers`, as `gymflow train` spells it) replaced by its field's
    dotted name (`env.num_workers`); a dotted name or a run field stays as it is."""
    table = agent_launch_options() if values.get("flow") == "agent" else launch_options()
    paths = {name: ".".join(o.path) for name, o in table.items() if o.path}
    return {field if "." in field or field in values else paths.get(field, field): value
            for field, value in changes.items()}


def _changed(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`values` with each dotted field of `changes` set; a change naming a whole section is refused."""
    out = copy.deepcopy(values)
    for field, value in changes.items():
        *sections, leaf = field.split(".")
        target = out
        for part in sections:
            if not isinstance(target.get(part), dict):
                raise ConfigError(f"--set {field}: {part!r} is not a section of the run's configuration; sections: "
                                  f"{', '.join(k for k, v in values.items() if isinstance(v, dict))}")
            target = target[part]
        if isinstance(target.get(leaf), dict):
            raise ConfigError(f"--set {field}: {field!r} is a section; set its fields one by one "
                              f"({', '.join(f'{field}.{k}' for k in target[leaf])})")
        target[leaf] = value
    return out


def _validated(values: dict[str, Any]) -> AnyRunConfig:
    """The fork's config, checked once by the run's own model (an unknown field is refused by name)."""
    try:
        return parse_run_config(values)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, "invalid fork configuration:")) from None
