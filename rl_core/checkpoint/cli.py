"""Command line for checkpoint stores: ``python -m rl_core.checkpoint ls|show|verify|gc|export URL ...``.

Credentials come from the environment (AWS_* variables, ``AWS_ENDPOINT_URL`` / ``FSSPEC_S3_ENDPOINT_URL``)
as with any fsspec URL; URLs are printed without user info or query strings. Exit status: 0 success,
1 a failed check or a checkpoint error (the message is printed to stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

import numpy as np

from .store import CheckpointError, CheckpointStore

__all__ = ["main"]


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f}"


def _codecs(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items() if v) or "-"


def _ls(store: CheckpointStore, args: argparse.Namespace, out: TextIO) -> int:
    versions = store.versions()
    if not versions:
        print(f"{store.url}: no committed versions", file=out)
        return 0
    print(f"{'version':>7} {'base':>5} {'raw MB':>10} {'added MB':>10} {'objs MB':>10}  codecs (per chunk)", file=out)
    for v in versions:
        r = store.size_report(v)
        base = "full" if r["base"] is None else str(r["base"])
        print(
            f"{v:>7} {base:>5} {_mb(r['raw_bytes']):>10} {_mb(r['encoded_bytes']):>10} {_mb(r['stored_bytes']):>10}  "
            f"{_codecs(r['codec_counts'])}",
            file=out,
        )
    return 0


def _show(store: CheckpointStore, args: argparse.Namespace, out: TextIO) -> int:
    m = store.manifest(args.version)
    r = store.size_report(args.version)
    print(f"version {m['version']} of {store.url}", file=out)
    print(f"  created {m['created']}  parent {m['parent']}  base {m['base'] if m['base'] is not None else 'itself (full)'}"
          f"  depth {m['depth']}  chunk_bytes {m['chunk_bytes']}", file=out)
    print(f"  raw {_mb(r['raw_bytes'])} MB, added {_mb(r['encoded_bytes'])} MB, own+same objects {_mb(r['stored_bytes'])} MB; "
          f"codecs {_codecs(r['codec_counts'])}", file=out)
    print(f"  {len(m['tensors'])} tensors:", file=out)
    for name, e in sorted(m["tensors"].items()):
        counts: dict[str, int] = {}
        for c in e["chunks"]:
            counts[c["codec"]] = counts.get(c["codec"], 0) + 1
        dtype = e["dtype"] + (f" ({e['logical_dtype']})" if e.get("logical_dtype") else "")
        enc = sum(c["encoded_bytes"] for c in e["chunks"] if c["codec"] != "same")
        print(f"    {name}: {dtype} {tuple(e['shape'])} raw {e['nbytes']} B, encoded {enc} B, "
              f"{_codecs(counts)}", file=out)
    print(f"  meta: {json.dumps(m['meta'], sort_keys=True)[:2000]}", file=out)
    return 0


def _verify(store: CheckpointStore, args: argparse.Namespace, out: TextIO) -> int:
    report = store.verify(args.version)
    for v in report["checked"]:
        status = "ok" if v not in report["errors"] else f"FAILED: {report['errors'][v]}"
        print(f"version {v}: {status}", file=out)
    if report["errors"]:
        print(f"{len(report['errors'])} of {len(report['checked'])} versions failed verification", file=sys.stderr)
        for v, msg in report["errors"].items():
            print(msg, file=sys.stderr)
        return 1
    return 0


def _gc(store: CheckpointStore, args: argparse.Namespace, out: TextIO) -> int:
    report = store.gc(
        keep_last=args.keep_last, keep_every=args.keep_every, grace_s=args.grace_s,
        claim_grace_s=max(args.grace_s, 3600.0), dry_run=args.dry_run,
    )
    print(json.dumps(report), file=out)
    return 0


def _export(store: CheckpointStore, args: argparse.Namespace, out: TextIO) -> int:
    snap = store.load(args.version)
    path = Path(args.out)
    meta_path = path.with_suffix(".json")
    header = {"version": str(snap.version), "source": store.url}
    if snap.logical_dtypes:  # numpy has no bf16: go through torch so the file says BF16
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in snap.to_torch().items()}, str(path), metadata=header)
    else:
        from safetensors.numpy import save_file

        # safetensors is little-endian: big-endian arrays are converted (same values, native byte order)
        tensors = {k: np.ascontiguousarray(v.astype(v.dtype.newbyteorder("<"))) for k, v in snap.tensors.items()}
        save_file(tensors, str(path), metadata=header)
    meta_path.write_text(json.dumps({"version": snap.version, "meta": snap.meta}, indent=1, sort_keys=True))
    print(f"version {snap.version}: {len(snap.tensors)} tensors -> {path}, meta -> {meta_path}", file=out)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rl_core.checkpoint", description="Inspect and maintain a checkpoint store.")
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list versions with sizes and codecs")
    ls.add_argument("url")
    show = sub.add_parser("show", help="print one version's manifest summary")
    show.add_argument("url")
    show.add_argument("version", type=int)
    verify = sub.add_parser("verify", help="check every object and decoded chunk hash (exit 1 on corruption)")
    verify.add_argument("url")
    verify.add_argument("version", type=int, nargs="?")
    gc = sub.add_parser("gc", help="delete versions outside a retention policy and unreferenced chunks")
    gc.add_argument("url")
    gc.add_argument("--keep-last", type=int, required=True)
    gc.add_argument("--keep-every", type=int, default=None)
    gc.add_argument("--grace-s", type=float, default=3600.0, help="never delete chunks younger than this")
    gc.add_argument("--dry-run", action="store_true")
    export = sub.add_parser("export", help="write one version as a safetensors file plus a JSON of its meta")
    export.add_argument("url")
    export.add_argument("version", type=int)
    export.add_argument("out", help="path of the .safetensors file; the meta goes next to it as .json")
    return p


_COMMANDS = {"ls": _ls, "show": _show, "verify": _verify, "gc": _gc, "export": _export}


def main(argv: list[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run one command; returns the exit status (argparse exits 2 itself on bad usage)."""
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    try:
        store = CheckpointStore(args.url)
        return _COMMANDS[args.command](store, args, out)
    except (CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
