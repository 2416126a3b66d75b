"""A run's reporting library: metrics through pluggable sinks (the run's folder, TensorBoard, one of your own), the
learning-curve PNG and the checkpoint lineage rows."""
from __future__ import annotations

import io
import math

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore
from rl_core.reporting import (
    MetricsLogger,
    RunMetricsSink,
    TensorBoardSink,
    checkpoint_rows,
    learning_curve_png,
    read_metrics,
)


def _records(n: int = 5) -> list[dict]:
    return [{"iteration": i, "env_steps_total": 128 * i, "mean_return": -10.0 + 3 * i, "steps_per_s": 900.0 + i,
             "approx_kl": 0.01 * i, "train_s": 0.1} for i in range(1, n + 1)]


class ListSink:
    """A sink of one's own: anything with write() and close()."""

    def __init__(self) -> None:
        self.records, self.closed = [], 0

    def write(self, record: dict) -> None:
        self.records.append(record)

    def close(self) -> None:
        self.closed += 1


def _scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logdir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_records_reach_every_sink_and_read_back_in_iteration_order(tmp_path, scheme) -> None:
    run_url = f"file://{tmp_path}/run" if scheme == "file" else f"memory://reporting-{tmp_path.name}/run"
    own = ListSink()
    logger = MetricsLogger([RunMetricsSink(run_url), TensorBoardSink(run_url), own])
    for record in reversed(_records()):  # order of arrival does not matter
        logger.log(record)
    logger.log({**_records()[1], "mean_return": math.nan})  # a retried iteration overwrites its record
    logger.close()
    logger.close()
    assert own.closed == 1 and len(own.records) == 6
    stored = read_metrics(run_url)
    assert [r["iteration"] for r in stored] == [1, 2, 3, 4, 5] and stored[1]["mean_return"] is None
    fs, path = fsspec.core.url_to_fs(f"{run_url}/tensorboard")
    local = tmp_path / "tb"
    fs.get(path, str(local), recursive=True)
    scalars = _scalars(str(local if scheme == "memory" else tmp_path / "run" / "tensorboard"))
    assert sorted(scalars["train/mean_return"]) == [(i, -10.0 + 3 * i) for i in range(1, 6)]  # NaN is left out
    assert {"train/approx_kl", "train/steps_per_s", "train/env_steps_total", "time/train_s"} <= set(scalars)


def test_tensorboard_scalars_are_stored_as_they_come_in_parts_and_nothing_is_staged(tmp_path, monkeypatch) -> None:
    """Each record is in the run's folder at once (a run killed after it keeps it); a full event file is left and the
    next record starts another; TensorBoard reads them all as one run; the temp dir is never used."""
    import tempfile

    from rl_core.reporting import metric_sinks

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(metric_sinks, "PART_BYTES", 600)  # a part of a few records
    run_url = f"memory://reporting-parts-{tmp_path.name}/run"
    fs, path = fsspec.core.url_to_fs(f"{run_url}/tensorboard")
    sink = TensorBoardSink(run_url)
    records = _records(9)
    for record in records[:2]:
        sink.write(record)
    fs.get(path, str(tmp_path / "killed"), recursive=True)  # what a run SIGKILLed now would leave
    assert _scalars(str(tmp_path / "killed"))["train/mean_return"] == [(1, -7.0), (2, -4.0)]
    for record in records[2:]:
        sink.write(record)
    sink.close()
    parts = sorted(fs.ls(path, detail=False))
    assert len(parts) >= 3 and [p.rsplit(".", 1)[1] for p in parts] == [f"{i:06d}" for i in range(len(parts))]
    fs.get(path, str(tmp_path / "tb"), recursive=True)
    assert _scalars(str(tmp_path / "tb"))["train/mean_return"] == [(r["iteration"], r["mean_return"]) for r in records]
    assert list(temp.iterdir()) == []


def test_a_record_without_its_iteration_is_refused() -> None:
    with pytest.raises(ValueError, match="iteration"):
        MetricsLogger([ListSink()]).log({"mean_return": 1.0})


def test_a_run_without_records_reads_as_empty(tmp_path) -> None:
    assert read_metrics(f"file://{tmp_path}/nothing") == []


@pytest.mark.parametrize("kind", ["control", "agent"])
def test_the_learning_curve_is_a_png_of_the_records(kind) -> None:
    import matplotlib.image

    records = [{**r, "tokens_total": 1000 * r["iteration"], "accuracy": 0.1 * r["iteration"], "mean_reward": 0.2,
                "tokens_per_s": 300.0} for r in _records(40)]
    png = learning_curve_png(records, kind, "a run", evaluation=(40_000, 3.0, "final"))
    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert image.shape[:2] == (550, 800) and image.std() > 0.05  # drawn, not blank
    assert learning_curve_png(records[:1], kind, "one point")[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="kind"):
        learning_curve_png(records, "other", "x")


def test_checkpoint_rows_name_bases_and_deltas_against_torch_save(tmp_path) -> None:
    store = CheckpointStore(f"file://{tmp_path}/ck", full_every=3)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((256, 256)).astype(np.float32)
    for version in range(4):
        weights[version] += 1.0  # a small change each version: deltas stay small
        store.commit({"w": weights, "b": np.zeros(256, np.float32)}, {"step": version})
    rows = checkpoint_rows(store)
    assert [r["version"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["kind"] == "base" and rows[1]["kind"] == "delta on v0"
    assert rows[0]["raw_bytes"] == 256 * 257 * 4
    assert 0.5 < rows[0]["ratio_to_torch_save"] <= 1.0 and rows[1]["ratio_to_torch_save"] < 0.1
    assert checkpoint_rows(CheckpointStore(f"file://{tmp_path}/empty")) == []


def sink_for_tests(run_url: str, run_name: str) -> ListSink:
    """A sink factory as GYMFLOW_METRIC_SINKS names one."""
    sink = ListSink()
    sink.run = (run_url, run_name)
    return sink


def test_sinks_named_in_the_environment_join_every_run(monkeypatch) -> None:
    from rl_core.reporting import configured_sinks

    monkeypatch.setenv("GYMFLOW_METRIC_SINKS", f"{__name__}:sink_for_tests, {__name__}:sink_for_tests")
    sinks = configured_sinks("file:///runs/a", "a")
    assert len(sinks) == 2 and sinks[0].run == ("file:///runs/a", "a")
    monkeypatch.setenv("GYMFLOW_METRIC_SINKS", "no_such_module:Sink")
    with pytest.raises(ValueError, match="no_such_module:Sink"):
        configured_sinks("file:///runs/a", "a")
    monkeypatch.delenv("GYMFLOW_METRIC_SINKS")
    assert configured_sinks("file:///runs/a", "a") == []
