"""What a run reports about itself: per-iteration metrics through pluggable sinks, its learning curve, its
checkpoint lineage. Plain library code (no Prefect): the flows turn these into artifacts."""
from rl_core.reporting.checkpoint_lineage import checkpoint_rows
from rl_core.reporting.learning_curve import learning_curve_png
from rl_core.reporting.metric_sinks import (
    MetricSink,
    MetricsLogger,
    RunMetricsSink,
    TensorBoardSink,
    configured_sinks,
    read_metrics,
)

__all__ = ["MetricSink", "MetricsLogger", "RunMetricsSink", "TensorBoardSink", "checkpoint_rows", "configured_sinks",
           "learning_curve_png", "read_metrics"]
