"""Command line of the tuner: `python -m gymflow_kernels`.

    python -m gymflow_kernels --ops gae,ppo_loss --report
    python -m gymflow_kernels --ops gae --shapes 256x64 1024x64 --compile --json report.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from gymflow_kernels.autotune import DEFAULT_MIN_RUN_TIME, autotune, default_opt_in
from gymflow_kernels.cache import winners_path
from gymflow_kernels.proposers import RenamedVariable, proposer_from_env
from gymflow_kernels.registry import COMPILE, get_op, registered_ops
from gymflow_kernels.report import TuneReport, summary
from gymflow_kernels.verify import MIN_SEEDS

PLACEMENT = {"device": "cpu", "dtype": "float32"}
"""What ops' inputs are made as unless --device/--dtype say otherwise (left out of the shapes then)."""


def main(argv: list[str] | None = None) -> int:
    """Tune the given ops (at the given shapes, else each op's default shapes); print winners or the full report."""
    parser = argparse.ArgumentParser(prog="python -m gymflow_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", required=True,
                        help=f"ops to tune, space- or comma-separated; registered: {','.join(registered_ops())}")
    parser.add_argument("--shapes", nargs="+", help="shapes like 256x64 in the op's dims (default: the op's own)")
    parser.add_argument("--device", default="cpu", help="device to tune on, e.g. cuda (adds Triton candidates)")
    parser.add_argument("--dtype", default="float32", help="dtype to tune, e.g. bfloat16 (verified at 1e-2)")
    parser.add_argument("--report", action="store_true", help="print the full report as a table and as JSON")
    parser.add_argument("--json", type=Path, help="also write the report (with fast_p and geomean) to this file")
    parser.add_argument("--force", action="store_true", help="re-tune buckets that already have a cached winner")
    parser.add_argument("--compile", action="store_true",
                        help="also try torch.compile candidates (a cold compile can take minutes per candidate)")
    parser.add_argument("--propose", action="store_true",
                        help="also check candidates proposed by GYMFLOW_KERNEL_PROPOSER_URL (in a subprocess)")
    parser.add_argument("--calls-per-run", type=int, help="calls a JIT compile is amortised over (default: op's)")
    parser.add_argument("--min-run-time", type=float, default=DEFAULT_MIN_RUN_TIME,
                        help="timing budget in seconds per implementation and bucket")
    parser.add_argument("--seeds", type=int, default=MIN_SEEDS, help="random seeds verified per bucket")
    args = parser.parse_args(argv)
    names = [name for text in args.ops for name in text.split(",") if name]
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: torch {torch.__version__} sees no CUDA device here; tune on a GPU machine")
    opt_in = default_opt_in() | ({COMPILE} if args.compile else set())
    proposer = None
    if args.propose:
        try:
            proposer, message = proposer_from_env()
        except RenamedVariable as exc:
            parser.error(str(exc))
        if proposer is None:
            print(message, file=sys.stderr)
    reports = []
    for name in names:
        try:
            spec = get_op(name)
            shapes = [spec.parse_shape(text) for text in args.shapes] if args.shapes else list(spec.default_shapes)
        except (KeyError, ValueError) as exc:
            parser.error(exc.args[0])
        placement = {k: v for k, v in {"device": args.device, "dtype": args.dtype}.items() if v != PLACEMENT[k]}
        shapes = [{**shape, **placement} for shape in shapes]
        reports.append(autotune(name, shapes, force=args.force, seeds=args.seeds, min_run_time=args.min_run_time,
                                opt_in=frozenset(opt_in), calls_per_run=args.calls_per_run, proposer=proposer))
    _print(reports, args.report)
    if args.json:
        args.json.write_text(json.dumps(summary(reports), indent=1))
    return 0


def _print(reports: list[TuneReport], full: bool) -> None:
    for report in reports:
        if full:
            print(report.table())
        else:
            for b in report.buckets:
                print(f"{report.op} {','.join(f'{k}={v}' for k, v in b.bucket.items())}: {b.winner}"
                      f"{' (cache hit)' if b.cache_hit else ''}")
    if full:
        print(json.dumps(summary(reports), indent=2))
    print(f"winners cached in {winners_path()}", file=sys.stderr)
