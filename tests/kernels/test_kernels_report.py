"""Report arithmetic (fast_p, geomean) and the standalone CLI over several ops with their default shapes."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gymflow_kernels import BucketReport, CandidateResult, TuneReport, fast_p, geomean_speedup, summary
from gymflow_kernels.cli import main
from gymflow_kernels.gae import gae_numpy


def bucket(winner: str, speedup: float, verified: bool = True) -> BucketReport:
    results = [CandidateResult("reference", True, speedup=1.0, median_s=1.0)]
    if winner != "reference":
        results.append(CandidateResult(winner, verified, speedup=speedup, median_s=1.0 / speedup))
    return BucketReport(shape={}, bucket={"N": 1}, dtype="float32", device="cpu", num_threads=1, winner=winner,
                        candidates=results)


def test_fast_p_follows_kernelbench() -> None:
    """Share of problems whose winner is correct and more than p times faster; the reference counts as 1.0x."""
    reports = [TuneReport("a", [bucket("cpp", 3.0), bucket("reference", 1.0)]), TuneReport("b", [bucket("x", 1.2)]),
               TuneReport("c", [bucket("y", 5.0, verified=False)])]
    assert fast_p(reports, 1.0) == pytest.approx(2 / 4)
    assert fast_p(reports, 1.5) == pytest.approx(1 / 4)
    assert geomean_speedup([TuneReport("a", [bucket("cpp", 4.0), bucket("reference", 1.0)])]) == pytest.approx(2.0)
    assert json.loads(json.dumps(summary(reports)))["fast_1.5"] == 0.25


def test_cli_tunes_comma_separated_ops_at_their_default_shapes(make_op, tmp_path: Path) -> None:
    small = {"default_shapes": ({"T": 16, "N": 4},)}
    first, second = make_op({"numpy": gae_numpy}, **small), make_op({"numpy": gae_numpy}, **small)
    stdout, report = io.StringIO(), tmp_path / "report.json"
    with contextlib.redirect_stdout(stdout):
        assert main(["--ops", f"{first.name},{second.name}", "--report", "--min-run-time", "0.005",
                     "--json", str(report)]) == 0
    written = json.loads(report.read_text())
    assert [r["op"] for r in written["ops"]] == [first.name, second.name]
    assert 0.0 <= written["fast_1.0"] <= 1.0 and written["geomean_speedup"] > 0
    assert f"{first.name} shape T=16,N=4" in stdout.getvalue()


def test_cli_reports_a_missing_proposer_instead_of_failing(make_op, monkeypatch, capsys) -> None:
    monkeypatch.delenv("GYMFLOW_KERNEL_PROPOSER_URL", raising=False)
    op = make_op({"numpy": gae_numpy})
    assert main(["--ops", op.name, "--shapes", "16x4", "--propose", "--min-run-time", "0.005"]) == 0
    assert "kernel proposer skipped" in capsys.readouterr().err


def test_cli_refuses_a_proposer_variable_under_its_former_name(make_op, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GYMFLOW_KERNEL_GENERATOR_URL", "http://127.0.0.1:8000/v1")
    op = make_op({"numpy": gae_numpy})
    with pytest.raises(SystemExit) as exit_info:
        main(["--ops", op.name, "--shapes", "16x4", "--propose", "--min-run-time", "0.005"])
    assert exit_info.value.code == 2
    assert "GYMFLOW_KERNEL_GENERATOR_URL -> GYMFLOW_KERNEL_PROPOSER_URL" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[2]


def test_python_m_gymflow_kernels_runs_without_warnings() -> None:
    """The documented command; `-W always::RuntimeWarning` would show runpy's re-import warning if it were given."""
    done = subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-m", "gymflow_kernels", "--ops", "gae",
                           "--shapes", "16x4", "--min-run-time", "0.005"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gae T=16,N=4: ") and "Warning" not in done.stderr, done.stderr


def test_importing_kernels_installs_no_warning_filter() -> None:
    """`import gymflow_kernels` leaves the importer's warning filters as they were (torch imported first: its own are its)."""
    code = ("import warnings, torch\nbefore = list(warnings.filters)\nimport gymflow_kernels, gymflow_kernels.cli\n"
            "added = [f for f in warnings.filters if f not in before]\nassert not added, added")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
