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

checkpoint_diff(i) is off the critical path: it runs beside train_shard(i+1), once simulate(i+1) and score(i+1) are
done, so it takes the core a one-rank update leaves idle rather than CPU from the env workers (which keep every core
busy); iteration i+1 ends when it has landed. Until then v_i+1 lives in iteration i's step outputs, which is where a
retried or replaced worker or rank restores it from (`rl_core.runtime.version_state`). A crash before it lands
redoes iteration i's commit and iteration i+1's update (every finished step comes back from Prefect's cache).
Beside simulate(i+1), as before, its 31 ms of CPU and its hold on the flow's interpreter made a quick HalfCheetah
iteration 0.41 s instead of 0.365-0.39 s.

The flow's parameters are the run's launch options (`rl_core.config.launch_options`); `python -m flows.tooling.cli train`
runs it from a terminal (flows/tooling/cli.py), `prefect deployment run 'train-control/train'` through a worker.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner

from flows.run import progress
from flows.run.parameters import with_launch_options
from flows.run.report import RunReport, numbers
from flows.run.start import start_run
from flows.run.store_credentials import CREDENTIALS_BLOCK
from rl_core.config.control_presets import build_config
from rl_core.data.storage_report import storage_report
from rl_core.iteration_clock import IterationClock, StepWaits
from rl_core.runtime.control.actors import ControlActors
from tasks.caching import step_incarnation
from tasks.checkpoint_diff import checkpoint_diff, checkpoint_init, release_flow_run_writer
from tasks.evaluate import evaluate
from tasks.kernel_autotune import kernel_autotune
from tasks.render_video import render_final_version
from tasks.score import score
from tasks.simulate import simulate
from tasks.train_shard import train_shard

HEADLINE = ("final_return", "final_return_std", "random_return", "episodes", "version", "env_steps")


@dataclass
class Committing:
    """An iteration's checkpoint_diff, submitted once the next iteration trains, and what its iteration reports once
    it lands."""

    step: tuple  # checkpoint_diff's arguments
    iteration: int
    version: int  # the version it commits
    sim: dict
    trained: dict
    waits: StepWaits
    seconds: float
    future: PrefectFuture | None = None

    def submit(self) -> None:
        self.future = checkpoint_diff.submit(*self.step)


@flow(name="train-control", task_runner=ThreadPoolTaskRunner(max_workers=16))
@with_launch_options(CREDENTIALS_BLOCK)
def train_control(**options: Any) -> dict:
    """Train until the run has `iterations` iterations, then evaluate; returns the run's summary.

    The same run name continues the run; reusing it with other settings is refused, naming the fields.
    """
    started = time.perf_counter()
    credentials = options.pop("store_credentials_block", None)
    cfg = build_config(**options)
    logger = get_run_logger()
    run, lease = start_run(cfg, credentials)
    actors = ControlActors(cfg)
    report: RunReport | None = None
    result = None
    try:
        # After tuning: actors booting during a first (uncached) tuning would disturb its timings.
        tuning = kernel_autotune(cfg)
        actors.start()  # they boot while checkpoint_init waits for the trainer group
        start = checkpoint_init(cfg, actors, run.incarnation)
        version, incarnation = start["version"], step_incarnation(run.incarnation, start)
        progress.start(version, cfg.iterations)
        report = RunReport(cfg, "control", done=version)
        recent_returns: list[float] = []
        clock = IterationClock()
        collecting = None  # with overlap: the next iteration's simulate, running while this one trains
        committing: Committing | None = None  # checkpoint_diff(i-1): submitted when train_shard(i) is, landing beside it

        def landed(waits: StepWaits) -> None:
            """Wait for the pending commit (submitting it first if no train_shard did), then report its iteration.
            The run's last commit is waited for in its own iteration's time (`waits` is then that iteration's)."""
            nonlocal committing, recent_returns
            if committing is None:
                return
            if committing.future is None:
                committing.submit()
            with waits("checkpoint"):
                committed = committing.future.result()
            done, committing = committing, None
            if waits is done.waits:
                done.seconds += clock.lap()
            if committed["version"] != done.version:
                raise RuntimeError(f"iteration {done.iteration} committed version {committed['version']}, expected "
                                   f"{done.version}; rerun the flow to continue from the newest version")
            sim, trained = done.sim, done.trained
            recent_returns = (recent_returns + sim["finished_returns"])[-cfg.env.num_envs:]
            mean_return = sum(recent_returns) / len(recent_returns) if recent_returns else math.nan
            progress.report_iteration(sim["env_steps"], mean_return)
            logger.info("iteration %d: version %d, %d env steps, mean return %.1f, kl %.4f, %d bytes stored",
                        done.iteration + 1, done.version, sim["env_steps"], mean_return,
                        trained.get("approx_kl", math.nan), committed["encoded_bytes"])
            report.iteration({**numbers(trained), **done.waits.seconds, "iteration": done.iteration + 1,
                              "version": done.version, "env_steps": sim["env_steps"],
                              "env_steps_total": committed["env_steps"], "mean_return": mean_return,
                              "steps_per_s": sim["env_steps"] / done.seconds,
                              "checkpoint_bytes": committed["encoded_bytes"], "iteration_s": done.seconds})

        for iteration in range(version, cfg.iterations):
            waits = StepWaits()
            try:
                with waits("simulate"):
                    sim = collecting.result() if collecting else simulate(cfg, actors, incarnation, iteration,
                                                                          version)
                with waits("score"):
                    scored = score(cfg, incarnation, iteration, version, sim["experience"])
                if committing is not None:
                    committing.submit()  # v_i, beside train_shard(i): see the module's docstring
                shards = [train_shard.submit(cfg, actors, incarnation, iteration, version, k, scored["scored"])
                          for k in range(cfg.num_ranks)]
                collecting = (simulate.submit(cfg, actors, incarnation, iteration + 1, version + 1)
                              if cfg.overlap and iteration + 1 < cfg.iterations else None)
                with waits("train"):
                    trained = [s.result() for s in shards]
            finally:
                landed(waits)  # v_i (before v_i+1, a delta on it), even when a step of iteration i failed
            step = (cfg, incarnation, iteration, version, trained[0]["staged"], sim["experience"])
            version += 1
            committing = Committing(step, iteration, version, sim, trained[0], waits, clock.lap())
        if committing is not None:
            landed(committing.waits)
        result = evaluate(cfg, actors, incarnation, version)
        if cfg.eval_video:
            render_final_version(cfg, version)
    finally:
        release_flow_run_writer()
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
