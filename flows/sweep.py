"""A sweep as a Prefect flow: N member runs of one flow (seeds x a grid of overrides, `rl_core.config.sweep`), then
the sweep's report, as the parent run's artifacts and a page under the store (`<store>/<sweep>/report.md`).

    check the spec (once), build every member's config, record the sweep's identity (<store>/<sweep>/sweep.json)
    grid: for each member:  finished (newest version == its iterations, its result recorded)?  skip it
                            else  train-control | train-agent as a subflow, at most `max_concurrent` at a time
    pbt:  generations of `pbt.interval` iterations, the bottom quantile forking the top (flows/sweep_pbt.py)
    report: learning curves per group (members that differ only by seed), final scores with mean, IQM and bootstrap
            95% intervals, pairwise verdicts; then fail if a member failed (run the sweep again to resume it)

Members are **subflows**, not deployment runs: a sweep then needs no work pool, no worker and no deployment of the
member flows, and runs the same on the command line's temporary API as under a server, where the UI shows the sweep
as one parent run with its members as child flow runs. Deployment runs would spread members over workers of other
machines; here the members share this process's Ray, which a cluster's `RAY_ADDRESS` already spreads.

Concurrency is a **thread pool of `max_concurrent` workers**, Prefect's `ThreadPoolTaskRunner`, on which each member
is a task run (`sweep_member`) around its subflow. Not a global concurrency limit: its slots are leases held in the
server, which a killed sweep leaves taken until they expire (and only a server running its lease-expiry service
frees them), so a sweep run again at once could wait on its own dead members; the pool's bound ends with the
process. The members' Ray actors must fit at once: the sweep starts (or joins) Ray with CPUs for `max_concurrent`
members.

Each member is an ordinary run (its own folder, lease and checkpoints, under the sweep's store): a sweep run again
under its name skips finished members and continues the others from their newest version, bit-identical to a member
that was never interrupted, because that is what running a flow again under a run's name does.
"""
from __future__ import annotations

import base64
import io
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.sweep_member import SCORE, put_whole, read_record, train_members, write_record
from flows.sweep_pbt import train_population
from rl_core.checkpoint import CheckpointStore
from rl_core.config.common import ConfigError
from rl_core.config.sweep import Member, SweepSpec, load_spec
from rl_core.data import RunLayout
from rl_core.reporting import read_metrics
from rl_core.reporting.intervals import pairwise_verdicts, summarize
from rl_core.reporting.population_lineage import lineage_png
from rl_core.runtime.local_ray import actor_cpus, ensure_ray
from rl_core.runtime.warm_actors import reusing_actors
from tasks.artifact_keys import artifact_key

CURVE = {"control": ("env_steps_total", "mean_return"), "agent": ("tokens_total", "accuracy")}
"""A member's learning curve: (x, y) fields of its iteration records."""


@flow(name="sweep")
def sweep(name: str, flow: str = "control", seeds: list[int] | None = None,
          grid: dict[str, list[Any]] | None = None, options: dict[str, Any] | None = None,
          store: str = "file://./runs", max_concurrent: int = 2, margin: float = 0.05, strategy: str = "grid",
          pbt: dict[str, Any] | None = None) -> dict:
    """Train the sweep's members (at most `max_concurrent` at a time), then publish its report; returns the report.

    Args:
        name: The sweep's name: its page under the store, the prefix of its members' run names.
        flow: control (PPO on MuJoCo) or agent (GRPO on text tasks).
        seeds: Each point of the grid runs once per seed (default: 0 only).
        grid: Launch option (or a control run's algorithm field, e.g. learning_rate) -> the values tried.
        options: Launch options every member shares (preset, iterations, env...).
        store: fsspec URL under which the members' folders and the sweep's page live.
        max_concurrent: Members training at the same time (their Ray actors must fit together).
        margin: Non-inferiority margin of the verdicts, a fraction of the compared group's |mean| score.
        strategy: grid (each member trains to the end on its own) or pbt (population-based training).
        pbt: With strategy pbt: interval (iterations per generation), mutable (field -> [low, high]), quantile,
            factors.
    """
    given = {"name": name, "flow": flow, "seeds": seeds, "grid": grid, "options": options, "store": store,
             "max_concurrent": max_concurrent, "margin": margin, "strategy": strategy, "pbt": pbt}
    spec = load_spec({k: v for k, v in given.items() if v is not None})
    members = spec.members()
    logger = get_run_logger()
    record_identity(spec)
    ensure_ray(spec.max_concurrent * max(actor_cpus(m.config) for m in members))
    logger.info("sweep %s (%s): %d members, at most %d at a time", spec.name, spec.strategy, len(members),
                spec.max_concurrent)
    generations: list[dict[str, Any]] = []
    with reusing_actors() as processes:  # a finished member's actor processes serve the next one
        if spec.strategy == "pbt":
            results, failed, generations = train_population(spec, members, logger)
        else:
            results, failed = train_grid(spec, members)
    logger.info("sweep %s: %d actor processes started, %d reused", spec.name, processes.started_count,
                processes.reused_count)
    for member, why in failed.items():
        logger.error("sweep %s: member %s failed: %s", spec.name, member, why)
    report = sweep_report(spec, members, results, failed, generations)
    publish_report(spec, members, report)
    if failed:
        raise RuntimeError(f"sweep {spec.name}: {len(failed)} of {len(members)} members failed "
                           f"({', '.join(failed)}); run the sweep again to continue them from their newest versions")
    return report


def train_grid(spec: SweepSpec, members: list[Member]) -> tuple[dict[str, dict[str, Any] | None], dict[str, str]]:
    """Each member trained to its iterations on its own, the finished ones skipped; their results (None where a
    member has none) and the members that failed, with why."""
    results = {m.name: recorded_result(spec, m) for m in members}
    done, failed = train_members(spec, {m.name: (m.name, m.options) for m in members if results[m.name] is None},
                                 f"{spec.page}/members")
    return {**results, **done}, failed


def record_identity(spec: SweepSpec) -> None:
    """Write sweep.json for a new sweep; for an existing one, refuse another spec under its name, naming the fields
    that differ (its members' names and configs come from them)."""
    url = f"{spec.page}/sweep.json"
    wanted, stored = spec.identity(), read_record(url)
    if stored is None:
        write_record(url, wanted)
        return
    differ = sorted(k for k in wanted.keys() | stored.keys() if wanted.get(k) != stored.get(k))
    if differ:
        raise ConfigError(f"sweep {spec.name} exists at {spec.page} with other {', '.join(differ)} "
                          f"({', '.join(f'{k}: {stored.get(k)!r}' for k in differ)}); run it with those, or "
                          "name a new sweep")


def recorded_result(spec: SweepSpec, member: Member) -> dict[str, Any] | None:
    """A finished member's recorded result: its newest version is its iterations and the sweep recorded what its
    flow returned. None otherwise (trained, or only evaluated if it finished without its result recorded)."""
    latest = CheckpointStore(RunLayout(member.config.run_url).checkpoints).latest()
    return read_record(f"{spec.page}/members/{member.name}.json") if latest == member.config.iterations else None


def sweep_report(spec: SweepSpec, members: list[Member], results: dict[str, dict | None], failed: dict[str, str],
                 generations: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's data (report.json): per group its members' scores, mean and IQM with 95% intervals; the verdict
    of each ordered pair of groups; the members without a result, and the failed ones with why. A population's
    members form one group (exploiting mixes their grid points), and its report carries the generations."""
    groups: dict[str, list[float]] = {}
    rows = []
    for member in members:
        group = "population" if spec.strategy == "pbt" else member.group
        groups.setdefault(group, [])
        result = results.get(member.name)
        if result is not None:
            groups[group].append(float(result["score"]))
        rows.append({"member": member.name, "group": group, "seed": member.seed,
                     "score": None if result is None else result["score"],
                     "policy_sha256": None if result is None else result["policy_sha256"],
                     **({"error": failed[member.name]} if member.name in failed else {})})
    if generations:
        last = generations[-1]["members"]
        for row in rows:
            row.update(run=last[row["member"]]["run"], values=last[row["member"]]["values"])
    scored = {g: v for g, v in groups.items() if v}
    return {
        "sweep": spec.name, "flow": spec.flow, "strategy": spec.strategy, "score": SCORE[spec.flow],
        "margin": spec.margin,
        "groups": [{"group": g, "members": len(groups[g]), **summarize(v, digits=4)} for g, v in scored.items()],
        "verdicts": pairwise_verdicts(scored, spec.margin),
        "members": rows,
        "missing": [r["member"] for r in rows if r["score"] is None],
        "failed": failed,
        **({"generations": generations} if generations else {}),
    }


def curves_png(spec: SweepSpec, members: list[Member]) -> bytes:
    """One panel per group, each seed's learning curve overlaid (from the members' stored iteration records)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, on any machine
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    x_field, y_field = CURVE[spec.flow]
    groups: dict[str, list[Member]] = {}
    for member in members:
        groups.setdefault(member.group, []).append(member)
    figure, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.6), dpi=100, squeeze=False,
                                sharey=True)
    for axis, (group, seeded) in zip(axes[0], groups.items()):
        for member in seeded:
            records = [r for r in read_metrics(member.config.run_url)
                       if r.get(x_field) is not None and r.get(y_field) is not None]
            axis.plot([r[x_field] for r in records], [r[y_field] for r in records], marker="o", markersize=3,
                      label=f"seed {member.seed}")
        axis.set_title(group, fontsize=9)
        axis.set_xlabel(x_field.replace("_", " "))
        axis.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, not 200000 (long counts overlapped)
        axis.xaxis.set_major_locator(MaxNLocator(5))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    axes[0][0].set_ylabel(y_field.replace("_", " "))
    figure.suptitle(f"sweep {spec.name}")
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out.getvalue()


def score_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group: its runs, mean and IQM with their 95% intervals (the table artifact, the terminal's)."""
    def interval(pair: list[float] | None) -> str:
        return "-" if pair is None else f"[{pair[0]:.4g}, {pair[1]:.4g}]"

    return [{"group": g["group"], "runs": g["members"], "mean": g["mean"], "mean_ci95": interval(g["mean_ci95"]),
             "iqm": g["iqm"], "iqm_ci95": interval(g["iqm_ci95"])} for g in report["groups"]]


def report_markdown(report: dict[str, Any], figure: str) -> str:
    """report.md (and the markdown artifact, with `figure` a data: URI instead of the PNG's file name)."""
    table = score_table(report)
    pbt = report["strategy"] == "pbt"
    about = ("The population's final members form one group (members that exploit take other members' weights); "
             "intervals are percentile-bootstrap 95% over them." if pbt else
             "Groups are the members that differ only by seed; intervals are percentile-bootstrap 95% over the seeds.")
    lines = [f"# Sweep {report['sweep']}", "",
             f"{report['flow']} runs; score: `{report['score']}` (final evaluation). {about}", "",
             "| group | runs | mean | mean 95% CI | IQM | IQM 95% CI |", "|---|---:|---:|---|---:|---|"]
    lines += [f"| {r['group']} | {r['runs']} | {r['mean']:.4g} | {r['mean_ci95']} | {r['iqm']:.4g} | "
              f"{r['iqm_ci95']} |" for r in table]
    if report["verdicts"]:
        lines += ["", (f"Verdicts (A vs B: the 95% interval of mean(A) - mean(B); 'not worse': it holds 0 and lies "
                       f"above -{report['margin']:g} x |mean(B)|; 'inconclusive': neither claim holds, or under 2 "
                       "runs a side):"), "",
                  "| A | B | difference 95% CI | verdict |", "|---|---|---|---|"]
    for v in report["verdicts"]:
        ci = "-" if v["difference_ci95"] is None else f"[{v['difference_ci95'][0]:.4g}, {v['difference_ci95'][1]:.4g}]"
        lines.append(f"| {v['group']} | {v['versus']} | {ci} | **{v['verdict']}** |")
    if pbt:
        lines += ["", "| member | last run | score | values |", "|---|---|---:|---|"]
        lines += [f"| {r['member']} | {r.get('run', '-')} | {'-' if r['score'] is None else format(r['score'], '.4g')} "
                  f"| {', '.join(f'{k}={v:.4g}' for k, v in r.get('values', {}).items())} |" for r in report["members"]]
        lines += ["", "Exploits (after the generation ending at version v, member <- source, new values):", ""]
        lines += [f"- v{g['version']}: " + ("; ".join(f"{e['member']} <- {e['source']} "
                                                     f"({', '.join(f'{k}={v:.4g}' for k, v in e['values'].items())})"
                                                     for e in g["exploits"]) or "none")
                  for g in report.get("generations", []) if "exploits" in g]
    if report["failed"]:
        lines += ["", "**Failed** (run the sweep again to continue them):", ""]
        lines += [f"- {member}: {why}" for member, why in report["failed"].items()]
    missing = [m for m in report["missing"] if m not in report["failed"]]
    if missing:
        lines += ["", f"**Not finished** (no score yet; run the sweep again): {', '.join(missing)}."]
    lines += ["", f"![{'lineage' if pbt else 'learning curves'}]({figure})"]
    return "\n".join(lines)


def publish_report(spec: SweepSpec, members: list[Member], report: dict[str, Any]) -> None:
    """report.json, report.md and the figure (curves.png; lineage.png for a population) under the sweep's page; a
    table and a markdown artifact on this run."""
    if spec.strategy == "pbt":
        name, png = "lineage.png", lineage_png(report.get("generations", []), f"sweep {spec.name}", report["score"])
    else:
        name, png = "curves.png", curves_png(spec, members)
    write_record(f"{spec.page}/report.json", report)
    put_whole(f"{spec.page}/{name}", png)
    put_whole(f"{spec.page}/report.md", report_markdown(report, name).encode())
    create_table_artifact(key=artifact_key(spec.name, "sweep-scores"), table=score_table(report),
                          description=f"sweep {spec.name}: final {report['score']} per group (95% intervals)")
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    create_markdown_artifact(key=artifact_key(spec.name, "sweep-report"), markdown=report_markdown(report, uri),
                             description=f"sweep {spec.name}: scores, verdicts, {name[:-4]} ({spec.page}/report.md)")
