"""run.json: who a run is. Created once; a later start with the same name must match its configuration.

The incarnation id tells apart two runs that share a name because the first was deleted: cache keys
include it, so a new run never reuses cached step results that point at deleted files.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import fsspec

from rl_core.config.agent import AgentRunConfig, AnyRunConfig
from rl_core.config.common import ConfigError
from rl_core.config.control import ControlRunConfig, migrate_flat_config
from rl_core.data.run_layout import RunLayout

# Fields a continued run may change: how far to go and how much to evaluate, not what is trained. Also how its
# envs are split over env workers, as long as their number stays (checkpoints hold every env's state in global
# env order, so any split restores them): a run can continue on more or fewer workers.
CONTINUABLE_FIELDS = {"iterations", "eval_episodes", "eval_video", "storage.url", "storage.epoch_checkpoint_every",
                      "storage.epoch_checkpoint_min_s", "collective_timeout_s", "env.num_workers",
                      "env.envs_per_worker"}
ENV_COUNT = "env.num_workers x env.envs_per_worker"
# An agent run may also change its evaluation and how many workers simulate for it, not what it trains or samples.
AGENT_CONTINUABLE_FIELDS = {"iterations", "eval_problems", "storage.url", "storage.epoch_checkpoint_every",
                            "storage.epoch_checkpoint_min_s", "collective_timeout_s", "env.num_workers"}


class RunInfoError(RuntimeError):
    """A run's run.json exists but cannot be read as one."""


def read_run_json(fs: fsspec.AbstractFileSystem, path: str, url: str) -> dict:
    """The stored run.json; a clear error naming it when it is truncated or not a run's (FileNotFoundError passes:
    callers say what a missing one means)."""
    blob = fs.cat_file(path)
    try:
        stored = json.loads(blob)
        if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict) or "incarnation" not in stored:
            raise ValueError("expected an object with 'incarnation' and 'config'")
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise RunInfoError(f"{url} is not a readable run.json ({len(blob)} bytes; {type(err).__name__}: {err}): it "
                           "records the run's configuration and incarnation. Restore it from a backup, or start a new "
                           "--run-name; the run's checkpoints are untouched (gymflow ckpt verify <run>/checkpoints)"
                           ) from None
    return stored


@dataclass(frozen=True)
class RunInfo:
    incarnation: str
    created: str
    is_new: bool


def dotted_fields(values: dict, sections: tuple[str, ...], prefix: str = "") -> dict:
    """A nested config dict as {"env.name": ...}: sections' fields are compared one by one."""
    out: dict = {}
    for key, value in values.items():
        if isinstance(value, dict) and key in sections and not prefix:
            out.update(dotted_fields(value, sections, f"{key}."))
        else:
            out[prefix + key] = value
    return out


def _comparable(cfg: dict) -> dict:
    """The fields a continued run must keep, dotted, from a stored (any layout) or current config dict."""
    if cfg.get("flow") == "agent":
        fields = dotted_fields(cfg, AgentRunConfig.SECTIONS)
        return {k: v for k, v in fields.items() if k not in AGENT_CONTINUABLE_FIELDS}
    nested = migrate_flat_config(cfg)
    fields = {k: v for k, v in dotted_fields(nested, ControlRunConfig.SECTIONS).items() if k not in CONTINUABLE_FIELDS}
    fields[ENV_COUNT] = nested["env"]["num_workers"] * nested["env"]["envs_per_worker"]
    return fields


def load_run_config(store: str, run_name: str) -> ControlRunConfig:
    """The configuration run ``run_name`` under ``store`` was started with (its run.json), with ``store`` as
    given (the run may have been moved since), for steps that act on an existing run."""
    located = ControlRunConfig.model_validate({"run_name": run_name, "storage": {"url": store}, "iterations": 1})
    url = RunLayout(located.run_url).run_info
    fs, path = fsspec.core.url_to_fs(url)
    try:
        stored = read_run_json(fs, path, url)
    except FileNotFoundError:
        raise ConfigError(f"no run {run_name!r} under {located.storage.url} ({path} does not exist); "
                          "check --run-name and --store") from None
    if stored["config"].get("flow") == "agent":
        raise ConfigError(f"run {run_name!r} under {located.storage.url} is an agent run (train-agent): its held-out "
                          "evaluation is the `evaluate` step of its flow (the summary's accuracy_final, and "
                          "<run>/checkpoints' versions); this command evaluates control runs")
    config = migrate_flat_config(stored["config"])
    storage = {**config.get("storage", {}), "url": located.storage.url}
    return ControlRunConfig.model_validate({**config, "storage": storage})


def open_run(cfg: AnyRunConfig, rests_on: dict[str, str] | None = None) -> RunInfo:
    """Create the run's run.json, or check that an existing one was made with a compatible config. `rests_on`: what
    the run's versions need from outside the store (`Algorithm.rests_on`: a LoRA run's frozen base model, by
    digest), recorded by a new run and required unchanged by a continued one."""
    layout = RunLayout(cfg.run_url)
    fs, path = fsspec.core.url_to_fs(layout.run_info)
    current = cfg.model_dump(mode="json")
    if fs.exists(path):
        stored = read_run_json(fs, path, layout.run_info)
        before, now = _comparable(stored["config"]), _comparable(current)
        changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
        if changed:
            diffs = "; ".join(f"{k}: was {before.get(k)!r}, now {now.get(k)!r}" for k in changed)
            raise ConfigError(f"run {cfg.run_name!r} at {cfg.run_url} exists with another configuration ({diffs}); "
                              "continue it with the same settings or start a new --run-name")
        recorded = stored.get("rests_on") or {}
        moved = sorted(k for k in recorded if recorded[k] != (rests_on or {}).get(k))
        if moved:
            diffs = "; ".join(f"{k}: was {recorded[k]}, now {(rests_on or {}).get(k)}" for k in moved)
            raise ConfigError(f"run {cfg.run_name!r} at {cfg.run_url} was trained on other files ({diffs}); its "
                              "versions hold only what trained, so continue it with the files it started from or "
                              "start a new --run-name")
        return RunInfo(stored["incarnation"], stored["created"], is_new=False)
    info = RunInfo(uuid.uuid4().hex, datetime.now(timezone.utc).isoformat(), is_new=True)
    fs.makedirs(fs._parent(path), exist_ok=True)
    record = {"incarnation": info.incarnation, "created": info.created, "config": current}
    if rests_on:
        record["rests_on"] = rests_on
    fs.pipe_file(path, json.dumps(record, indent=2).encode())
    return info
