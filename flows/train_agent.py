"""LLM-agent RL (GRPO on text tasks) as a Prefect flow: the readable plan of one agent run.

    kernel_autotune                         once (cached per machine and library versions)
    checkpoint_init                         where the run stands
    sft_warm_start                          a new run only: SFT on the env's demonstrations, committed as v0
    evaluate(v0)                            held-out accuracy of the warm start
    for each iteration i from there:
        rollout(i, v_i)       -> trajectories        (the generator actor samples; episodes are plain Python;
                                                      token-exact, written chunk by chunk as safe points)
        score(i)              -> group advantages    (GRPO: reward relative to the prompt's group)
        train_shard(i, k)     for k < K, together   (one torch.distributed group on Ray)
        checkpoint_diff(i)    -> version v_i+1       (lossless delta, naming the trajectories it consumed; it lands
                                                      while rollout(i+1) and train_shard(i+1) run)
    evaluate(final version)                 held-out accuracy and mean reward

With `max_staleness` S >= 1, rollout(i+1) starts when train_shard(i) does, sampling from v_i (one version stale),
so the generator and the trainer ranks work at the same time; the update corrects for the lag (decoupled PPO with
truncated importance weights, `rl_core/algos/grpo/update.py`).

The steps after rollout are the control flow's own tasks: they reach GRPO through the algorithm seam, as the flow
does for the version each rollout samples from. The run's `CommitPipeline` commits v_i+1 beside the next iteration:
the next rollout's generator and the trainer ranks read v_i+1 where train_shard(i) staged it until it has landed
(`rl_core.runtime.version_state`), and it lands before v_i+2 is added.

The flow's parameters are the agent run's launch options (`rl_core.config.launch_options.agent_launch_options`);
`gymflow train-agent` runs it from a terminal, `prefect deployment run 'train-agent/agent-train'` through a worker.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from flows.run import progress
from flows.run.commit_pipeline import CommitPipeline, Landed
from flows.run.parameters import STOP_AFTER, last_iteration, with_launch_options
from flows.run.report import RunReport, numbers
from flows.run.start import start_run
from flows.run.store_credentials import CREDENTIALS_BLOCK
from rl_core.algos.base import algorithm_of
from rl_core.config.launch_options import agent_launch_options
from rl_core.config.presets import build_agent_config
from rl_core.data.storage_report import storage_report
from rl_core.iteration_clock import IterationClock, StepWaits
from rl_core.runtime.agent.actors import AgentActors
from tasks.caching import step_incarnation
from tasks.checkpoint_diff import checkpoint_diff, checkpoint_init
from tasks.evaluate import evaluate
from tasks.kernel_autotune import kernel_autotune
from tasks.rollout import rollout
from tasks.score import score
from tasks.sft_warm_start import sft_warm_start
from tasks.train_shard import train_shard


@dataclass
class Rolled:
    """What an iteration reports once its commit lands."""

    rolled: dict
    trained: dict
    waits: StepWaits
    seconds: float


def report_landed(report: RunReport, done: Landed) -> float:
    """An iteration's figures, once its commit has landed: progress bar, log line, metrics; its log-prob parity
    (NaN when no sample of the iteration was fresh)."""
    it, committed, metrics = done.context, done.committed, done.context.trained
    rolled, parity = it.rolled, metrics.get("logprob_parity_max", math.nan)
    progress.report_agent_iteration(rolled["tokens"], rolled["accuracy"], rolled["mean_reward"], parity)
    get_run_logger().info(
        "iteration %d: version %d, accuracy %.3f, mean reward %.3f, %d tokens, log-prob parity max %.1e mean %.1e, "
        "staleness %.2f (%d rows dropped), kl %.4f, %d bytes stored", done.iteration + 1, committed["version"],
        rolled["accuracy"], rolled["mean_reward"], rolled["tokens"], parity,
        metrics.get("logprob_parity_mean", math.nan), metrics.get("staleness_mean", math.nan),
        metrics.get("dropped_rows", 0), metrics.get("kl", math.nan), committed["encoded_bytes"])
    report.iteration({**numbers(metrics), **it.waits.seconds, "iteration": done.iteration + 1,
                      "version": committed["version"], **numbers(rolled, "tokens", "accuracy", "mean_reward"),
                      "tokens_total": committed["tokens_generated"], "tokens_per_s": rolled["tokens"] / it.seconds,
                      "checkpoint_bytes": committed["encoded_bytes"], "iteration_s": it.seconds})
    return parity


@flow(name="train-agent", task_runner=ThreadPoolTaskRunner(max_workers=16))
@with_launch_options({**CREDENTIALS_BLOCK, **STOP_AFTER}, agent_launch_options())
def train_agent(**options: Any) -> dict:
    """Train the agent until the run has `iterations` iterations (or `stop_after`), then evaluate on held-out
    problems; returns the run's summary. The same run name continues the run; reusing it with other settings is
    refused, naming the fields."""
    started = time.perf_counter()
    credentials = options.pop("store_credentials_block", None)
    stop_after = options.pop("stop_after", None)
    cfg = build_agent_config(**options)
    end = last_iteration(cfg, stop_after)
    logger = get_run_logger()
    run, lease = start_run(cfg, credentials)
    actors = AgentActors(cfg)
    parity: list[float] = []
    report: RunReport | None = None
    commits: CommitPipeline | None = None
    warm = final = None
    try:
        tuning = kernel_autotune(cfg)
        actors.start()
        start = checkpoint_init(cfg, actors)
        if start["version"] is None:  # a new run: version 0 is the warm start
            warm_start = sft_warm_start(cfg, actors, run.incarnation)
            start = checkpoint_init(cfg, actors, warm_start["staged"])
        commits = CommitPipeline(cfg, checkpoint_diff)
        behaviour_version = algorithm_of(cfg).behaviour_version
        version, incarnation = start["version"], step_incarnation(run.incarnation, start)
        warm = evaluate(cfg, actors, incarnation, 0)
        logger.info("warm start (v0): held-out accuracy %.3f, mean reward %.3f", warm["accuracy"], warm["mean_reward"])
        progress.start(version, end)
        report = RunReport(cfg, "agent", done=version)
        clock = IterationClock()
        rolling = None  # with max_staleness >= 1: the next iteration's rollout, running while this one trains
        finishing: Rolled | None = None  # the iteration whose commit is in flight
        for iteration in range(version, end):
            waits = StepWaits()
            try:
                with waits("rollout"):
                    rolled = rolling.result() if rolling else rollout(cfg, actors, incarnation, iteration,
                                                                      behaviour_version(cfg, iteration))
                with waits("score"):
                    scored = score(cfg, incarnation, iteration, version, rolled["trajectories"])
                shards = [train_shard.submit(cfg, actors, incarnation, iteration, version, k, scored["scored"])
                          for k in range(cfg.num_ranks)]
                ahead = cfg.algorithm.max_staleness and iteration + 1 < end
                rolling = rollout.submit(cfg, actors, incarnation, iteration + 1,
                                         behaviour_version(cfg, iteration + 1)) if ahead else None
                with waits("train"):
                    trained = [s.result() for s in shards]
            finally:
                landed = commits.land(waits)  # v_i (before v_i+1, a delta on it), even when a step of i failed
                if landed:
                    parity.append(report_landed(report, landed))
            finishing = Rolled(rolled, trained[0], waits, clock.lap())
            commits.add(incarnation, iteration, version, trained[0]["staged"], rolled["trajectories"], finishing)
            commits.start()  # beside the next rollout and update: its generator reads v_i+1 where it was staged
            version += 1
        if finishing is not None:  # the run's last commit is waited for in its own iteration's time
            last = commits.land(finishing.waits)
            finishing.seconds += clock.lap()
            parity.append(report_landed(report, last))
        final = evaluate(cfg, actors, incarnation, version)
    finally:
        if commits is not None:
            commits.close()
        actors.release()
        lease.release()
        if report is not None:
            report.publish(final and {"accuracy_sft": warm["accuracy"], "accuracy_final": final["accuracy"],
                                      "mean_reward_sft": warm["mean_reward"], "mean_reward_final": final["mean_reward"],
                                      "version": version})
    storage = storage_report(cfg)
    return {
        "accuracy_sft": warm["accuracy"],
        "accuracy_final": final["accuracy"],
        "mean_reward_sft": warm["mean_reward"],
        "mean_reward_final": final["mean_reward"],
        "tokens_generated": storage["counters"].get("tokens_generated", 0),
        # None: no iteration of this flow run had a fresh sample to compare (it trained none, or all were stale)
        "logprob_parity_max": max((p for p in parity if not math.isnan(p)), default=None),
        "policy_sha256": final["policy_sha256"],
        "iterations": cfg.iterations,
        "env": cfg.env.name,
        "wall_s": round(time.perf_counter() - started, 2),
        "loop_s": round(clock.total_s, 2),
        "first_iteration_s": round(clock.first_s, 2),
        "first_iteration_at": clock.first_started_at,  # the command's start-up ends here
        "run_dir": cfg.run_url,
        "checkpoints": storage,
        "kernels": tuning,
    }
