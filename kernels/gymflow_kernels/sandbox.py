"""Check one proposed candidate in this (separate) process and print the result as one JSON line.

    python -m gymflow_kernels.sandbox OP SHAPE_JSON SOURCE_PATH SEEDS MIN_RUN_TIME

Run by `kernels.proposers` under a timeout: the proposal is executed only here, never in the tuner's process, with
a scrubbed environment (no credentials), in a temporary directory, without network where `unshare -n` is allowed,
and under CPU-time and address-space limits. It goes through exactly the tuner's own verify-and-time step
(`tune_bucket`), as the op's only candidate.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import asdict
from pathlib import Path

import gymflow_kernels as kernels  # noqa: F401 - registers every op
from gymflow_kernels.autotune import tune_bucket
from gymflow_kernels.registry import get_op
from gymflow_kernels.report import CandidateResult

NAME = "proposed"


def main(argv: list[str]) -> int:
    """Load the proposal, tune it against the reference, print its `CandidateResult` (name "proposed")."""
    op_name, shape_json, source_path, seeds, min_run_time = argv
    op = get_op(op_name)
    namespace: dict = {"__name__": f"gymflow_proposal_{op_name}"}
    try:
        exec(compile(Path(source_path).read_text(), source_path, "exec"), namespace)  # noqa: S102 - the sandbox
        candidate = namespace["candidate"]
        if not callable(candidate):
            raise TypeError(f"`candidate` is a {type(candidate).__name__}, not a function")
    except Exception as exc:  # noqa: BLE001 - any failure to load is the proposal's fault, reported as such
        result = CandidateResult(NAME, verified=False, reason=f"does not load: {type(exc).__name__}: {exc}")
    else:
        trial = dataclasses.replace(op, candidates={NAME: candidate})
        bucket = tune_bucket(trial, json.loads(shape_json), seeds=int(seeds), min_run_time=float(min_run_time),
                             opt_in=frozenset())
        result = bucket.result(NAME)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
