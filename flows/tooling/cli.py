"""The command line, `gymflow` (the console script; the same as `python -m flows.tooling.cli`).

    gymflow train [options]           train a control agent (PPO on MuJoCo) through the train-control flow
    gymflow train-agent [options]     train an LLM agent (GRPO on text tasks) through the train-agent flow
    gymflow evaluate RUN [--video]    evaluate a stored version of a run; render it to MP4 or GIF
    gymflow runs [--store URL]        the runs under a store: newest version, iterations, last score, size
    gymflow export RUN --hf DIR | --safetensors FILE   a stored version as a model that loads without gymflow
    gymflow fork RUN[@VERSION] NEW [--set field=value ...]   a new run from a committed version of another (no copy)
    gymflow sweep run NAME --seeds S,.. --grid KEY=V,..   N runs (seeds x grid), at most --max-concurrent at a time
    gymflow sweep report NAME         a sweep's scores, 95% intervals and verdicts
    gymflow ckpt ls|show|verify|gc|export ...   inspect and maintain a run's checkpoint store
    gymflow ui [--stop]               a local Prefect server, the gymflow work pool, deployments and a worker
    gymflow serve-envs --task NAME    serve tasks to OpenEnv clients (HTTP and WebSocket, on 127.0.0.1)

`train` and `train-agent` run on embedded defaults (a temporary local Prefect API, a local Ray on 127.0.0.1, a
file:// store under ./runs) with a progress bar, print a summary and end with one JSON line. Their options are the
run's launch options (`rl_core.config.launch_options`), derived from the configuration models, each field's description
as its help.
"""
from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

from flows.tooling.fork import add_fork_parser, fork_command
from flows.tooling.serve_envs import add_serve_envs_parser, serve_envs_command
from flows.tooling.sweep_cli import add_sweep_parser, sweep_command
from rl_core.config.launch_options import LaunchOption, agent_launch_options, launch_options

SUMMARY_KEYS = ("final_return", "random_return", "env_steps", "wall_s", "loop_s", "first_iteration_s", "command_s",
                "startup_s", "run_dir", "policy_sha256", "iterations")
AGENT_SUMMARY_KEYS = ("accuracy_sft", "accuracy_final", "mean_reward_sft", "mean_reward_final", "tokens_generated",
                      "logprob_parity_max", "wall_s", "loop_s", "first_iteration_s", "command_s", "startup_s", "run_dir",
                      "policy_sha256", "iterations", "env")


def _train_parser(sub: argparse._SubParsersAction, command: str, text: str,
                  options: dict[str, LaunchOption]) -> None:
    parser = sub.add_parser(command, help=text, description=text[0].upper() + text[1:] + "; options left out take "
                            "the preset's values.", epilog=EXIT_CODES)
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


DEFAULT_STORE = "file://./runs"
EXIT_CODES = """exit status: 0 done; 1 the run or command failed (the error is printed; rerun a training command with
the same --run-name to continue from its newest committed version); 2 bad usage or configuration (the message
names the option); 130 interrupted."""


def _evaluate_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("evaluate", help="evaluate a stored version of a run; --video renders it",
                            description="Deterministic episodes of a stored version of a control run, recorded in "
                                        "<run>/evaluations/; with --video, episodes rendered offscreen (MuJoCo) to "
                                        "<run>/videos/.")
    parser.add_argument("run", metavar="RUN", help="the run's name (its folder under --store)")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"fsspec URL the run folder lives under "
                                                               f"(default: {DEFAULT_STORE})")
    parser.add_argument("--version", type=int, help="checkpoint version (default: the newest loadable)")
    parser.add_argument("--episodes", type=int, default=10, help="deterministic episodes (default: 10)")
    parser.add_argument("--video", action="store_true", help="also render episodes to a video in the run's folder")
    parser.add_argument("--video-format", choices=("mp4", "gif"), default="mp4", help="(default: mp4)")


def _runs_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("runs", help="list the runs under a store",
                            description="The runs under a store: kind, env, newest version, iterations asked for, "
                                        "last score (mean return or accuracy) and size.")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"fsspec URL (default: {DEFAULT_STORE})")
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")


def _export_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="write a stored version of a run as a model that loads without gymflow",
                            description="An agent run's policy as a Hugging Face model directory (config.json, "
                                        "model.safetensors, the tokenizer: what transformers' from_pretrained "
                                        "loads); a control run's policy as one safetensors file whose header says "
                                        "how to rebuild it (docs: guides/export.md).", epilog=EXIT_CODES)
    parser.add_argument("run", metavar="RUN", help="the run's name (its folder under --store)")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"fsspec URL the run folder lives under "
                                                               f"(default: {DEFAULT_STORE})")
    parser.add_argument("--version", type=int, help="checkpoint version (default: the newest loadable)")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--hf", metavar="DIR", help="agent runs: the Hugging Face model directory to write")
    output.add_argument("--safetensors", metavar="FILE", help="control runs: the safetensors file to write")
    parser.add_argument("--force", action="store_true", help="write over an existing file, or into a non-empty "
                                                             "directory (the files an export writes are replaced)")


def _ckpt_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("ckpt", add_help=False, help="inspect and maintain a checkpoint store: "
                                                         "ls|show|verify|gc|export (gymflow ckpt --help)")
    parser.add_argument("args", nargs=argparse.REMAINDER)


def _ui_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("ui", help="start (or --stop) a local Prefect UI with gymflow's deployments and a worker",
                            description="Starts a Prefect server on 127.0.0.1, creates the gymflow work pool, "
                                        "deploys prefect.yaml and starts a worker; prints where to click. "
                                        "--stop stops exactly the processes it started.")
    parser.add_argument("--stop", action="store_true", help="stop what `gymflow ui` started")
    parser.add_argument("--port", type=int, default=4200, help="the server's port on 127.0.0.1 (default: 4200)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gymflow", description=textwrap.dedent(__doc__.split("\n\n")[1]),
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _train_parser(sub, "train", "train a control agent (PPO on MuJoCo) through the train-control flow",
                  launch_options())
    _train_parser(sub, "train-agent", "train an LLM agent (GRPO on text tasks) through the train-agent flow",
                  agent_launch_options())
    _evaluate_parser(sub)
    _runs_parser(sub)
    _export_parser(sub)
    add_fork_parser(sub, DEFAULT_STORE, EXIT_CODES)
    add_sweep_parser(sub, DEFAULT_STORE, EXIT_CODES)
    _ckpt_parser(sub)
    _ui_parser(sub)
    add_serve_envs_parser(sub, EXIT_CODES)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; returns the exit status (`EXIT_CODES`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ckpt"]:  # its own parser: `gymflow ckpt --help` is the checkpoint tool's help
        from rl_core.checkpoint.cli import main as checkpoint_main

        return checkpoint_main(argv[1:], prog="gymflow ckpt")
    args = parse_args(argv)
    if args.command == "ui":
        return _ui(args)
    if args.command == "serve-envs":
        return serve_envs_command(args)
    from flows.tooling.defaults import apply_prefect_defaults

    apply_prefect_defaults()  # before anything imports prefect
    last_line: list[str] = []
    # Registered before a flow starts Prefect's temporary server, so it runs after that server's exit-time
    # shutdown message: the JSON stays the last line of output.
    atexit.register(lambda: last_line and print(last_line[0], flush=True))
    from rl_core.config.common import ConfigError
    from rl_core.data.run_info import RunInfoError
    from rl_core.data.run_lease import RunBusy

    commands = {"train": _train, "train-agent": _train_agent, "evaluate": _evaluate, "runs": _runs,
                "export": _export, "fork": fork_command, "sweep": sweep_command}
    try:
        result = commands[args.command](args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a failed run: one clear line (the task logs above hold the traceback)
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        # a busy run or an unreadable run.json: rerunning as is cannot help, and the error says what can
        if args.command in ("train", "train-agent") and not isinstance(err, (RunBusy, RunInfoError)):
            print("rerun the same command (same --run-name) to continue from the newest committed version",
                  file=sys.stderr)
        return 1
    if result is not None:
        last_line.append(json.dumps(result))
    return 0


def _train(args: argparse.Namespace) -> dict[str, Any]:
    from flows.run import progress
    from flows.tooling.summary import print_summary
    from rl_core.config.presets import build_control_config

    def actors_of(cfg: Any) -> Any:
        from rl_core.runtime.control.actors import ControlActors

        return ControlActors(cfg)

    def load_flow() -> Callable:
        from flows.train_control import train_control

        return train_control

    summary = _run_flow(args, launch_options(), build_control_config, actors_of, load_flow, progress.CONTROL_COLUMNS,
                        print_summary)
    return {**{k: summary[k] for k in SUMMARY_KEYS}, "checkpoint_bytes": summary["checkpoints"]["stored_bytes"]}


def _train_agent(args: argparse.Namespace) -> dict[str, Any]:
    from flows.run import progress
    from flows.tooling.summary import print_agent_summary
    from rl_core.config.presets import build_agent_config

    def actors_of(cfg: Any) -> Any:
        from rl_core.runtime.agent.actors import AgentActors

        return AgentActors(cfg)

    def load_flow() -> Callable:
        from flows.train_agent import train_agent

        return train_agent

    summary = _run_flow(args, agent_launch_options(), build_agent_config, actors_of, load_flow,
                        progress.AGENT_COLUMNS, print_summary=print_agent_summary)
    return {k: summary[k] for k in AGENT_SUMMARY_KEYS}


def _process_age_s() -> float:
    """Seconds since this process started. From the boot clock where Linux has one: psutil's create_time adds the
    boot time, which /proc keeps in whole seconds, so an age from it is off by up to a second."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            started_ticks = int(stat.read().rpartition(")")[2].split()[19])  # field 22, starttime
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()


def _run_flow(args: argparse.Namespace, table: dict[str, LaunchOption], build: Callable, actors_of: Callable,
              load_flow: Callable[[], Callable], columns: tuple[str, ...], print_summary: Callable) -> dict[str, Any]:
    """Validate the options; start Prefect's temporary API (when none is configured), Ray and the run's actors, and
    import the flow (`load_flow`), each without waiting for the one before (see flows/tooling/startup.py); run the
    flow under a progress bar and print its summary. Returns the summary with `command_s`, the whole command's
    seconds, and `startup_s`, from the process's start (the interpreter and every import included) to the start of
    the first iteration it trained (None when it trained none)."""
    from rich.console import Console

    from flows.run import progress
    from flows.tooling.orphan_guard import guard
    from rl_core.algos.preflight import preflight
    from rl_core.config.common import require_shared_store

    started = time.perf_counter()
    console = Console(stderr=False)
    options = {name: getattr(args, name) for name in table}
    cfg = preflight(build(**options))  # fails here, before anything starts, on a bad value
    require_shared_store(cfg.storage.url)
    guard()  # what this command starts (Prefect's temporary API, Ray) ends with it, even when it is SIGKILLed
    # A credentials block is read through the API, and Ray's workers must start with what it holds: then the flow
    # starts Ray itself, once the credentials are exported.
    if not args.store_credentials_block:
        from rl_core.runtime.local_ray import actor_cpus, start_ray_in_background

        start_ray_in_background(actor_cpus(cfg))  # while this thread imports torch, Prefect (flows/tooling/startup.py)
    from flows.tooling.startup import api_for_the_run, start_temporary_api

    api = start_temporary_api()
    actors = None if args.store_credentials_block else actors_of(cfg)
    try:
        if actors is not None:
            actors.start()
        flow = load_flow()
        _quiet_prefect(args.verbose)
        with api_for_the_run(api), progress.terminal_progress(console, columns):
            summary = flow(**options, store_credentials_block=args.store_credentials_block)
    finally:
        if actors is not None:
            actors.release()  # the flow releases what it used; this catches actors of a flow that never ran
    summary["command_s"] = round(time.perf_counter() - started, 2)
    first = summary.pop("first_iteration_at", None)
    summary["startup_s"] = None if first is None else round(first - time.time() + _process_age_s(), 2)
    print_summary(console, summary)
    return summary


def _quiet_prefect(verbose: bool) -> None:
    """Unless `verbose`, keep Prefect's warnings and errors only: the progress bar tells the same story."""
    if not verbose:
        for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from flows.evaluate import evaluate_policy
    from flows.tooling.orphan_guard import guard

    guard()
    _quiet_prefect(verbose=False)
    return evaluate_policy(args.run, args.store, args.version, args.episodes, video=args.video,
                           video_format=args.video_format)


def _runs(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    from rl_core.data.run_listing import list_runs

    rows = list_runs(args.store)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    console = Console()
    if not rows:
        console.print(f"no runs under {args.store}")
        return
    table = Table(title=f"runs under {args.store}")
    for column in ("run", "kind", "env", "created", "version", "iterations", "last score", "size"):
        table.add_column(column, justify="right" if column in ("version", "iterations", "size") else "left")
    for row in rows:
        score = "-" if row["score"] is None else f"{row['score_name']} {row['score']:.3g}"
        table.add_row(row["run"], row["kind"], row["env"], row["created"].replace("T", " "),
                      str(row["latest_version"]), str(row["iterations"]), score, f"{row['bytes'] / 1e6:.1f} MB")
    console.print(table)
    return


def _export(args: argparse.Namespace) -> dict[str, Any]:
    from flows.tooling.export import export_version

    fmt, target = ("hf", args.hf) if args.hf is not None else ("safetensors", args.safetensors)
    result = export_version(args.run, args.store, args.version, fmt, target, force=args.force)
    print(f"version {result['version']} of {args.run} -> {result[fmt]}")
    return result


def _ui(args: argparse.Namespace) -> int:
    from flows.tooling import ui_stack

    return ui_stack.stop() if args.stop else ui_stack.start(port=args.port)


def console_main() -> None:
    """The `gymflow` console script and `python -m flows.tooling.cli`: `main`, its exit handlers, then exit without the
    interpreter's teardown.

    Why: once the exit handlers have run (Prefect's temporary API stopped, Ray shut down, logs flushed, the JSON
    line printed), finalizing the modules a run loads (torch, Ray's core worker, Prefect) is a noticeable wait of
    its own and does nothing a run needs. An exception (argparse's exit included), or a thread still running that the
    interpreter would wait for, leaves the ordinary way.
    """
    if sys.argv[1:2] != ["ui"]:  # the UI's servers outlive the command: they keep the temp dir they were given
        from rl_core.private_temp import use_private_temp_dir

        # The command's own temp dir, and its processes' (Prefect's API, Ray's workers, the generator's vLLM
        # engine): removed at exit, after a failure or SIGTERM too, with whatever they left there. Here, not in
        # `main`, which a caller may run in its own process (tests), whose temp dir it must leave alone; and first,
        # so that its removal, an exit handler, runs after those that stop the processes.
        use_private_temp_dir("gymflow-command-")
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)  # threads the interpreter would wait for (an executor's work): the ordinary way
    if "ray" in sys.modules:  # a command that used Ray (importing it here would charge one without it Ray's import)
        from rl_core.runtime.local_ray import shutdown_local_ray

        try:
            shutdown_local_ray()  # Ray's own exit handler, faster (see there)
        except Exception as err:  # noqa: BLE001 - as an exit handler's error: reported, and the exit goes on
            print(f"warning: stopping Ray failed ({type(err).__name__}: {err}); Ray's exit handler tries again",
                  file=sys.stderr)
    atexit._run_exitfuncs()  # what the interpreter would run next, in the same order
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
