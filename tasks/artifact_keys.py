"""Artifact keys of a run: `<run>-<what>`, so the newest artifact of each kind of a run is one search away."""
from __future__ import annotations

import re


def artifact_key(run_name: str, what: str) -> str:
    """Prefect's artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{what}".lower()).strip("-")
