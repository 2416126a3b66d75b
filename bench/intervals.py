"""bench/ppo.py's return statistics per task and system: mean, interquartile mean (IQM) and percentile bootstrap 95%
intervals, and gymflow's verdict against SB3 (the estimators: `rl_core.reporting.intervals`).

Run: ``python bench/intervals.py RESULTS.json`` re-reads what ``bench/ppo.py --results`` wrote and prints each
task's and system's figures and the verdict of gymflow against SB3.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from rl_core.reporting.intervals import summarize, verdict


def compare(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per task (``bench/ppo.py``'s key: 'halfcheetah'), per system: `summarize` of the final returns; and gymflow's
    (the in-process run, else the flow: the same weights) verdict against SB3."""
    out: dict[str, Any] = {}
    for task, by_system in runs.items():
        key = task.split("-")[0].lower()
        returns = {name: [r["final_return"] for r in rs] for name, rs in by_system.items()}
        if min(len(v) for v in returns.values()) < 2:
            continue
        for name, values in returns.items():
            out[f"returns_{name}_{key}"] = summarize(values)
        ours = returns.get("direct") or returns.get("flow")
        if ours and "sb3" in returns:
            # No margin is set against SB3: intervals that overlap read "not worse", as docs/benchmarks.md's rows say.
            out[f"return_verdict_{key}"] = verdict(ours, returns["sb3"], margin=math.inf)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a file bench/ppo.py --results wrote")
    args = parser.parse_args()
    for key, value in compare(json.loads(args.results.read_text())["runs"]).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
