"""Fault injection for resilience tests and drills: fail a named point once, in whichever process reaches it.

`GYMFLOW_FAULTS` holds `;`-separated specs `point:key=value,...`, e.g. `train.epoch_end:iteration=1,rank=0,epoch=3`.
A spec fires when the point is reached with matching context, once (or `count=N` times): each firing leaves a
marker file in `GYMFLOW_FAULT_DIR` (required when faults are set), so the retries after it run normally.
Unset: no-op.
Env workers and trainer ranks receive the GYMFLOW_* variables of the driver (see `gymflow_env_vars`).
"""
from __future__ import annotations

import hashlib
import os


class InjectedFault(RuntimeError):
    """Raised at a fault-injection point; never raised unless GYMFLOW_FAULTS asks for it."""


def gymflow_env_vars() -> dict[str, str]:
    """The driver's GYMFLOW_* settings, to hand to Ray actors (a cluster's workers do not inherit them)."""
    return {k: v for k, v in os.environ.items() if k.startswith("GYMFLOW_")}


def maybe_fail(point: str, **context: object) -> None:
    """Raise InjectedFault if a GYMFLOW_FAULTS spec names `point` with this context and has not fired yet."""
    specs = os.environ.get("GYMFLOW_FAULTS")
    if not specs:
        return
    for spec in specs.split(";"):
        name, _, conditions = spec.strip().partition(":")
        if name != point:
            continue
        wanted = dict(c.split("=", 1) for c in conditions.split(",") if c)
        count = int(wanted.pop("count", "1"))
        if any(str(context.get(k)) != v for k, v in wanted.items()):
            continue
        tag = hashlib.sha256(spec.strip().encode()).hexdigest()[:16]
        for firing in range(count):
            try:
                with open(os.path.join(os.environ["GYMFLOW_FAULT_DIR"], f"{tag}-{firing}"), "x"):
                    pass
            except FileExistsError:
                continue
            raise InjectedFault(f"injected fault at {point} ({spec.strip()}), firing {firing + 1} of {count}")
