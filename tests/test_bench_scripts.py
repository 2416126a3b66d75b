"""Every benchmark under bench/ starts as README runs it (`python bench/<name>.py`): run as a script, its folder
comes first on sys.path, where bench/kernels.py once shadowed the `kernels` package and broke bench/simulate.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_every_benchmark_script_imports_and_parses_its_arguments() -> None:
    scripts = sorted(BENCH.glob("*.py"))
    assert {s.stem for s in scripts} >= {"checkpoint", "kernels", "ppo", "resume", "simulate"}
    running = {s.name: subprocess.Popen([sys.executable, str(s), "--help"], cwd=BENCH.parent, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for s in scripts}
    failed = {}
    for name, proc in running.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or "usage:" not in out:
            failed[name] = err.strip().splitlines()[-1:] or out[-200:]
    assert not failed, failed
