"""Environment defaults for running on one machine with nothing set up (imported before prefect and ray).

Each is a `setdefault`: anything the operator exported wins.
"""
import os

if not os.environ.get("RAY_ADDRESS"):
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep a local Ray on 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The temporary local API takes ~15 s to start cold on a 2-core machine; Prefect's default allows 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
