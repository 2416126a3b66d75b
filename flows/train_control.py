"""Control RL (PPO on MuJoCo) as a Prefect flow: the readable plan of one training run.

    kernel_autotune                         once (cached per machine and library versions)
    checkpoint_init                         where the run stands (version 0 for a new run)
    for each iteration i from there:
        simulate(i, v_i)      -> experience shards   (Ray env workers, batched MuJoCo)
        score(i)              -> advantages/returns  (GAE through kernels.dispatch)
        train_shard(i, k)     for k < K, together   (one torch.distributed group on Ray)
        checkpoint_diff(i)    -> version v_i+1       (lossless delta, zstd, fsspec)
    evaluate(final version)

With `overlap`, simulate(i+1) starts when train_shard(i) does, acting with the policy of v_i (one update
stale) from the envs simulate(i) left, so env workers and trainer ranks work at the same time.

checkpoint_diff(i) is off the critical path: the run's `CommitPipeline` (flows/run/commit_pipeline.py, which holds
the argument that this is safe) starts it beside train_shard(i+1), once simulate(i+1) and score(i+1) are done, so it
takes the core a one-rank update leaves idle rather than CPU from the env workers; iteration i+1 ends when it lands.

The flow's parameters are the run's launch options (`rl_core.config.launch_options`); `gymflow train`
runs it from a terminal (flows/tooling/cli.py), `prefect deployment run 'train-control/train'` through a worker.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from flows.run import progress
from flows.run.commit_pipeline import CommitPipeline, Landed
from flows.run.parameters import STOP_AFTER, last_iteration, with_launch_options
from flows.run.report import RunReport, numbers
from flows.run.start import start_run
from flows.run.store_credentials import CREDENTIALS_BLOCK
from rl_core.config.presets import build_control_config
from rl_core.data.storage_report import storage_report
from rl_core.iteration_clock import IterationClock, StepWaits
from rl_core.runtime.control.actors import ControlActors
from tasks.caching import step_incarnation
from tasks.checkpoint_diff import checkpoint_diff, checkpoint_init
from tasks.evaluate import evaluate
from tasks.kernel_autotune import kernel_autotune
from tasks.render_video import render_final_version
from tasks.score import score
from tasks.simulate import simulate
from tasks.train_shard import train_shard

HEADLINE = ("final_return", "final_return_std", "random_return", "episodes", "version", "env_steps")


@dataclass
class Trained:
    """What an iteration reports once its commit lands."""

    sim: dict
    trained: dict
    waits: StepWaits
    seconds: float


class RecentReturns:
    """The returns of the last `size` finished episodes: the run's mean return as the progress bar shows it."""

    def __init__(self, size: int) -> None:
        self.size, self.returns = size, []

    def add(self, finished: list[float]) -> float:
        self.returns = (self.returns + finished)[-self.size:]
        return sum(self.returns) / len(self.returns) if self.returns else math.nan


def report_landed(report: RunReport, returns: RecentReturns, done: Landed) -> None:
    """An iteration's figures, once its commit has landed: progress bar, log line, metrics."""
    it, committed = done.context, done.committed
    mean_return = returns.add(it.sim["finished_returns"])
    progress.report_iteration(it.sim["env_steps"], mean_return)
    get_run_logger().info("iteration %d: version %d, %d env steps, mean return %.1f, kl %.4f, %d bytes stored",
                          done.iteration + 1, committed["version"], it.sim["env_steps"], mean_return,
                          it.trained.get("approx_kl", math.nan), committed["encoded_bytes"])
    report.iteration({**numbers(it.trained), **it.waits.seconds, "iteration": done.iteration + 1,
                      "version": committed["version"], "env_steps": it.sim["env_steps"],
                      "env_steps_total": committed["env_steps"], "mean_return": mean_return,
                      "steps_per_s": it.sim["env_steps"] / it.seconds,
                      "checkpoint_bytes": committed["encoded_bytes"], "iteration_s": it.seconds})


@flow(name="train-control", task_runner=ThreadPoolTaskRunner(max_workers=16))
@with_launch_options({**CREDENTIALS_BLOCK, **STOP_AFTER, "hyperparameters": (
    Optional[dict[str, Any]], None, "The algorithm's fields over its task preset and the size preset (e.g. "
    "{\"learning_rate\": 1e-3}); a continued run must give the same")})
def train_control(**options: Any) -> dict:
    """Train until the run has `iterations` iterations (or `stop_after`), then evaluate; returns the run's summary.

    The same run name continues the run; reusing it with other settings is refused, naming the fields.
    """
    started = time.perf_counter()
    credentials = options.pop("store_credentials_block", None)
    stop_after = options.pop("stop_after", None)
    cfg = build_control_config(**options)
    end = last_iteration(cfg, stop_after)
    run, lease = start_run(cfg, credentials)
    actors = ControlActors(cfg)
    report: RunReport | None = None
    commits: CommitPipeline | None = None
    result = None
    try:
        # After tuning: actors booting during a first (uncached) tuning would disturb its timings.
        tuning = kernel_autotune(cfg)
        actors.start()  # they boot while checkpoint_init waits for the trainer group
        start = checkpoint_init(cfg, actors)
        commits = CommitPipeline(cfg, checkpoint_diff)
        version, incarnation = start["version"], step_incarnation(run.incarnation, start)
        progress.start(version, end)
        report = RunReport(cfg, "control", done=version)
        returns = RecentReturns(cfg.env.num_envs)
        clock = IterationClock()
        collecting = None  # with overlap: the next iteration's simulate, running while this one trains
        finishing: Trained | None = None  # the iteration whose commit is in flight
        for iteration in range(version, end):
            waits = StepWaits()
            try:
                with waits("simulate"):
                    sim = collecting.result() if collecting else simulate(cfg, actors, incarnation, iteration,
                                                                          version)
                with waits("score"):
                    scored = score(cfg, incarnation, iteration, version, sim["experience"])
                commits.start()  # checkpoint_diff(i-1), v_i, beside train_shard(i)
                shards = [train_shard.submit(cfg, actors, incarnation, iteration, version, k, scored["scored"])
                          for k in range(cfg.num_ranks)]
                collecting = (simulate.submit(cfg, actors, incarnation, iteration + 1, version + 1)
                              if cfg.overlap and iteration + 1 < end else None)
                with waits("train"):
                    trained = [s.result() for s in shards]
            finally:
                landed = commits.land(waits)  # v_i (before v_i+1, a delta on it), even when a step of i failed
                if landed:
                    report_landed(report, returns, landed)
            finishing = Trained(sim, trained[0], waits, clock.lap())
            commits.add(incarnation, iteration, version, trained[0]["staged"], sim["experience"], finishing)
            version += 1
        if finishing is not None:  # the run's last commit is waited for in its own iteration's time
            last = commits.land(finishing.waits)
            finishing.seconds += clock.lap()
            report_landed(report, returns, last)
        result = evaluate(cfg, actors, incarnation, version)
        if cfg.eval_video:
            render_final_version(cfg, version)
    finally:
        if commits is not None:
            commits.close()
        actors.release()
        lease.release()
        if report is not None:
            report.publish(result and {k: result[k] for k in HEADLINE if k in result})
    storage = storage_report(cfg)
    return {
        **result,
        "env_steps": storage["env_steps"],
        "iterations": cfg.iterations,
        "wall_s": round(time.perf_counter() - started, 2),
        "loop_s": round(clock.total_s, 2),
        "first_iteration_s": round(clock.first_s, 2),
        "first_iteration_at": clock.first_started_at,  # the command's start-up ends here
        "run_dir": cfg.run_url,
        "checkpoints": storage,
        "kernels": tuning,
    }
