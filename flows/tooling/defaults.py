"""Prefect defaults for a command run on one machine with nothing set up.

Prefect reads its settings when it is first imported, so a command line calls `apply_prefect_defaults()` before
importing anything that imports prefect (flows/tooling/cli.py does, first thing). Each is a default: what the operator
exported wins. A deployment run needs none of them (its worker's settings apply), and a local Ray's defaults are
applied by `rl_core.runtime.local_ray.ensure_ray` when it starts one.
"""
from __future__ import annotations

import os
import sys

PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # The temporary local API's cold start on a busy 2-core machine comes close to Prefect's default allowance (20 s).
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


def apply_prefect_defaults() -> None:
    """Set `PREFECT_DEFAULTS` unless exported; an error if prefect was imported first (they would be ignored)."""
    if "prefect" in sys.modules and any(name not in os.environ for name in PREFECT_DEFAULTS):
        raise RuntimeError("apply_prefect_defaults() must run before prefect is imported: Prefect reads its "
                           "settings at import, so these would be ignored")
    for name, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
