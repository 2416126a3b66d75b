"""What a flow run shows in the Prefect UI, and where its metrics go: the run's artifacts and its metrics sinks.

Artifacts, keyed by the run's name so the newest of a run is one click away (`<run>-progress`, `<run>-metrics`,
`<run>-summary`, `<run>-checkpoints`):
- a progress artifact, updated as iterations complete (at most every `PROGRESS_EVERY_S` seconds, and at the end);
- a table of every iteration's metrics, a markdown summary with the learning curve embedded as an image, and the
  checkpoint lineage, made at the end of the flow run (also when it fails: what completed is shown).
They are made by the flow itself from what the run stored (`<run>/metrics/`, its checkpoints), never inside a cached
task, so a resumed or retried run shows every iteration, those of earlier flow runs included.
"""
from __future__ import annotations

import base64
import time
from typing import Any

import fsspec
from prefect import get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from rl_core.checkpoint import CheckpointStore
from rl_core.config.agent import AnyRunConfig
from rl_core.data import RunLayout
from rl_core.reporting import (
    MetricsLogger,
    RunMetricsSink,
    TensorBoardSink,
    checkpoint_rows,
    configured_sinks,
    learning_curve_png,
    read_metrics,
)
from tasks.artifact_keys import artifact_key

PROGRESS_EVERY_S = 2.0
TABLE_COLUMNS = {
    "control": ("iteration", "env_steps_total", "mean_return", "policy_loss", "value_loss", "entropy", "approx_kl",
                "steps_per_s", "version", "checkpoint_bytes", "simulate_s", "score_s", "train_s", "checkpoint_s",
                "iteration_s"),
    "agent": ("iteration", "tokens_total", "accuracy", "mean_reward", "loss", "kl", "logprob_parity_max",
              "staleness_mean", "dropped_rows", "tokens_per_s", "version", "checkpoint_bytes", "rollout_s", "score_s",
              "train_s", "checkpoint_s", "iteration_s"),
}


def numbers(values: dict[str, Any], *names: str) -> dict[str, float]:
    """The numeric fields of a step's result (all of them when no names are given)."""
    picked = values if not names else {n: values[n] for n in names if n in values}
    return {k: v for k, v in picked.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class RunReport:
    """A flow run's progress and iteration records (`iteration`), then its artifacts (`publish`)."""

    def __init__(self, cfg: AnyRunConfig, kind: str, done: int, sinks: list | None = None) -> None:
        self.cfg, self.kind = cfg, kind
        if sinks is None:
            sinks = [RunMetricsSink(cfg.run_url), TensorBoardSink(cfg.run_url),
                     *configured_sinks(cfg.run_url, cfg.run_name)]
        self.logger = MetricsLogger(sinks)
        self._total = max(cfg.iterations, 1)
        self._progress_id = create_progress_artifact(
            progress=100.0 * done / self._total, key=artifact_key(cfg.run_name, "progress"),
            description=f"{cfg.run_name}: iterations done of {cfg.iterations}")
        self._shown = time.monotonic()

    def iteration(self, record: dict[str, Any]) -> None:
        """Record one completed iteration (numbers only; `iteration` counts from 1) and move the progress on."""
        self.logger.log(record)
        done = int(record["iteration"])
        if done >= self.cfg.iterations or time.monotonic() - self._shown >= PROGRESS_EVERY_S:
            update_progress_artifact(self._progress_id, 100.0 * done / self._total)
            self._shown = time.monotonic()

    def publish(self, headline: dict[str, Any] | None) -> None:
        """Close the sinks, then make the run's table, summary and lineage artifacts from what it stored;
        `headline` holds the final evaluation (None when the flow run failed before it). A failure here is
        logged, never raised over the run's own outcome."""
        try:
            self.logger.close()
            records = read_metrics(self.cfg.run_url)
            if records:
                update_progress_artifact(self._progress_id, 100.0 * int(records[-1]["iteration"]) / self._total)
            self._publish(records, headline)
        except Exception as err:  # the run's result matters more than its report
            get_run_logger().warning("run report not published: %s: %s", type(err).__name__, err)

    def _publish(self, records: list[dict], headline: dict[str, Any] | None) -> None:
        run = self.cfg.run_name
        columns = TABLE_COLUMNS[self.kind]
        create_table_artifact(key=artifact_key(run, "metrics"),
                              table=[{c: _rounded(r.get(c)) for c in columns} for r in records],
                              description=f"{run}: metrics of every iteration ({len(records)} so far)")
        png = learning_curve_png(records, self.kind, f"{run} ({self.cfg.env.name})", self._evaluation(records, headline))
        curve_url = RunLayout(self.cfg.run_url).learning_curve
        fs, path = fsspec.core.url_to_fs(curve_url)
        fs.makedirs(fs._parent(path), exist_ok=True)
        fs.pipe_file(path, png)
        create_markdown_artifact(key=artifact_key(run, "summary"), markdown=self._summary(records, headline, png,
                                                                                          curve_url),
                                 description=f"{run}: learning curve and outcome")
        rows = checkpoint_rows(CheckpointStore(RunLayout(self.cfg.run_url).checkpoints))
        create_table_artifact(key=artifact_key(run, "checkpoints"), table=rows,
                              description=f"{run}: checkpoint lineage (ratio: bytes added / torch.save of the state)")

    def _evaluation(self, records: list[dict], headline: dict[str, Any] | None) -> tuple[float, float, str] | None:
        """Where the final evaluation sits on the curve: at the run's total work, its score."""
        if not headline or not records:
            return None
        if self.kind == "agent":
            return records[-1]["tokens_total"], headline["accuracy_final"], "held-out accuracy (final version)"
        return (records[-1]["env_steps_total"], headline["final_return"],
                f"deterministic evaluation, {headline['episodes']} episode(s)")

    def _summary(self, records: list[dict], headline: dict[str, Any] | None, png: bytes, curve_url: str) -> str:
        lines = [f"# {self.cfg.run_name}", "",
                 (f"{self.cfg.env.name}, {len(records)} of {self.cfg.iterations} iterations recorded; "
                  f"run folder `{self.cfg.run_url}`."), ""]
        if headline is None:
            lines += [("**This flow run did not finish**: the curve shows the iterations that completed. "
                       "Retry the run (or rerun it with the same run name) to continue from its newest version."), ""]
        else:
            lines += ["| outcome | value |", "|---|---|"]
            lines += [f"| {name} | {_cell(value)} |" for name, value in headline.items()]
            lines.append("")
        encoded = base64.b64encode(png).decode()
        lines += [f"![learning curve](data:image/png;base64,{encoded})", "",
                  (f"The curve's PNG: `{curve_url}`. Scalars for TensorBoard: "
                   f"`tensorboard --logdir {_local(RunLayout(self.cfg.run_url).tensorboard)}`.")]
        return "\n".join(lines)


def _local(url: str) -> str:
    """A file:// URL as the path TensorBoard takes; other URLs as they are."""
    return url.removeprefix("file://")


def _rounded(value: Any) -> Any:
    """Four significant digits: a table cell to read, not to compute with (the records keep every digit)."""
    return float(f"{value:.4g}") if isinstance(value, float) else value


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
