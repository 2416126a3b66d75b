"""The command line: `gymflow train [options]` and `gymflow evaluate --run-name NAME` (the console script; the same
as `python -m flows.cli ...`).

`train` runs the control flow on embedded defaults (a temporary local Prefect API, a local Ray on 127.0.0.1, a
file:// store under ./runs) with a progress bar, prints a summary and ends with one JSON line. Its options are the
run's launch options (`rl_core.launch_options`), derived from the configuration models: `--env`, `--seed`,
`--num-workers`... with each field's description as help.
"""
from __future__ import annotations

import argparse
import atexit
import json
import logging
import sys
import time
from typing import Any

from rl_core.launch_options import launch_options

SUMMARY_KEYS = ("final_return", "random_return", "env_steps", "wall_s", "loop_s", "first_iteration_s", "command_s",
                "run_dir", "policy_sha256", "iterations")


def _train_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train a control agent (PPO on MuJoCo) through the train-control flow")
    for opt in launch_options().values():
        flag = "--" + opt.name.replace("_", "-")
        default = f" (default: {opt.default})" if opt.default is not None else ""
        if opt.kind is bool:
            parser.add_argument(flag, action="store_const", const=True, help=opt.description + default)
        else:
            parser.add_argument(flag, type=opt.kind, default=opt.entry_default, help=opt.description + default)
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
    _train_parser(sub)
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

    try:
        result = _train(args) if args.command == "train" else _evaluate(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    last_line.append(json.dumps(result))
    return 0


def _train(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console

    from flows import progress
    from flows.startup import start_api_and_actors
    from flows.summary import print_summary
    from flows.train_control import train_control
    from rl_core.run_presets import build_config

    started = time.perf_counter()
    console = Console(stderr=False)
    if not args.verbose:  # the progress bar tells the same story; keep warnings and errors
        for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).setLevel(logging.WARNING)
    options = {name: getattr(args, name) for name in launch_options()}
    cfg = build_config(**options)  # fails here, before anything starts, on a bad value
    # A credentials block is read through the API, and Ray's workers must start with what it holds: then the flow
    # starts Ray itself, once the credentials are exported.
    actors = None if args.store_credentials_block else start_api_and_actors(cfg)
    try:
        with progress.terminal_progress(console):
            summary = train_control(**options, store_credentials_block=args.store_credentials_block)
    finally:
        if actors is not None:
            actors.release()  # the flow releases what it used; this catches actors of a flow that never ran
    summary["command_s"] = round(time.perf_counter() - started, 2)
    print_summary(console, summary)
    line = {k: summary[k] for k in SUMMARY_KEYS}
    line["checkpoint_bytes"] = summary["checkpoints"]["stored_bytes"]
    return line


def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from flows.evaluate import evaluate_policy

    return evaluate_policy(args.run_name, args.store, args.version, args.episodes)


if __name__ == "__main__":
    sys.exit(main())
