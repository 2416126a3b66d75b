"""The runs under a store, as a terminal user lists them (`gymflow runs`): each run's kind, environment, newest
version, iterations done of those asked for, last score, size and, for a fork, the run and version it started from,
from its run.json, checkpoints and metrics."""
from __future__ import annotations

import json
from typing import Any

import fsspec

from rl_core.checkpoint import CheckpointStore
from rl_core.config.common import ConfigError
from rl_core.data.run_info import read_run_json
from rl_core.data.run_layout import RunLayout


class StoreUnreadable(RuntimeError):
    """The store's URL is malformed or its backend cannot be reached."""


def _last_record(fs: fsspec.AbstractFileSystem, metrics_dir: str) -> dict[str, Any]:
    if not fs.exists(metrics_dir):
        return {}
    files = sorted(p for p in fs.ls(metrics_dir, detail=False) if p.endswith(".json"))
    return json.loads(fs.cat_file(files[-1])) if files else {}


def describe_run(store_url: str, name: str) -> dict[str, Any]:
    """One run's row (see the module's docstring)."""
    layout = RunLayout(f"{store_url.rstrip('/')}/{name}")
    fs, run_json = fsspec.core.url_to_fs(layout.run_info)
    stored = read_run_json(fs, run_json, layout.run_info)
    config = stored["config"]
    agent = config.get("flow") == "agent"
    env = config["env"]["name"] if isinstance(config.get("env"), dict) else config.get("env")
    last = _last_record(fs, fsspec.core.url_to_fs(layout.metrics_dir)[1])
    _, run_path = fsspec.core.url_to_fs(layout.run_url)
    return {
        "run": name,
        "kind": "agent" if agent else "control",
        "env": env,
        "created": stored["created"][:19],
        "latest_version": CheckpointStore(layout.checkpoints).latest(),
        "iterations": config.get("iterations"),
        "score_name": "accuracy" if agent else "mean_return",
        "score": last.get("accuracy" if agent else "mean_return"),
        "forked_from": stored.get("forked_from"),
        "bytes": fs.du(run_path),
    }


def list_runs(store_url: str) -> list[dict[str, Any]]:
    """Every run under `store_url` (folders holding a run.json), by name; a clear error naming the URL when the
    store cannot be read."""
    try:
        fs, root = fsspec.core.url_to_fs(store_url)
        if not fs.exists(root):
            return []
        folders = sorted(p for p in fs.ls(root, detail=False) if fs.isdir(p))
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in folders if fs.exists(f"{p.rstrip('/')}/run.json")]
    except (ValueError, ImportError) as err:  # an unknown scheme, a backend not installed
        raise ConfigError(f"store {store_url!r}: {err}") from err
    except OSError as err:
        raise StoreUnreadable(f"store {store_url!r} cannot be read: {type(err).__name__}: {err}") from err
    return [describe_run(store_url, name) for name in names]
