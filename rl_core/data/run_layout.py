"""Where a run keeps what: one place that knows the paths, so steps agree on them by construction."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunLayout:
    """Paths under a run's fsspec URL: checkpoints, per-iteration step outputs, run metadata."""

    run_url: str

    @property
    def checkpoints(self) -> str:
        return f"{self.run_url}/checkpoints"

    @property
    def kernel_report(self) -> str:
        """Which kernel implementations the run's hot ops were tuned to (copied from the machine's cache)."""
        return f"{self.run_url}/kernels/autotune.json"

    @property
    def run_info(self) -> str:
        return f"{self.run_url}/run.json"

    def iteration(self, iteration: int) -> str:
        return f"{self.run_url}/steps/{iteration:06d}"

    def experience(self, iteration: int, worker: int) -> str:
        return f"{self.iteration(iteration)}/experience-{worker:03d}.safetensors"

    def scored(self, iteration: int) -> str:
        return f"{self.iteration(iteration)}/scored.safetensors"

    def staged_learner(self, iteration: int) -> str:
        return f"{self.iteration(iteration)}/learner.safetensors"

    @property
    def warm_start(self) -> str:
        """A new run's warm-started learner (SFT), until it is committed as version 0."""
        return f"{self.run_url}/steps/warm-start.safetensors"

    def trajectories(self, iteration: int, chunk: int) -> str:
        """Token-exact trajectories of rollout chunk `chunk` of `iteration`: kept after the commit (lineage)."""
        return f"{self.run_url}/trajectories/{iteration:06d}/chunk-{chunk:03d}.safetensors"

    def train_progress(self, iteration: int) -> str:
        """Epoch checkpoints of iteration's update: removed with the iteration's step outputs once committed."""
        return f"{self.iteration(iteration)}/train-progress"

    def metrics(self, iteration: int) -> str:
        """One JSON record per iteration (the flow's metrics), kept for the run's learning curve and reports."""
        return f"{self.run_url}/metrics/{iteration:06d}.json"

    @property
    def metrics_dir(self) -> str:
        return f"{self.run_url}/metrics"

    @property
    def learning_curve(self) -> str:
        """The run's learning curve (PNG), re-drawn at the end of every flow run."""
        return f"{self.run_url}/reports/learning-curve.png"

    @property
    def tensorboard(self) -> str:
        """TensorBoard event files of the run's scalars (`tensorboard --logdir runs/`)."""
        return f"{self.run_url}/tensorboard"

    def video(self, version: int, suffix: str) -> str:
        """Episodes of `version` rendered offscreen (`gymflow evaluate RUN --video`)."""
        return f"{self.run_url}/videos/v{version:08d}.{suffix}"
