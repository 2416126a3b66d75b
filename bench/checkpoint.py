"""Delta-checkpoint size and speed against torch.save (schema-3 store: chunked, per-chunk codecs, deltas
against the last full base).

Cases: (a) ~1M-param MLP + Adam fp32; (b) ~25M-param TransformerEncoder + Adam fp32; (c) (b) in bf16 (params
and Adam state bf16; stored as uint16 bit patterns with logical dtype "bfloat16", torch tensors are passed
straight to the store); (d) a 100k x 64 embedding trained with SparseAdam where each version interval touches
a fresh random 1% of the rows (every step's batch is drawn from those rows), so only they change.
``STEPS`` optimizer steps between versions. Per case it prints:

- size ratio (the headline, ``size_ratio_<case>``): bytes each version added on disk (chunks + manifest) /
  torch.save of the same state, as the mean over every version, the first full base included; with the default 8
  versions (= ``full_every``) that is the steady-state cost of a whole base cycle. ``delta_ratio_<case>`` leaves
  the base out (the versions after the first, later rebases included);
- encode MB/s: a synchronous commit (cut, choose codecs, diff/XOR, byte planes, zstd-1, hashes) on the
  store's worker threads into a ``memory://`` store, so no disk I/O, next to single-thread zstd-1 MB/s on the
  same raw bytes in the same run; and the same commit into the ``file://`` store ("commit to disk");
- restore MB/s (fresh store);
- the blocking pause of AsyncSaver.save in a loop that trains for ``--iteration-s`` (at least ``STEPS`` steps)
  between saves while the previous save encodes in the background (the copy into host buffers; steady state:
  median of the saves after the first, which allocates the buffers), as a fraction of ``--iteration-s``: a
  synthetic loop on a ``memory://`` store, not a run; the flow's own wait for its checkpoints, measured against
  its real iterations, is ``checkpoint_wait_fraction`` in ``bench/ppo.py``.

Last line: one JSON object. Run: ``python bench/checkpoint.py [--quick] [--iteration-s 3.3]`` (--quick skips
(b) and (c)).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zstandard

from rl_core.checkpoint import AsyncSaver, CheckpointStore
from rl_core.private_temp import use_private_temp_dir

STEPS = 20


# ------------------------------------------------------------------------------------------------ models


def mlp_case() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 768), torch.nn.ReLU(), torch.nn.Linear(768, 64)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def step(_: int) -> None:
        x, y = torch.randn(256, 128, generator=gen), torch.randn(256, 64, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return model, opt, step


def transformer_case(dtype: torch.dtype) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=8, enable_nested_tensor=False).to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)

    def step(_: int) -> None:
        x = torch.randn(2, 8, 512, generator=gen).to(dtype)  # tiny batch: the state, not the step, is measured
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()

    return model, opt, step


def sparse_case() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Embedding(100_000, 64, sparse=True)
    opt = torch.optim.SparseAdam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    active: dict[str, torch.Tensor] = {}

    def step(i: int) -> None:
        if i % STEPS == 0:  # a fresh 1% of the rows for this version interval
            active["rows"] = torch.randperm(100_000, generator=gen)[:1000]
        idx = active["rows"][torch.randint(0, 1000, (256,), generator=gen)]
        opt.zero_grad()
        model(idx).pow(2).sum().backward()
        opt.step()

    return model, opt, step


# --------------------------------------------------------------------------------------------- helpers


def flatten(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Model and optimizer state as named torch tensors (the store takes them, bf16 included); the rest -> meta."""
    tensors = {f"model/{k}": v.detach() for k, v in model.state_dict().items()}
    state = opt.state_dict()
    scalars = {}
    for idx, slots in state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{idx}/{key}"] = value.detach()
            else:
                scalars[f"{idx}/{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "optim_scalars": scalars}


def torch_save_size(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    return buf.tell()


def disk_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def raw_views(tensors: dict[str, torch.Tensor]) -> list[np.ndarray]:
    out = []
    for t in tensors.values():
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        out.append(t.numpy().reshape(-1).view(np.uint8))
    return out


def tensors_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def zstd1_mb_s(raws: list[np.ndarray]) -> float:
    cctx = zstandard.ZstdCompressor(level=1)
    total = sum(r.nbytes for r in raws)
    t0 = time.perf_counter()
    for r in raws:
        cctx.compress(r)
    return total / (time.perf_counter() - t0) / 1e6


def train(step: Any, first: int) -> int:
    for i in range(first, first + STEPS):
        step(i)
    return first + STEPS


def run_case(name: str, build: Any, versions: int, iteration_s: float, tmp: Path, full_every: int) -> dict[str, Any]:
    """Phase 1: synchronous commits (sizes, encode speed, restore). Phase 2: the same training going on with
    AsyncSaver saves between intervals, as a training loop uses it (the pause)."""
    model, opt, step = build()
    root = tmp / name
    store = CheckpointStore(f"file://{root}", full_every=full_every)
    encoder = CheckpointStore(f"memory://bench-encode-{name}-{os.getpid()}", full_every=full_every)  # no disk I/O
    n_params = sum(p.numel() for p in model.parameters())
    ratios, enc_speeds, commit_speeds, zstd_speeds, pauses, rows = [], [], [], [], [], []
    i = 0
    for version in range(versions):
        i = train(step, i)
        tensors, meta = flatten(model, opt)
        t0 = time.perf_counter()
        assert encoder.commit(tensors, meta) == version
        elapsed = time.perf_counter() - t0
        before = disk_bytes(root)
        t0 = time.perf_counter()
        assert store.commit(tensors, meta) == version
        commit_speeds.append(tensors_bytes(tensors) / (time.perf_counter() - t0) / 1e6)
        added = disk_bytes(root) - before
        reference = torch_save_size(model, opt)
        report = store.size_report(version)
        zstd_speeds.append(zstd1_mb_s(raw_views(tensors)))
        enc_speeds.append(report["raw_bytes"] / elapsed / 1e6)
        ratios.append(added / reference)
        codecs = " ".join(f"{k}={v}" for k, v in report["codec_counts"].items() if v)
        base = "full" if report["base"] is None else f"d{report['depth']}"
        rows.append(f"  v{version} {base:>4} added {added / 1e6:8.3f} MB / torch.save {reference / 1e6:8.3f} MB = "
                    f"{added / reference:6.3f}  encode {enc_speeds[-1]:6.1f} MB/s  zstd-1 {zstd_speeds[-1]:6.1f} MB/s  "
                    f"commit to disk {commit_speeds[-1]:6.1f} MB/s  [{codecs}]")
    t0 = time.perf_counter()
    snap = CheckpointStore(f"file://{root}").load()
    restore = store.size_report(snap.version)["raw_bytes"] / (time.perf_counter() - t0) / 1e6
    final = flatten(model, opt)[0]
    assert all(np.array_equal(snap.tensors[k].reshape(-1).view(np.uint8), r) for k, r in zip(final, raw_views(final))), (
        "restore not exact"
    )

    with AsyncSaver(CheckpointStore(f"memory://bench-{name}-{os.getpid()}", full_every=8), max_pending=2) as saver:
        for _ in range(min(versions, 4)):
            started = time.perf_counter()  # an iteration of training (at least STEPS steps) between saves,
            i = train(step, i)  # while the previous save encodes in the background, as in a training loop
            while time.perf_counter() - started < iteration_s:
                step(i)
                i += 1
            tensors, meta = flatten(model, opt)
            t0 = time.perf_counter()
            saver.save(tensors, meta)
            pauses.append(time.perf_counter() - t0)
    steady_pause = statistics.median(pauses[1:]) if len(pauses) > 1 else pauses[0]
    result = {
        "case": name,
        "params": n_params,
        "raw_mb": store.size_report(0)["raw_bytes"] / 1e6,
        "size_ratio": float(np.mean(ratios[1:])),
        "size_ratio_first": ratios[0],
        "size_ratio_amortized": float(np.mean(ratios)),
        "encode_mb_s": float(np.mean(enc_speeds)),
        "commit_mb_s": float(np.mean(commit_speeds)),
        "zstd1_mb_s": float(np.mean(zstd_speeds)),
        "restore_mb_s": restore,
        "pause_s": steady_pause,
        "pause_first_s": pauses[0],
        "pause_fraction": steady_pause / iteration_s,
    }
    print(f"({name}) {n_params:,} params, {result['raw_mb']:.1f} MB raw, {STEPS} steps between versions")
    print("\n".join(rows))
    print(f"  => size ratio {result['size_ratio']:.3f} (first/full {ratios[0]:.3f}; all {versions} versions, the "
          f"first base included: {result['size_ratio_amortized']:.3f}); encode {result['encode_mb_s']:.1f} "
          f"MB/s vs zstd-1 {result['zstd1_mb_s']:.1f} MB/s ({result['encode_mb_s'] / result['zstd1_mb_s']:.2f}x); "
          f"restore {restore:.1f} MB/s; async pause {steady_pause * 1e3:.1f} ms (first {pauses[0] * 1e3:.1f} ms, "
          f"allocating) = {result['pause_fraction'] * 100:.2f}% of {iteration_s} s", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 25M transformer cases (b) and (c)")
    parser.add_argument("--iteration-s", type=float, default=3.3, help="training iteration time the pause is compared with")
    parser.add_argument("--full-every", type=int, default=8, help="the store's base cycle (default 8, as a run's)")
    parser.add_argument("--versions", type=int, help="versions per case (default: one base cycle, --full-every)")
    parser.add_argument("--cases", default="mlp_fp32,tf_fp32,tf_bf16,sparse", help="comma-separated subset to run")
    args = parser.parse_args()
    use_private_temp_dir("gymflow-bench-checkpoint-")  # removed at exit, after a failure or SIGTERM too
    versions = args.versions or args.full_every
    torch.set_num_threads(1)  # the bench machine is shared; single-thread figures are comparable
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("mlp_fp32", mlp_case, versions),
            ("tf_fp32", lambda: transformer_case(torch.float32), versions),
            ("tf_bf16", lambda: transformer_case(torch.bfloat16), versions),
            ("sparse", sparse_case, versions),
        ]
        wanted = set(args.cases.split(",")) - ({"tf_fp32", "tf_bf16"} if args.quick else set())
        for name, build, versions in cases:
            if name in wanted:
                results[name] = run_case(name, build, versions, args.iteration_s, Path(tmp), args.full_every)
    speed = [r["encode_mb_s"] / r["zstd1_mb_s"] for r in results.values()]
    print(json.dumps({
        # the headline: a whole base cycle, its full base included (what a run's storage really grows by)
        **{f"size_ratio_{name}": round(r["size_ratio_amortized"], 4) for name, r in results.items()},
        **{f"delta_ratio_{name}": round(r["size_ratio"], 4) for name, r in results.items()},  # deltas alone
        "encode_vs_zstd1": round(min(speed), 3),
        # a synthetic loop's pause at --iteration-s; the flow's own wait is bench/ppo.py's checkpoint_wait_fraction
        f"async_pause_fraction_at_{args.iteration_s:g}s": round(max(r["pause_fraction"] for r in results.values()), 4),
        "cpu_count": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
