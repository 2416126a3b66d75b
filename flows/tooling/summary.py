"""The end-of-run summary a person reads (the JSON line after it is for scripts)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def print_summary(console: Console, summary: dict) -> None:
    """Return against random, work done, wall time, checkpoint sizes and where the run lives."""
    table = Table(title="gymflow run summary", show_header=False)
    table.add_row("final return (deterministic, mean of "
                  f"{summary['episodes']} episodes)", f"{summary['final_return']:.1f} ± {summary['final_return_std']:.1f}")
    table.add_row("random policy return", f"{summary['random_return']:.1f}")
    table.add_row("iterations / env steps", f"{summary['iterations']} / {summary['env_steps']:,}")
    _time_and_storage_rows(table, summary)
    table.add_row("run folder", summary["run_dir"])
    table.add_row("policy sha256", summary["policy_sha256"][:16] + "…")
    console.print(table)


def _time_and_storage_rows(table: Table, summary: dict) -> None:
    """Wall times (flow run, iterations, command) and the checkpoints' count and storage."""
    ck = summary["checkpoints"]
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
        table.add_row("mean version size / torch.save",
                      f"{ck['mean_encoded_bytes'] / ck['latest_torch_save_bytes']:.2f}")


def print_agent_summary(console: Console, summary: dict) -> None:
    """Held-out accuracy and reward before and after RL, tokens, parity, wall time, checkpoints, where the run lives."""
    table = Table(title=f"gymflow agent run summary ({summary['env']})", show_header=False)
    table.add_row("held-out accuracy: warm start (SFT) -> final",
                  f"{summary['accuracy_sft']:.1%} -> {summary['accuracy_final']:.1%}")
    table.add_row("held-out mean reward: warm start -> final",
                  f"{summary['mean_reward_sft']:.3f} -> {summary['mean_reward_final']:.3f}")
    table.add_row("iterations / tokens generated", f"{summary['iterations']} / {summary['tokens_generated']:,}")
    parity = summary["logprob_parity_max"]
    table.add_row("log-prob parity, trainer vs generator (max)", "-" if parity is None else f"{parity:.1e}")
    _time_and_storage_rows(table, summary)
    table.add_row("run folder", summary["run_dir"])
    table.add_row("policy sha256", summary["policy_sha256"][:16] + "…")
    console.print(table)
