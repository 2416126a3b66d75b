"""GAE kernel benchmark: median time per implementation and speedup vs the reference at typical rollout shapes.

Runs the tuner's own verify-and-time step (`tune_bucket`) without touching the winner cache, so it measures
exactly what `autotune` would decide. The last line is one JSON object:
    {"gae_speedup": {"256x64": <winner speedup>, ...}, "geomean_speedup": <geometric mean over shapes>}

Usage: python bench/kernels.py [--min-run-time SECONDS]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, and this file (bench/kernels.py) would shadow the
# `kernels` package it benchmarks; the repository root goes there instead.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from kernels import TuneReport, get_op  # noqa: E402
from kernels.autotune import DEFAULT_MIN_RUN_TIME, tune_bucket  # noqa: E402

SHAPES = ("256x64", "1024x64", "2048x16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=DEFAULT_MIN_RUN_TIME,
                        help="timing budget in seconds per implementation and shape")
    args = parser.parse_args()
    op = get_op("gae")
    speedups = {}
    for text in SHAPES:
        bucket = tune_bucket(op, op.parse_shape(text), min_run_time=args.min_run_time)
        print(TuneReport(op.name, [bucket]).table(), flush=True)
        speedups[text] = round(next(c.speedup for c in bucket.candidates if c.name == bucket.winner), 2)
    geomean = math.exp(sum(math.log(s) for s in speedups.values()) / len(speedups))
    print(json.dumps({"gae_speedup": speedups, "geomean_speedup": round(geomean, 2)}))


if __name__ == "__main__":
    main()
