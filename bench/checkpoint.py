"""Delta-checkpoint size and speed against torch.save, on a ~1M-parameter MLP + Adam (fp32).

Trains the MLP on random regression batches, takes 20 Adam steps between versions, commits model + optimizer
state to a file:// store and compares what each version adds on disk (chunks + manifest) with the size of
``torch.save`` of the same state dicts. Prints one line per version, then one JSON line:
``size_ratio_mlp_fp32`` (stored / torch.save, mean over the delta versions; below 1 is smaller) and
``size_ratio_full`` (the same for the first, full version).

Run: ``python bench/checkpoint.py`` (about 10-30 s on 2 cores).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rl_core.checkpoint import CheckpointStore

VERSIONS = 6
STEPS_BETWEEN = 20
BATCH = 256


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 768),
        torch.nn.ReLU(),
        torch.nn.Linear(768, 64),
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, gen: torch.Generator) -> None:
    for _ in range(steps):
        x = torch.randn(BATCH, 128, generator=gen)
        y = torch.randn(BATCH, 64, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def flatten(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, np.ndarray], dict]:
    """Model and Adam state as named numpy arrays; hyperparameters go to meta (JSON)."""
    tensors = {f"model/{k}": v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    state = opt.state_dict()
    for idx, slots in state["state"].items():
        for key, value in slots.items():
            tensors[f"optim/{idx}/{key}"] = value.detach().cpu().numpy()
    return tensors, {"param_groups": state["param_groups"]}


def torch_save_size(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    return buf.tell()


def disk_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def main() -> None:
    torch.set_num_threads(1)  # the bench machine is shared; single-thread figures are comparable
    model, opt = build()
    gen = torch.Generator().manual_seed(1)
    n_params = sum(p.numel() for p in model.parameters())
    ratios: list[float] = []
    commit_speeds: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "run"
        store = CheckpointStore(f"file://{root}", full_every=8)
        print(f"MLP {n_params:,} params + Adam fp32, {STEPS_BETWEEN} Adam steps between versions")
        header = ("ver", "codecs", "raw MB", "stored MB", "torch.save MB", "stored/torch", "commit MB/s")
        print(" ".join(f"{h:>{w}}" for h, w in zip(header, (3, 26, 7, 9, 13, 12, 11))))
        for version in range(VERSIONS):
            train(model, opt, STEPS_BETWEEN, gen)  # before version 0 too, so every version holds Adam state
            tensors, meta = flatten(model, opt)
            before = disk_bytes(root) if root.exists() else 0
            t0 = time.perf_counter()
            assert store.commit(tensors, meta) == version
            elapsed = time.perf_counter() - t0
            stored = disk_bytes(root) - before
            report = store.size_report(version)
            reference = torch_save_size(model, opt)
            ratio = stored / reference
            speed = report["raw_bytes"] / elapsed / 1e6
            ratios.append(ratio)
            commit_speeds.append(speed)
            codecs = " ".join(f"{k}={v}" for k, v in report["codec_counts"].items())
            print(
                f"{version:>3} {codecs:>26} {report['raw_bytes'] / 1e6:>7.2f} {stored / 1e6:>9.3f} "
                f"{reference / 1e6:>13.3f} {ratio:>12.3f} {speed:>11.1f}"
            )
        t0 = time.perf_counter()
        snap = CheckpointStore(f"file://{root}").load()
        load_speed = store.size_report(snap.version)["raw_bytes"] / (time.perf_counter() - t0) / 1e6
        final, _ = flatten(model, opt)
        assert all(snap.tensors[k].tobytes() == v.tobytes() for k, v in final.items()), "restore is not exact"
        chain = snap.version + 1
        print(f"restore of version {snap.version} from a fresh store (chain of {chain}): {load_speed:.1f} MB/s, exact")
    print(
        json.dumps(
            {
                "size_ratio_mlp_fp32": round(float(np.mean(ratios[1:])), 4),
                "size_ratio_full": round(ratios[0], 4),
                "params": n_params,
                "versions": VERSIONS,
                "steps_between": STEPS_BETWEEN,
                "commit_mb_s_mean": round(float(np.mean(commit_speeds)), 1),
                "load_mb_s": round(load_speed, 1),
                "cpu_count": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
