"""`gymflow sweep run NAME ...` trains a sweep's member runs through the sweep flow (flows/sweep.py); `gymflow sweep
report NAME` prints its report's table from the store (docs: guides/sweeps.md).

The spec comes from `--spec FILE` (YAML, `rl_core.config.sweep.SweepSpec`'s fields) with the flags over it, and is
checked (every member's configuration built, the preflight run) before Prefect or Ray start.
"""
from __future__ import annotations

import argparse
from typing import Any

SWEEP_HELP = ("train a sweep of runs (seeds x a grid of overrides, or a population: --strategy pbt) and report it, or "
              "print a sweep's report")


def add_sweep_parser(sub: argparse._SubParsersAction, default_store: str, epilog: str) -> None:
    """The `sweep` subcommand and its own two: `run` and `report`."""
    parser = sub.add_parser("sweep", help=SWEEP_HELP, epilog=epilog,
                            description="A sweep is N ordinary runs of one flow, one per seed and point of a grid "
                                        "of overrides, trained at most --max-concurrent at a time; running it again "
                                        "skips finished members and continues the others.")
    commands = parser.add_subparsers(dest="sweep_command", required=True, metavar="run|report")
    run = commands.add_parser("run", help="train the sweep's members, then write its report", epilog=epilog)
    run.add_argument("name", metavar="NAME", help="the sweep's name (its page under --store, its members' prefix)")
    run.add_argument("--spec", metavar="FILE", help="a YAML file of the sweep's fields (flow, seeds, grid, options, "
                                                    "store, max_concurrent, margin); flags given override it")
    run.add_argument("--flow", choices=("control", "agent"), help="which flow's runs (default: control)")
    run.add_argument("--seeds", metavar="S,S,...", help="seeds, comma-separated (default: 0)")
    run.add_argument("--grid", action="append", default=[], metavar="KEY=V,V,...",
                     help="a launch option (or a control run's algorithm field) and the values tried; repeat for "
                          "more axes, e.g. --grid learning_rate=1e-3,3e-4")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="a launch option every member shares, e.g. --set preset=tiny --set iterations=20")
    run.add_argument("--store", help=f"fsspec URL of the members' folders and the report (default: {default_store})")
    run.add_argument("--max-concurrent", type=int, help="members training at the same time (default: 2)")
    run.add_argument("--margin", type=float, help="non-inferiority margin of the verdicts, a fraction of the "
                                                  "compared group's |mean| (default: 0.05)")
    run.add_argument("--strategy", choices=("grid", "pbt"), help="grid: each member trains to the end on its own; "
                                                                 "pbt: population-based training (default: grid)")
    run.add_argument("--interval", type=int, help="pbt: iterations per generation (between decisions)")
    run.add_argument("--quantile", type=float, help="pbt: the bottom fraction that exploits the top (default: 0.25)")
    run.add_argument("--mutable", action="append", default=[], metavar="FIELD=LOW,HIGH",
                     help="pbt: a numeric field perturbed on exploit, kept in [LOW, HIGH]; repeat for more, e.g. "
                          "--mutable learning_rate=1e-5,1e-2")
    report = commands.add_parser("report", help="print a sweep's report (scores, intervals, verdicts)")
    report.add_argument("name", metavar="NAME", help="the sweep's name")
    report.add_argument("--store", default=default_store, help=f"fsspec URL (default: {default_store})")


def sweep_command(args: argparse.Namespace) -> dict[str, Any] | None:
    """`sweep run` or `sweep report`."""
    return run_sweep(args) if args.sweep_command == "run" else print_report(args.name, args.store)


def spec_values(args: argparse.Namespace) -> dict[str, Any]:
    """The spec's fields: the --spec file's, then the flags given."""
    import yaml

    from rl_core.config.common import ConfigError
    from rl_core.config.sweep import parse_values

    values: dict[str, Any] = {}
    if args.spec:
        try:
            with open(args.spec, encoding="utf-8") as file:
                values = yaml.safe_load(file) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"--spec {args.spec}: {err}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"--spec {args.spec}: expected a mapping of sweep fields, found {type(values).__name__}")
    values["name"] = args.name
    for flag in ("flow", "store", "max_concurrent", "margin", "strategy"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    if args.seeds is not None:
        values["seeds"] = parse_values(args.seeds)
    for flag, target in (("grid", "grid"), ("set", "options")):
        for item in getattr(args, flag):
            key, equals, text = item.partition("=")
            if not equals or not key:
                raise ConfigError(f"--{flag} {item!r}: expected KEY=VALUE{',VALUE...' if flag == 'grid' else ''}")
            parsed = parse_values(text)
            values.setdefault(target, {})[key.strip()] = parsed if flag == "grid" else parsed[0] if parsed else text
    pbt = {k: getattr(args, k) for k in ("interval", "quantile") if getattr(args, k) is not None}
    for item in args.mutable:
        key, equals, text = item.partition("=")
        if not equals or not key or len(parse_values(text)) != 2:
            raise ConfigError(f"--mutable {item!r}: expected FIELD=LOW,HIGH, e.g. learning_rate=1e-5,1e-2")
        pbt.setdefault("mutable", {})[key.strip()] = parse_values(text)
    if pbt:
        values["pbt"] = {**(values.get("pbt") or {}), **pbt}
    return values


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Check the spec and every member, start Prefect's temporary API (when none is configured) and Ray, run the
    sweep flow, print its table. Returns the command's JSON summary."""
    from flows.tooling.orphan_guard import guard
    from flows.tooling.startup import api_for_the_run, start_temporary_api
    from rl_core.algos.preflight import preflight
    from rl_core.config.common import require_shared_store
    from rl_core.config.sweep import load_spec
    from rl_core.runtime.local_ray import actor_cpus, ensure_ray

    spec = load_spec(spec_values(args))
    members = spec.members()
    for member in members:
        preflight(member.config)
    require_shared_store(spec.store)
    guard()  # what this command starts (Prefect's temporary API, Ray) ends with it, even when it is SIGKILLed
    ensure_ray(spec.max_concurrent * max(actor_cpus(m.config) for m in members))
    api = start_temporary_api()
    from flows.sweep import sweep

    with api_for_the_run(api):
        report = sweep(**spec.model_dump(mode="json"))
    print_report(spec.name, spec.store)
    return {"sweep": spec.name, "strategy": spec.strategy, "members": len(members), "missing": report["missing"],
            "report": f"{spec.store.rstrip('/')}/{spec.name}/report.md"}


def print_report(name: str, store: str) -> None:
    """The report's tables in the terminal, from `<store>/<name>/report.json`."""
    import json

    import fsspec
    from rich.console import Console
    from rich.table import Table

    from flows.sweep import score_table
    from rl_core.config.common import ConfigError

    url = f"{store.rstrip('/')}/{name}/report.json"
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        raise ConfigError(f"sweep {name}: no report at {url}; `gymflow sweep run {name} ...` writes it")
    report = json.loads(fs.cat_file(path))
    console = Console()
    scores = Table(title=f"sweep {name}: {report['score']} per group (bootstrap 95% intervals)")
    for column in ("group", "runs", "mean", "mean 95% CI", "IQM", "IQM 95% CI"):
        scores.add_column(column, justify="left" if column == "group" else "right", overflow="fold",
                          no_wrap=column != "group")
    for row in score_table(report):
        scores.add_row(row["group"], str(row["runs"]), f"{row['mean']:.4g}", row["mean_ci95"], f"{row['iqm']:.4g}",
                       row["iqm_ci95"])
    console.print(scores)
    verdicts = Table(title=f"A vs B (margin {report['margin']:g} x |mean(B)|)")
    for column in ("A", "B", "difference 95% CI", "verdict"):
        verdicts.add_column(column, overflow="fold", no_wrap=column in ("difference 95% CI", "verdict"))
    for v in report["verdicts"]:
        ci = v["difference_ci95"]
        verdicts.add_row(v["group"], v["versus"], "-" if ci is None else f"[{ci[0]:.4g}, {ci[1]:.4g}]", v["verdict"])
    if report["verdicts"]:
        console.print(verdicts)
    if report.get("strategy") == "pbt":
        population = Table(title="population (last run of each member, its values)")
        for column in ("member", "last run", "score", "values"):
            population.add_column(column, overflow="fold")
        for row in report["members"]:
            values = ", ".join(f"{k}={v:.4g}" for k, v in row.get("values", {}).items())
            population.add_row(row["member"], row.get("run", "-"),
                               "-" if row["score"] is None else f"{row['score']:.4g}", values)
        console.print(population)
    for member, why in report.get("failed", {}).items():
        console.print(f"failed: {member}: {why}")
    missing = [m for m in report["missing"] if m not in report.get("failed", {})]
    if missing:
        console.print(f"not finished: {', '.join(missing)} (run the sweep again)")
