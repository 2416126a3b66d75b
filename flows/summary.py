"""The end-of-run summary a person reads (the JSON line after it is for scripts)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def print_summary(console: Console, summary: dict) -> None:
    """Return against random, work done, wall time, checkpoint sizes and where the run lives."""
    ck = summary["checkpoints"]
    table = Table(title="gymflow run summary", show_header=False)
    table.add_row("final return (deterministic, mean of "
                  f"{summary['episodes']} episodes)", f"{summary['final_return']:.1f} ± {summary['final_return_std']:.1f}")
    table.add_row("random policy return", f"{summary['random_return']:.1f}")
    table.add_row("iterations / env steps", f"{summary['iterations']} / {summary['env_steps']:,}")
    table.add_row("wall time (flow run)", f"{summary['wall_s']:.1f} s")
    table.add_row("wall time (this run's iterations; the first of them)",
                  f"{summary['loop_s']:.1f} s; {summary['first_iteration_s']:.1f} s")
    if "command_s" in summary:
        table.add_row("wall time (command: Prefect API, Ray and flow)", f"{summary['command_s']:.1f} s")
    table.add_row("checkpoint versions", f"{ck['versions']} (latest v{ck.get('latest_version', '-')})")
    if ck["versions"]:
        table.add_row("checkpoint storage, all versions", _mb(ck["stored_bytes"]))
        table.add_row("latest version: encoded / raw / torch.save",
                      f"{_mb(ck['latest_encoded_bytes'])} / {_mb(ck['latest_raw_bytes'])} / "
                      f"{_mb(ck['latest_torch_save_bytes'])}")
        table.add_row("mean version size / torch.save", f"{ck['mean_encoded_bytes'] / ck['latest_torch_save_bytes']:.2f}")
    table.add_row("run folder", summary["run_dir"])
    table.add_row("policy sha256", summary["policy_sha256"][:16] + "…")
    console.print(table)
