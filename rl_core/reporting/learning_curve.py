"""A run's learning curve as a PNG (matplotlib, no display): the run's score over the work it took, and the speed
of each iteration beneath, drawn from the iteration records the run stored."""
from __future__ import annotations

import io
from collections.abc import Sequence

from rl_core.reporting.metric_sinks import Record

# (x field, x label, [(y field, y label)]) per kind of run: the first y on the top panel's left axis.
CURVES = {
    "control": ("env_steps_total", "env steps", [("mean_return", "training episode return (mean)")]),
    "agent": ("tokens_total", "tokens generated", [("accuracy", "rollout accuracy"), ("mean_reward", "mean reward")]),
}
SPEED = {"control": ("steps_per_s", "env steps/s"), "agent": ("tokens_per_s", "tokens/s")}


def _series(records: Sequence[Record], x: str, y: str) -> tuple[list[float], list[float]]:
    points = [(r[x], r[y]) for r in records if r.get(x) is not None and r.get(y) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def learning_curve_png(records: Sequence[Record], kind: str, title: str,
                       evaluation: tuple[float, float, str] | None = None) -> bytes:
    """The curve of `records` (one per iteration, as RunMetricsSink stores them) for a `kind` of run ("control" or
    "agent"), as PNG bytes; `evaluation` (x, y, label) marks the final evaluation on the top panel's first axis
    (training returns come from the exploring policy, the evaluation from the deterministic one)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, on any machine
    import matplotlib.pyplot as plt

    if kind not in CURVES:
        raise ValueError(f"kind: expected one of {sorted(CURVES)} (got {kind!r})")
    x_field, x_label, ys = CURVES[kind]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), dpi=100, sharex=True,
                                         gridspec_kw={"height_ratios": [3, 1]})
    axes = [top] + [top.twinx() for _ in ys[1:]]
    colors = ["tab:blue", "tab:orange"]
    for axis, (field, label), color in zip(axes, ys, colors):
        xs, values = _series(records, x_field, field)
        axis.plot(xs, values, color=color, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        axis.set_ylabel(label, color=color)
    if evaluation is not None:
        x, y, label = evaluation
        top.plot([x], [y], marker="*", markersize=14, color="tab:red", linestyle="none", label=label)
        top.legend(loc="lower right")
    top.set_title(title)
    top.grid(alpha=0.3)
    speed_field, speed_label = SPEED[kind]
    xs, speeds = _series(records, x_field, speed_field)
    bottom.plot(xs, speeds, color="tab:gray")
    bottom.set_ylabel(speed_label)
    bottom.set_xlabel(x_label)
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out.getvalue()
