"""A run's checkpoint lineage as table rows: each version, whether it is a full base or a delta on one, what it
added to the store, and that against what `torch.save` would write for the same state."""
from __future__ import annotations

from rl_core.checkpoint import CheckpointStore
from rl_core.data.storage_report import torch_save_bytes


def checkpoint_rows(store: CheckpointStore) -> list[dict]:
    """One row per committed version. A run's versions hold the same tensors, so one `torch.save` of the newest
    is every version's baseline."""
    versions = store.versions()
    if not versions:
        return []
    baseline = torch_save_bytes(store.load(versions[-1]).tensors)
    rows = []
    for version in versions:
        report = store.size_report(version)
        rows.append({
            "version": version,
            "kind": "base" if report["base"] is None else f"delta on v{report['base']}",
            "raw_bytes": report["raw_bytes"],
            "added_bytes": report["encoded_bytes"],
            "ratio_to_torch_save": round(report["encoded_bytes"] / baseline, 4),
        })
    return rows
