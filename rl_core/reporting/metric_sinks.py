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
import io
import json
import math
import os
import socket
import time
from typing import Any, Protocol

import fsspec

from rl_core.data import RunLayout

Record = dict[str, Any]
SINKS_VARIABLE = "GYMFLOW_METRIC_SINKS"
PART_BYTES = 64 << 10
"""A TensorBoard event file's size at which the next record starts another (about 100 iterations of a control run's
scalars): each record writes its file whole again, so this bounds what one record uploads."""


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
    """TensorBoard scalars of every numeric field, at step = iteration, in event files under `<run>/tensorboard`.

    Each record goes straight into the run's folder, on any fsspec store, as `RunMetricsSink`'s do: its event file is
    written whole again with the record added, until it holds `PART_BYTES`; the next record starts another file. Why
    not TensorBoard's own writer: it appends to a local file, so a remote store's events waited in a temp folder until
    `close`, and a run killed before then left that folder behind and never stored its scalars. Here nothing is kept
    outside the run's folder, and a killed run's scalars are stored up to its last record.
    """

    def __init__(self, run_url: str) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2  # imports tensorboard: only where a run logs
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary, self._record_writer = event_pb2.Event, summary_pb2.Summary, RecordWriter
        self._fs, self._folder = fsspec.core.url_to_fs(RunLayout(run_url).tensorboard)
        self._fs.makedirs(self._folder, exist_ok=True)
        # TensorBoard's own file name (its start, host, process), then the part's number, zero-padded: TensorBoard
        # reads a folder's event files in name order.
        self._name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self._part = -1
        self._new_part()

    def _new_part(self) -> None:
        self._part += 1
        self._buffer = io.BytesIO()
        self._records = self._record_writer(self._buffer)
        self._records.write(self._event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())

    def write(self, record: Record) -> None:
        values = [self._summary.Value(tag=_tag(name), simple_value=value) for name, value in record.items()
                  if name != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value)]
        event = self._event(wall_time=time.time(), step=int(record["iteration"]), summary=self._summary(value=values))
        self._records.write(event.SerializeToString())
        self._fs.pipe_file(f"{self._folder}/{self._name}.{self._part:06d}", self._buffer.getvalue())
        if self._buffer.tell() >= PART_BYTES:
            self._new_part()

    def close(self) -> None:
        pass  # every record is stored as it comes


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
