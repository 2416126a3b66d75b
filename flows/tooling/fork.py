"""`gymflow fork RUN[@VERSION] NEW [--set field=value ...]`: a new run that starts from a committed version of another
run in the same store, sharing its checkpoint objects (docs: guides/forks.md).

The checks and the writes are `rl_core.data.run_fork`'s; this is the command's edge: it parses the arguments, runs the
preflight (what the world must accept of the new config), borrows the versions the fork's run reads (`borrow`: its
version, the one before with overlap or staleness, an agent run's warm start) and prints the training command
that continues the fork. That command must rebuild the fork's config exactly (a continued run's options are checked
against its run.json), so a change no training option can express is refused here, before anything is written.
"""
from __future__ import annotations

import argparse
from typing import Any

FORK_HELP = "start a new run from a committed version of another run, sharing its checkpoints (no copy)"


def add_fork_parser(sub: argparse._SubParsersAction, default_store: str, epilog: str) -> None:
    """The `fork` subcommand's arguments."""
    parser = sub.add_parser("fork", help=FORK_HELP, epilog=epilog,
                            description="Starts run NEW from version VERSION (default: the newest) of run RUN in the "
                                        "same store: NEW's first version borrows RUN's checkpoint objects, pinned "
                                        "so RUN's gc keeps them. Fields that change what the state is (the task, "
                                        "the model's shape, the store) are refused; the rest may change with --set. "
                                        "Then the printed training command continues NEW.")
    parser.add_argument("run", metavar="RUN[@VERSION]", help="the run to fork, and which committed version")
    parser.add_argument("new", metavar="NEW", help="the new run's name (its folder under --store)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a field of the run's configuration (dotted, e.g. algorithm.learning_rate=1e-4, "
                             "iterations=300); repeat for several")
    parser.add_argument("--store", default=default_store, help=f"fsspec URL both runs live under "
                                                               f"(default: {default_store})")


def fork_command(args: argparse.Namespace) -> dict[str, Any]:
    """Plan, check and make the fork; print how to continue it. Returns the command's JSON summary."""
    from rl_core.algos.preflight import preflight
    from rl_core.config.common import ConfigError
    from rl_core.data.run_fork import parse_sets, plan_fork

    parent, at, version = args.run.partition("@")
    if at and not version.isdigit():
        raise ConfigError(f"RUN[@VERSION] {args.run!r}: the version after '@' is a number, e.g. {parent}@12")
    plan = plan_fork(args.store, parent, args.new, int(version) if at else None, parse_sets(args.set))
    command = training_command(preflight(plan.cfg))
    made = borrow(plan)
    versions = made["versions"]
    print(f"run {args.new} starts from version {plan.version} of run {parent} (borrowed: version"
          f"{'s' if len(versions) > 1 else ''} {', '.join(map(str, versions))}; no checkpoint object copied)")
    print(f"continue it with: {' '.join(command)}")
    return {**made, "continue": command}


def borrow(plan: Any) -> dict[str, Any]:
    """Make the planned fork (`rl_core.data.run_fork.ForkPlan`), borrowing the versions its run reads: the forked
    one, the one its first iteration samples from (with overlap or staleness: `Algorithm.behaviour_version`) and, for
    an agent run, version 0, the warm start whose held-out accuracy every run of the lineage reports."""
    from rl_core.algos.base import algorithm_of
    from rl_core.config.agent import AgentRunConfig
    from rl_core.data.run_fork import make_fork

    cfg = plan.cfg
    warm = {0} if isinstance(cfg, AgentRunConfig) else set()
    return make_fork(plan, sorted({algorithm_of(cfg).behaviour_version(cfg, plan.version), plan.version} | warm))


def training_command(cfg: Any) -> list[str]:
    """The `gymflow train` (or `train-agent`) command that builds exactly `cfg`: a size preset and a flag for each
    field whose value differs from the preset's. A ConfigError names the fields no option sets (with the fewest such
    fields over the presets) when no command does."""
    from rl_core.config.agent import AgentRunConfig
    from rl_core.config.common import ConfigError
    from rl_core.config.launch_options import agent_launch_options, launch_options
    from rl_core.config.presets import AGENT_PRESETS, CONTROL_PRESETS, build_agent_config, build_control_config
    from rl_core.data.run_info import dotted_fields

    agent = isinstance(cfg, AgentRunConfig)
    table = agent_launch_options() if agent else launch_options()
    build = build_agent_config if agent else build_control_config
    sections = type(cfg).SECTIONS
    want = dotted_fields(cfg.model_dump(mode="json"), sections)
    fixed = {"run_name": cfg.run_name, "store": cfg.storage.url}
    if not agent and cfg.env.randomization is not None:
        fixed["randomize_dynamics"] = round(1.0 - cfg.env.randomization.mass[0], 12)  # a symmetric range's, if it is
    fewest: list[str] | None = None
    shortest: list[str] | None = None
    for preset in AGENT_PRESETS if agent else CONTROL_PRESETS:
        try:
            base = dotted_fields(build(preset=preset, **fixed).model_dump(mode="json"), sections)
            flags = {name: want.get(".".join(o.path)) for name, o in table.items()
                     if o.path and name not in fixed and base.get(".".join(o.path)) != want.get(".".join(o.path))}
            got = dotted_fields(build(preset=preset, **fixed, **flags).model_dump(mode="json"), sections)
        except ConfigError:  # a preset this machine cannot build (a packaged model not installed), or flags it refuses
            continue
        missing = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        command = ["gymflow", "train-agent" if agent else "train", "--preset", preset,
                   *(arg for name, value in {**fixed, **flags}.items() for arg in _flag(name, value))]
        if not missing and (shortest is None or len(command) < len(shortest)):
            shortest = command
        if missing and (fewest is None or len(missing) < len(fewest)):
            fewest = missing
    if shortest is not None:
        return shortest
    name = "gymflow train-agent" if agent else "gymflow train"
    raise ConfigError(f"`{name}` has no option for {', '.join(fewest or ['this configuration'])}, so it could not "
                      "continue this fork (a continued run's options must rebuild its configuration); change only "
                      f"fields it has options for ({name} --help)")


def _flag(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    return [flag, str(value)]
