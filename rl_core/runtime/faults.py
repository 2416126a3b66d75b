"""Fault injection for resilience tests and drills: fail a named point once, in whichever process reaches it.

`GYMFLOW_FAULTS` holds `;`-separated specs `point:key=value,...`, e.g. `train.epoch_end:iteration=1,rank=0,epoch=3`.
A spec fires when the point is reached with matching context, once (or `count=N` times): each firing leaves a
marker file in `GYMFLOW_FAULT_DIR` (required when faults are set), so the retries after it run normally. A firing
raises InjectedFault; with `action=kill` it SIGKILLs the process that reached the point (a crashed actor), with
`action=stall` that process stops there for an hour (a hung step, or a moment for a drill to kill the whole run);
with `action=poison` `maybe_fail` returns True and the caller corrupts its data (NaN rewards: the instability guard's
drill). Unset: no-op.
Ray actors receive the driver's GYMFLOW_* settings that workers act on (see `gymflow_env_vars`), never others.
"""
from __future__ import annotations

import hashlib
import os
import signal
import time

STALL_S = 3600.0


class InjectedFault(RuntimeError):
    """Raised at a fault-injection point; never raised unless GYMFLOW_FAULTS asks for it."""


WORKER_SETTINGS = ("GYMFLOW_FAULTS", "GYMFLOW_FAULT_DIR", "GYMFLOW_KERNELS", "GYMFLOW_KERNELS_COMPILE",
                   "GYMFLOW_CACHE_DIR")
"""The GYMFLOW_* variables Ray workers act on. Others (a kernel proposer's URL and API key, metric sinks, the UI's
home) stay with the driver: a runtime_env is stored by Ray and shown in its logs and dashboard."""


def gymflow_env_vars() -> dict[str, str]:
    """The driver's settings in `WORKER_SETTINGS`, to hand to Ray actors (a cluster's workers do not inherit them)."""
    return {k: os.environ[k] for k in WORKER_SETTINGS if k in os.environ}


def maybe_fail(point: str, **context: object) -> bool:
    """Raise InjectedFault if a GYMFLOW_FAULTS spec names `point` with this context and has not fired yet; True
    when such a spec's action is `poison` (the caller corrupts its data), else False."""
    specs = os.environ.get("GYMFLOW_FAULTS")
    if not specs:
        return False
    for spec in specs.split(";"):
        name, _, conditions = spec.strip().partition(":")
        if name != point:
            continue
        wanted = dict(c.split("=", 1) for c in conditions.split(",") if c)
        count = int(wanted.pop("count", "1"))
        action = wanted.pop("action", "raise")
        if any(str(context.get(k)) != v for k, v in wanted.items()):
            continue
        tag = hashlib.sha256(spec.strip().encode()).hexdigest()[:16]
        for firing in range(count):
            try:
                with open(os.path.join(os.environ["GYMFLOW_FAULT_DIR"], f"{tag}-{firing}"), "x"):
                    pass
            except FileExistsError:
                continue
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if action == "stall":
                time.sleep(STALL_S)
            if action == "poison":
                return True
            raise InjectedFault(f"injected fault at {point} ({spec.strip()}), firing {firing + 1} of {count}")
    return False
