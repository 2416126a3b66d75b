"""The command line: `gymflow train [options]`, `gymflow train-agent [options]` and `gymflow evaluate --run-name
NAME` (the console script; the same as `python -m flows.cli ...`).

`train` runs the control flow, `train-agent` the agent flow, on embedded defaults (a temporary local Prefect API, a
local Ray on 127.0.0.1, a file:// store under ./runs) with a progress bar, prints a summary and ends with one JSON
line. Their options are the run's launch options (`rl_core.launch_options`), derived from the configuration
models: `--env`, `--seed`, `--num-workers`... with each field's description as help.
"""
from __future__ import annotations

import argparse
import atexit
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from rl_core.launch_options import LaunchOption, agent_launch_options, launch_options

SUMMARY_KEYS = ("final_return", "random_return", "env_steps", "wall_s", "loop_s", "first_iteration_s", "command_s",
                "run_dir", "policy_sha256", "iterations")
AGENT_SUMMARY_KEYS = ("accuracy_sft", "accuracy_final", "mean_reward_sft", "mean_reward_final", "tokens_generated",
                      "logprob_parity_max", "wall_s", "loop_s", "first_iteration_s", "command_s", "run_dir",
                      "policy_sha256", "iterations", "env")


def _train_parser(sub: argparse._SubParsersAction, command: str, text: str,
                  options: dict[str, LaunchOption]) -> None:
    parser = sub.add_parser(command, help=text)
    for opt in options.values():
        flag = "--" + opt.name.replace("_", "-")
        default = f" (default: {opt.default})" if opt.default is not None else ""
        text = (opt.description + default).replace("%", "%%")  # argparse formats help with %
        if opt.kind is bool:  # --flag / --no-flag; unset: the preset's value
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, type=opt.kind, default=opt.entry_default, help=text)
    parser.add_argument("--store-credentials-block", metavar="SLUG",
                        help="Prefect block with the store's S3 credentials: secret/<name> or aws-credentials/<name>")
    parser.add_argument("--verbose", action="store_true", help="show Prefect's task-run logs too")


def _evaluate_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("evaluate", help="evaluate a stored version of a run (deterministic episodes)")
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--store", default="file://./runs", help="fsspec URL the run folder lives under")
    parser.add_argument("--version", type=int, help="checkpoint version (default: the newest loadable)")
    parser.add_argument("--episodes", type=int, default=10)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gymflow", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub, "train", "train a control agent (PPO on MuJoCo) through the train-control flow",
                  launch_options())
    _train_parser(sub, "train-agent", "train an LLM agent (GRPO on text tasks) through the train-agent flow",
                  agent_launch_options())
    _evaluate_parser(sub)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; exit status 2 for a configuration error (its message names the field)."""
    from flows.defaults import apply_prefect_defaults

    apply_prefect_defaults()  # before anything imports prefect
    args = parse_args(sys.argv[1:] if argv is None else argv)
    last_line: list[str] = []
    # Registered before a flow starts Prefect's temporary server, so it runs after that server's exit-time
    # shutdown message: the JSON stays the last line of output.
    atexit.register(lambda: last_line and print(last_line[0], flush=True))
    from rl_core.config import ConfigError

    commands = {"train": _train, "train-agent": _train_agent, "evaluate": _evaluate}
    try:
        result = commands[args.command](args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    last_line.append(json.dumps(result))
    return 0


def _train(args: argparse.Namespace) -> dict[str, Any]:
    from flows import progress
    from flows.summary import print_summary
    from flows.train_control import train_control
    from rl_core.run_presets import build_config
    from rl_core.runtime.actors import RunActors

    summary = _run_flow(args, launch_options(), build_config, RunActors, train_control, progress.CONTROL_COLUMNS,
                        print_summary)
    return {**{k: summary[k] for k in SUMMARY_KEYS}, "checkpoint_bytes": summary["checkpoints"]["stored_bytes"]}


def _train_agent(args: argparse.Namespace) -> dict[str, Any]:
    from flows import progress
    from flows.summary import print_agent_summary
    from flows.train_agent import train_agent
    from rl_core.agent_presets import build_agent_config
    from rl_core.runtime.agent_actors import AgentActors

    summary = _run_flow(args, agent_launch_options(), build_agent_config, AgentActors, train_agent,
                        progress.AGENT_COLUMNS, print_summary=print_agent_summary)
    return {k: summary[k] for k in AGENT_SUMMARY_KEYS}


def _run_flow(args: argparse.Namespace, table: dict[str, LaunchOption], build: Callable, actors_of: Callable,
              flow: Callable, columns: tuple[str, ...], print_summary: Callable) -> dict[str, Any]:
    """Validate the options, start Prefect's API and the run's actors side by side, run `flow` under a progress
    bar, print its summary; the summary with `command_s`, the whole command's seconds."""
    from rich.console import Console

    from flows import progress
    from flows.startup import start_api_and_actors

    started = time.perf_counter()
    console = Console(stderr=False)
    _quiet_prefect(args.verbose)
    options = {name: getattr(args, name) for name in table}
    cfg = build(**options)  # fails here, before anything starts, on a bad value
    # A credentials block is read through the API, and Ray's workers must start with what it holds: then the flow
    # starts Ray itself, once the credentials are exported.
    actors = None if args.store_credentials_block else start_api_and_actors(actors_of(cfg))
    try:
        with progress.terminal_progress(console, columns):
            summary = flow(**options, store_credentials_block=args.store_credentials_block)
    finally:
        if actors is not None:
            actors.release()  # the flow releases what it used; this catches actors of a flow that never ran
    summary["command_s"] = round(time.perf_counter() - started, 2)
    print_summary(console, summary)
    return summary


def _quiet_prefect(verbose: bool) -> None:
    """Unless `verbose`, keep Prefect's warnings and errors only: the progress bar tells the same story."""
    if not verbose:
        for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from flows.evaluate import evaluate_policy

    return evaluate_policy(args.run_name, args.store, args.version, args.episodes)


if __name__ == "__main__":
    sys.exit(main())
