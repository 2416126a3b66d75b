"""Prefect defaults for running on one machine with nothing set up (imported before prefect).

Each is a `setdefault`: anything the operator exported wins.
"""
import os

# Ray's defaults are set by rl_core.runtime (imported before anything there imports ray).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The temporary local API takes ~15 s to start cold on a 2-core machine; Prefect's default allows 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
