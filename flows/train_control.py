"""Control RL (PPO on MuJoCo) as a Prefect flow: the readable plan of one training run.

    kernel_autotune                         once (cached per machine and library versions)
    checkpoint_init                         where the run stands (version 0 for a new run)
    for each iteration i from there:
        simulate(i, v_i)      -> experience shards   (Ray env workers, batched MuJoCo)
        score(i)              -> advantages/returns  (GAE through kernels.dispatch)
        train_shard(i, k)     for k < K, together   (one torch.distributed group on Ray)
        checkpoint_diff(i)    -> version v_i+1       (lossless delta, zstd, fsspec)
    evaluate(final version)

With `--overlap`, simulate(i+1) starts when train_shard(i) does, acting with the policy of v_i (one update
stale) from the envs simulate(i) left, so env workers and trainer ranks work at the same time.

`python -m flows.train_control` runs it on embedded defaults: a temporary local Prefect API, a local
Ray on 127.0.0.1 and a file:// store under ./runs/<run name>/. The same run name continues a run.
"""
from __future__ import annotations

import flows.embedded_defaults  # noqa: F401  (must precede prefect and ray)

import argparse
import atexit
import json
import logging
import math
import re
import sys
import time

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from flows import progress
from flows.store_credentials import export_store_credentials
from rl_core.config import PRESETS, ConfigError, RunConfig, build_config
from rl_core.data.run_info import open_run
from rl_core.envs import DynamicsRandomization
from rl_core.iteration_clock import IterationClock
from rl_core.runtime.versions import storage_report
from tasks.checkpoint_diff import checkpoint_diff, checkpoint_init
from tasks.evaluate import evaluate
from tasks.kernel_autotune import kernel_autotune
from tasks.runtime import release, start_actors
from tasks.score import score
from tasks.simulate import simulate
from tasks.train_shard import train_shard


@flow(name="train-control", task_runner=ThreadPoolTaskRunner(max_workers=16))
def train_control(
    run_name: str | None = None,
    preset: str = "quick",
    seed: int = 0,
    iterations: int | None = None,
    env: str = "HalfCheetah-v5",
    env_module: str | None = None,
    randomize_dynamics: float | None = None,
    store: str = "file://./runs",
    num_ranks: int | None = None,
    num_workers: int | None = None,
    envs_per_worker: int | None = None,
    rollout_steps: int | None = None,
    eval_episodes: int | None = None,
    overlap: bool | None = None,
    store_credentials_block: str | None = None,
) -> dict:
    """Train until the run has `iterations` iterations, then evaluate; returns the run's summary.

    `env_module` is imported first (here and in every worker) so `env` can name a task it registers;
    `randomize_dynamics` f scales each env's masses, friction and damping by U(1 - f, 1 + f).
    """
    started = time.perf_counter()
    cfg = run_config(preset=preset, run_name=run_name, seed=seed, iterations=iterations, env=env, env_module=env_module,
                     randomize_dynamics=randomize_dynamics, store=store, num_ranks=num_ranks, num_workers=num_workers,
                     envs_per_worker=envs_per_worker, rollout_steps=rollout_steps, eval_episodes=eval_episodes,
                     overlap=overlap)
    logger = get_run_logger()
    if store_credentials_block:  # before anything touches the store or starts Ray (its workers inherit them)
        names = export_store_credentials(store_credentials_block)
        logger.info("store credentials from block %s: set %s", store_credentials_block, ", ".join(names))
    run = open_run(cfg)
    logger.info("run %s (%s) at %s", cfg.run_name, "new" if run.is_new else "continued", cfg.run_url)
    try:
        # After tuning: actors booting during a first (uncached) tuning would disturb its timings.
        tuning = kernel_autotune(cfg)
        start_actors(cfg)  # they boot while checkpoint_init waits for the trainer group (no-op if the CLI did it)
        version = checkpoint_init(cfg, run.incarnation)["version"]
        progress.start(version, cfg.iterations)
        recent_returns: list[float] = []
        clock = IterationClock()
        collecting = None  # with overlap: the next iteration's simulate, running while this one trains
        for iteration in range(version, cfg.iterations):
            sim = collecting.result() if collecting else simulate(cfg, run.incarnation, iteration, version)
            scored = score(cfg, run.incarnation, iteration, version, sim["experience"])
            shards = [train_shard.submit(cfg, run.incarnation, iteration, version, k, scored["scored"])
                      for k in range(cfg.num_ranks)]
            collecting = (simulate.submit(cfg, run.incarnation, iteration + 1, version + 1)
                          if cfg.overlap and iteration + 1 < cfg.iterations else None)
            trained = [s.result() for s in shards]
            committed = checkpoint_diff(cfg, run.incarnation, iteration, version, trained[0]["staged"], sim["experience"])
            version = committed["version"]
            recent_returns = (recent_returns + sim["finished_returns"])[-cfg.num_workers * cfg.envs_per_worker:]
            mean_return = sum(recent_returns) / len(recent_returns) if recent_returns else math.nan
            progress.report_iteration(sim["env_steps"], mean_return)
            logger.info("iteration %d: version %d, %d env steps, mean return %.1f, kl %.4f, %d bytes stored",
                        iteration + 1, version, sim["env_steps"], mean_return, trained[0]["approx_kl"],
                        committed["encoded_bytes"])
            clock.lap()
        result = evaluate(cfg, run.incarnation, version)
    finally:
        release(cfg)
    storage = storage_report(cfg)
    return {
        **result,
        "env_steps": storage["env_steps"],
        "iterations": cfg.iterations,
        "wall_s": round(time.perf_counter() - started, 2),
        "loop_s": round(clock.total_s, 2),
        "first_iteration_s": round(clock.first_s, 2),
        "run_dir": cfg.run_url,
        "checkpoints": storage,
        "kernels": tuning,
    }


def run_config(
    *, preset: str, run_name: str | None, seed: int, iterations: int | None, env: str, env_module: str | None,
    randomize_dynamics: float | None, store: str, num_ranks: int | None, num_workers: int | None,
    envs_per_worker: int | None, rollout_steps: int | None, eval_episodes: int | None, overlap: bool | None,
) -> RunConfig:
    """The run's configuration from the flow's parameters (the CLI builds the same one to start the run's actors
    before the flow)."""
    return build_config(
        preset, run_name=run_name or default_run_name(env, preset, seed), seed=seed, iterations=iterations,
        env=env, env_module=env_module, randomization=randomization_of(randomize_dynamics), store=store,
        num_ranks=num_ranks, num_workers=num_workers, envs_per_worker=envs_per_worker, rollout_steps=rollout_steps,
        eval_episodes=eval_episodes, overlap=overlap,
    )


def default_run_name(env: str, preset: str, seed: int) -> str:
    """`HalfCheetah-v5-quick-s0`: rerunning the same command continues (or re-reports) the same run.

    Characters a run folder name cannot hold (`gym:Pendulum-v1`) become '-'.
    """
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{env}-{preset}-s{seed}")


def randomization_of(fraction: float | None) -> DynamicsRandomization | None:
    """The symmetric randomization of `fraction` (None or 0: none), with a ConfigError for a bad value."""
    if not fraction:
        return None
    try:
        return DynamicsRandomization.symmetric(fraction)
    except ValueError as err:
        raise ConfigError(f"randomize_dynamics: {err}") from None


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flows.train_control", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-name", help="run folder name; the same name continues that run "
                                           "(default: <env>-<preset>-s<seed>)")
    parser.add_argument("--preset", default="quick", help=f"one of {', '.join(PRESETS)} (default quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, help="total iterations of the run (default: the preset's)")
    parser.add_argument("--env", default="HalfCheetah-v5",
                        help="task name (default HalfCheetah-v5), or gym:<gymnasium id> for any gymnasium env "
                             "with Box spaces (slower, not bit-exact on resume)")
    parser.add_argument("--env-module", help="module to import first so --env can name a task it registers "
                                             "(e.g. examples.reaching_arm)")
    parser.add_argument("--randomize-dynamics", type=float, metavar="F",
                        help="scale each env's masses, friction and damping by U(1-F, 1+F) (default: off)")
    parser.add_argument("--store", default="file://./runs", help="fsspec URL the run folder lives under")
    parser.add_argument("--num-ranks", type=int, help="trainer ranks K (torch.distributed)")
    parser.add_argument("--num-workers", type=int, help="env-worker actors (a continued run may change it and "
                                                        "--envs-per-worker, keeping their product: its env count)")
    parser.add_argument("--envs-per-worker", type=int, help="MuJoCo envs batched in each env worker")
    parser.add_argument("--eval-episodes", type=int, help="deterministic episodes of the final evaluation (default 5)")
    parser.add_argument("--overlap", action="store_const", const=True,
                        help="collect iteration i+1 while iteration i trains, with a one-update-stale policy "
                             "(default: off; see README)")
    parser.add_argument("--store-credentials-block", metavar="SLUG",
                        help="Prefect block with the store's S3 credentials: secret/<name> or aws-credentials/<name>")
    parser.add_argument("--verbose", action="store_true", help="show Prefect's task-run logs too")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI: run the flow with a progress bar, print a summary, and end with one JSON line."""
    from rich.console import Console

    from flows.startup import start_api_and_actors
    from flows.summary import print_summary

    started = time.perf_counter()
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    console = Console(stderr=False)
    if not args.verbose:  # the progress bar tells the same story; keep warnings and errors
        for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).setLevel(logging.WARNING)
    last_line: list[str] = []
    # Registered before the flow starts Prefect's temporary server, so it runs after that server's
    # exit-time shutdown message: the JSON stays the last line of output.
    atexit.register(lambda: last_line and print(last_line[0], flush=True))
    params = {"run_name": args.run_name, "preset": args.preset, "seed": args.seed, "iterations": args.iterations,
              "env": args.env, "env_module": args.env_module, "randomize_dynamics": args.randomize_dynamics,
              "store": args.store, "num_ranks": args.num_ranks, "num_workers": args.num_workers,
              "envs_per_worker": args.envs_per_worker, "eval_episodes": args.eval_episodes, "overlap": args.overlap}
    cfg = None
    try:
        cfg = run_config(**params, rollout_steps=None)
        # A credentials block is read through the API, and Ray's workers must start with what it holds: then
        # the flow starts Ray itself, once the credentials are exported.
        if not args.store_credentials_block:
            start_api_and_actors(cfg)
        with progress.terminal_progress(console):
            summary = train_control(**params, store_credentials_block=args.store_credentials_block)
    except ConfigError as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    finally:
        if cfg is not None:
            release(cfg)  # the flow releases what it used; this catches actors started for a flow that never ran
    summary["command_s"] = round(time.perf_counter() - started, 2)
    print_summary(console, summary)
    last_line.append(json.dumps(summary_line(summary)))
    return 0


def summary_line(summary: dict) -> dict:
    """The machine-readable last line: the figures a script or CI checks."""
    keys = ("final_return", "random_return", "env_steps", "wall_s", "loop_s", "first_iteration_s", "command_s",
            "run_dir", "policy_sha256", "iterations")
    line = {k: summary[k] for k in keys}
    line["checkpoint_bytes"] = summary["checkpoints"]["stored_bytes"]
    return line


if __name__ == "__main__":
    sys.exit(main())
