"""One small logger interface for a run's metrics, and its sinks.

A flow hands one record per iteration (a flat dict of numbers, with its `iteration`) to a `MetricsLogger`, which
passes it to every sink. Two sinks come built in: `RunMetricsSink` keeps each record as JSON in the run's folder
(the source of the learning curve and the metrics table, on any fsspec store, so a resumed run still reports every
iteration), and `TensorBoardSink` writes TensorBoard scalars. Another sink (MLflow, W&B...) is any object with
`write(record)` and `close()`: name its factory in `GYMFLOW_METRIC_SINKS` (`module:callable`, comma-separated;
called with the run's URL and name) and every run adds it, without touching the flows.
"""
from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path
from typing import Any, Protocol

import fsspec

from rl_core.data import RunLayout
from rl_core.private_temp import PrivateTempDir

Record = dict[str, Any]
SINKS_VARIABLE = "GYMFLOW_METRIC_SINKS"


class MetricSink(Protocol):
    """Where iteration records go."""

    def write(self, record: Record) -> None: ...

    def close(self) -> None: ...


class MetricsLogger:
    """Fans each record out to every sink; `close` closes them all (each once)."""

    def __init__(self, sinks: list[MetricSink]) -> None:
        self.sinks = list(sinks)

    def log(self, record: Record) -> None:
        if "iteration" not in record:
            raise ValueError(f"a metrics record needs its 'iteration' (got keys {sorted(record)})")
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()


def _json_number(value: Any) -> Any:
    """NaN and infinities as None: JSON has no such numbers, and a chart or table shows a gap instead."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunMetricsSink:
    """Each record as `<run>/metrics/<iteration>.json`: one object per iteration, so a retried iteration overwrites
    its own record and nothing is appended in place (object stores cannot append)."""

    def __init__(self, run_url: str) -> None:
        self._layout = RunLayout(run_url)
        self._fs, _ = fsspec.core.url_to_fs(run_url)

    def write(self, record: Record) -> None:
        _, path = fsspec.core.url_to_fs(self._layout.metrics(int(record["iteration"])))
        self._fs.makedirs(self._fs._parent(path), exist_ok=True)
        self._fs.pipe_file(path, json.dumps({k: _json_number(v) for k, v in record.items()}).encode())

    def close(self) -> None:
        pass


def read_metrics(run_url: str) -> list[Record]:
    """Every stored iteration record of the run, in iteration order ([] for a run with none yet)."""
    fs, path = fsspec.core.url_to_fs(RunLayout(run_url).metrics_dir)
    if not fs.exists(path):
        return []
    files = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".json"))
    return [json.loads(blob) for blob in fs.cat(files).values()] if files else []


def _tag(name: str) -> str:
    """Scalars grouped as TensorBoard shows them: step seconds under time/, the rest under the run's own group."""
    seconds = name.endswith("_s") and not name.endswith("_per_s")
    return f"time/{name}" if seconds else f"train/{name}"


class TensorBoardSink:
    """TensorBoard scalars of every numeric field, at step = iteration, under `<run>/tensorboard`.

    The writer needs a local directory: for a local store it writes there directly; for a remote one (s3://...) it
    writes to a temporary directory and copies the event file into the run's folder on `close`.
    """

    def __init__(self, run_url: str, flush_secs: int = 10) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # imports tensorboard: only where a run logs
        )

        url = RunLayout(run_url).tensorboard
        fs, path = fsspec.core.url_to_fs(url)
        self._remote = None if "file" in fs.protocol else (fs, path)
        # A remote store's events wait in a temp folder: removed by close or at exit (after a kill, by the next sink).
        self._temp = PrivateTempDir("gymflow-tb-") if self._remote else None
        self._logdir = str(self._temp.path) if self._temp else path
        Path(self._logdir).mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(log_dir=self._logdir, flush_secs=flush_secs)

    def write(self, record: Record) -> None:
        step = int(record["iteration"])
        for name, value in record.items():
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            if name != "iteration" and numeric and math.isfinite(value):
                self._writer.add_scalar(_tag(name), value, step)

    def close(self) -> None:
        self._writer.close()
        if self._remote:
            fs, path = self._remote
            fs.makedirs(path, exist_ok=True)
            for event_file in Path(self._logdir).iterdir():
                fs.put_file(str(event_file), f"{path}/{event_file.name}")
            self._temp.close()


def configured_sinks(run_url: str, run_name: str) -> list[MetricSink]:
    """The sinks `GYMFLOW_METRIC_SINKS` names (`module:callable,...`), each made by `callable(run_url, run_name)`;
    a name that does not resolve is an error naming it, at the run's start."""
    sinks = []
    for spec in filter(None, (part.strip() for part in os.environ.get(SINKS_VARIABLE, "").split(","))):
        module_name, _, attribute = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(f"{SINKS_VARIABLE}: {spec!r} does not name a sink factory (module:callable): "
                             f"{type(err).__name__}: {err}") from err
        sinks.append(factory(run_url, run_name))
    return sinks
