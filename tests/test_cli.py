"""`gymflow`, the console script: help at every level, `runs`, `ckpt`, and exit statuses scripts can rely on."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from flows.tooling.cli import main
from rl_core.checkpoint import CheckpointStore
from rl_core.config.presets import build_control_config
from rl_core.data import RunLayout
from rl_core.data.run_info import open_run
from rl_core.reporting import RunMetricsSink


@pytest.mark.parametrize("command", [[], ["train"], ["train-agent"], ["evaluate"], ["runs"], ["export"], ["ckpt"], ["ui"],
                                     ["ckpt", "gc"]])
def test_help_at_every_level_exits_zero_and_says_what_the_command_does(command, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: gymflow") and len(shown.splitlines()) > 3
    if command in ([], ["train"]):
        assert "exit status" in shown


def test_train_options_come_from_the_configuration_model(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = capsys.readouterr().out
    assert "--env" in shown and "--num-workers" in shown and "--no-overlap" in shown


def test_bad_usage_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["nope"])
    assert done.value.code == 2
    assert main(["runs", "--store", "nope://x"]) == 2
    assert "nope://x" in capsys.readouterr().err


def _stored_run(store: str, name: str, versions: int) -> None:
    cfg = build_control_config("tiny", run_name=name, store=store)
    open_run(cfg)
    checkpoints = CheckpointStore(RunLayout(cfg.run_url).checkpoints)
    sink = RunMetricsSink(cfg.run_url)
    for version in range(versions):
        checkpoints.commit({"w": np.full(64, version, np.float32)}, {"iteration": version})
        if version:
            sink.write({"iteration": version, "mean_return": 10.0 * version})


def test_runs_lists_each_run_with_its_newest_version_last_score_and_size(tmp_path, capsys) -> None:
    store = f"file://{tmp_path}/runs"
    assert main(["runs", "--store", store]) == 0
    assert "no runs" in capsys.readouterr().out
    _stored_run(store, "alpha", 3)
    _stored_run(store, "beta", 1)
    (tmp_path / "runs" / "not-a-run").mkdir()
    capsys.readouterr()
    assert main(["runs", "--store", store, "--json"]) == 0
    import json

    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["run"] for r in rows] == ["alpha", "beta"]
    assert rows[0]["latest_version"] == 2 and rows[0]["score"] == 20.0 and rows[0]["kind"] == "control"
    assert rows[1]["score"] is None and rows[0]["bytes"] > rows[1]["bytes"] > 0
    assert main(["runs", "--store", store]) == 0
    assert "alpha" in capsys.readouterr().out


def test_ckpt_reaches_the_checkpoint_tool_with_its_exit_statuses(tmp_path, capsys) -> None:
    store = f"file://{tmp_path}/runs"
    _stored_run(store, "alpha", 2)
    checkpoints = f"{tmp_path}/runs/alpha/checkpoints"
    assert main(["ckpt", "ls", checkpoints]) == 0 and "version" in capsys.readouterr().out
    assert main(["ckpt", "verify", checkpoints]) == 0
    manifest = tmp_path / "runs" / "alpha" / "checkpoints" / "versions" / "00000001.json"  # its small chunks are in it
    manifest.write_bytes(manifest.read_bytes().replace(b'"iteration":1', b'"iteration":7'))
    assert main(["ckpt", "verify", checkpoints]) == 1


def test_the_console_script_is_installed() -> None:
    code = ("import importlib.metadata as m; "
            "print([e.value for e in m.entry_points(group='console_scripts') if e.name == 'gymflow'])")
    script = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "flows.tooling.cli:console_main" in script.stdout


def test_a_flow_on_a_memory_store_is_refused_before_anything_starts(tmp_path, capsys) -> None:
    assert main(["train", "--preset", "tiny", "--store", "memory://runs"]) == 2
    assert "Ray actors" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_that_rerunning_cannot_fix_gets_no_rerun_hint(tmp_path) -> None:
    """A truncated run.json: the error says what to do (restore it or start another run name), so the command does
    not add its usual "rerun the same command" line; exit status 1 (the run failed)."""
    open_run(build_control_config("tiny", run_name="cut", store=f"file://{tmp_path}"))
    run_json = tmp_path / "cut" / "run.json"
    run_json.write_bytes(run_json.read_bytes()[:40])
    done = subprocess.run([sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--run-name", "cut",
                           "--store", f"file://{tmp_path}"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "is not a readable run.json" in done.stderr
    assert "rerun the same command" not in done.stderr
