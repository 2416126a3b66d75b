"""What a run's checkpoints cost: per-version encoded sizes against the raw state and `torch.save` of it."""
from __future__ import annotations

import io

import fsspec
import numpy as np
import torch

from rl_core.checkpoint import CheckpointStore
from rl_core.config.agent import AnyRunConfig
from rl_core.data.run_layout import RunLayout


def torch_save_bytes(tensors: dict[str, np.ndarray]) -> int:
    """Size of the same state written by `torch.save`: the baseline our checkpoint sizes are compared with."""
    buffer = io.BytesIO()
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, buffer)
    return buffer.tell()


def storage_report(cfg: AnyRunConfig) -> dict:
    """What the run's checkpoints cost: per-version encoded sizes against raw and `torch.save` sizes; and the newest
    version's numeric counters (`counters`: env steps, or tokens and episodes), with `env_steps` for a control run."""
    store = CheckpointStore(RunLayout(cfg.run_url).checkpoints)
    versions = store.versions()
    if not versions:
        return {"versions": 0, "env_steps": 0, "stored_bytes": 0, "counters": {}}
    latest = versions[-1]
    reports = [store.size_report(v) for v in versions]
    fs, path = fsspec.core.url_to_fs(RunLayout(cfg.run_url).checkpoints)
    meta = store.meta(latest)
    counters = {k: v for k, v in meta.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {
        "versions": len(versions),
        "latest_version": latest,
        "env_steps": meta.get("env_steps", 0),
        "counters": counters,
        "stored_bytes": int(fs.du(path)),
        "latest_raw_bytes": reports[-1]["raw_bytes"],
        "latest_encoded_bytes": reports[-1]["encoded_bytes"],
        "mean_encoded_bytes": int(sum(r["encoded_bytes"] for r in reports) / len(reports)),
        "latest_torch_save_bytes": torch_save_bytes(store.load(latest).tensors),
    }
