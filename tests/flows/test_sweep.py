"""`gymflow sweep`: a tiny control sweep (2 seeds x 2 learning rates, 2 members at a time) trains every member to a
verified last version and reports it; run again it skips finished members; a member that failed mid-way resumes
when the sweep runs again, bit-identical to a member that never failed; so does every member of a sweep command
SIGKILLed mid-way and run again."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.checkpoint import CheckpointStore
from rl_core.reporting.intervals import difference_interval, verdict_of
from tests.flows.flow_helpers import artifacts, inject_faults, kill_when, task_runs

ITERATIONS = 2
# Two members at a time on the session's 4-CPU Ray: each asks one env worker and one trainer rank.
OPTIONS = {"preset": "tiny", "iterations": ITERATIONS, "num_workers": 1, "num_ranks": 1}
GRID = {"learning_rate": [1e-3, 3e-4]}


def _sweep(store: str, name: str, **kwargs):
    from flows.sweep import sweep

    return sweep(name=name, seeds=kwargs.pop("seeds", [0, 1]), grid=kwargs.pop("grid", GRID), options=OPTIONS,
                 store=store, max_concurrent=2, return_state=True, **kwargs)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, prefect_api, local_ray) -> tuple:
    """The sweep, run once to the end: (its store's folder, its flow run's final state)."""
    folder = tmp_path_factory.mktemp("sweep")
    return folder, _sweep(f"file://{folder}", "lr")


@pytest.mark.slow
def test_every_member_completes_with_verified_versions_and_a_report(swept) -> None:
    folder, state = swept
    report = state.result()
    members = {m["member"]: m for m in report["members"]}
    assert sorted(members) == ["lr-learning_rate-0.0003-s0", "lr-learning_rate-0.0003-s1",
                               "lr-learning_rate-0.001-s0", "lr-learning_rate-0.001-s1"]
    for name in members:
        store = CheckpointStore(f"{folder}/{name}/checkpoints")
        assert store.latest() == ITERATIONS
        assert store.verify()["errors"] == {}
    assert report["missing"] == [] and {g["group"] for g in report["groups"]} == {
        "learning_rate=0.001", "learning_rate=0.0003"}
    page = folder / "lr"
    assert json.loads((page / "report.json").read_text()) == report
    assert (page / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| learning_rate=0.001 | 2 |" in (page / "report.md").read_text()
    shown = artifacts(state.state_details.flow_run_id)
    table = shown["lr-sweep-scores"].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert {r["group"] for r in rows} == {"learning_rate=0.001", "learning_rate=0.0003"}
    assert "data:image/png;base64," in shown["lr-sweep-report"].data
    ran = [t.name for t in task_runs(state.state_details.flow_run_id) if t.name in members]
    assert sorted(ran) == sorted(members)  # one sweep_member task run each, its subflow beneath


@pytest.mark.slow
def test_the_verdicts_say_what_the_intervals_say(swept) -> None:
    report = swept[1].result()
    scores = {g["group"]: g["runs"] for g in report["groups"]}
    assert len(report["verdicts"]) == 2  # each ordered pair of the two groups
    for v in report["verdicts"]:
        interval = difference_interval(scores[v["group"]], scores[v["versus"]])
        assert v["difference_ci95"] == pytest.approx(list(interval), abs=1e-3)  # runs rounded to 4 digits
        assert v["verdict"] == verdict_of(tuple(v["difference_ci95"]), v["margin"])
    forth, back = report["verdicts"]
    flipped = {"better": "worse", "worse": "better"}
    if forth["verdict"] in flipped:
        assert back["verdict"] == flipped[forth["verdict"]]


@pytest.mark.slow
def test_a_sweep_run_again_skips_its_finished_members(swept) -> None:
    folder, first = swept
    again = _sweep(f"file://{folder}", "lr")
    assert again.result()["members"] == first.result()["members"]
    assert task_runs(again.state_details.flow_run_id) == []  # no member trained, none evaluated again


@pytest.mark.slow
def test_a_failed_member_resumes_bit_identical_when_the_sweep_runs_again(swept, tmp_path, monkeypatch) -> None:
    """The member's simulate of iteration 1 fails past its retries (after version 1 is committed): the member and
    the sweep fail; run again, the sweep continues it from version 1 to the same weights as the clean member."""
    clean = swept[1]
    expected = {m["member"]: m["policy_sha256"] for m in clean.result()["members"]}["lr-learning_rate-0.001-s0"]
    inject_faults(monkeypatch, tmp_path, "simulate.rollout_end:iteration=1,worker=0,count=3")
    store = f"file://{tmp_path}/runs"
    failed = _sweep(store, "drill", seeds=[0], grid={"learning_rate": [1e-3]})
    assert failed.is_failed() and "drill-learning_rate-0.001-s0" in failed.message
    assert CheckpointStore(f"{tmp_path}/runs/drill-learning_rate-0.001-s0/checkpoints").latest() == 1
    assert json.loads((tmp_path / "runs" / "drill" / "report.json").read_text())["missing"] == [
        "drill-learning_rate-0.001-s0"]
    resumed = _sweep(store, "drill", seeds=[0], grid={"learning_rate": [1e-3]}).result()
    assert resumed["members"][0]["policy_sha256"] == expected


def _sweep_command(store: str, name: str) -> list[str]:
    """`gymflow sweep run` of the module's sweep (seeds 0 and 1 over GRID, OPTIONS on every member) under `name`."""
    grid = [arg for key, values in GRID.items() for arg in ("--grid", f"{key}={','.join(map(str, values))}")]
    sets = [arg for key, value in OPTIONS.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "flows.tooling.cli", "sweep", "run", name, "--seeds", "0,1", *grid, *sets,
            "--store", store, "--max-concurrent", "2"]


@pytest.mark.slow
@pytest.mark.chaos  # a SIGKILL drill of 40-50 s: make chaos
def test_a_sweep_command_sigkilled_midway_ends_bit_identical_when_run_again(swept, tmp_path: Path) -> None:
    """The real command, its whole process group SIGKILLed once a member has committed version 1 and not its last,
    with one member stalled in its training of iteration 1 (so the sweep cannot end first); the same command again
    ends every member bit-identical to the undisturbed sweep, every version verifying, and reports none missing."""
    expected = {m["member"].removeprefix("lr-"): m["policy_sha256"] for m in swept[1].result()["members"]}
    runs = tmp_path / "runs"
    command = _sweep_command(f"file://{runs}", "killed")
    faults = tmp_path / "faults"
    faults.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GYMFLOW_FAULT_DIR": str(faults),
           "GYMFLOW_FAULTS": "train.epoch_end:iteration=1,rank=0,epoch=0,action=stall"}  # one member, once

    def midway() -> list[Path]:
        """The members that have committed version 1 and not their last."""
        return [m for m in runs.glob("killed-*") if (m / "checkpoints" / "versions" / "00000001.commit").exists()
                and not (m / "checkpoints" / "versions" / f"{ITERATIONS:08d}.commit").exists()]

    kill_when(command, env, lambda: any(faults.iterdir()) and bool(midway()), 600,
              "saw a member commit version 1 and stall in iteration 1")
    assert not (runs / "killed" / "report.json").exists()  # killed before the sweep's end
    done = subprocess.run(command, env=env, start_new_session=True, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["missing"] == []
    report = json.loads((runs / "killed" / "report.json").read_text())
    assert report["missing"] == [] and report["failed"] == {}
    assert {m["member"].removeprefix("killed-"): m["policy_sha256"] for m in report["members"]} == expected
    for member in report["members"]:
        store = CheckpointStore(f"{runs}/{member['member']}/checkpoints")
        assert store.latest() == ITERATIONS and store.verify()["errors"] == {}


@pytest.mark.slow
def test_another_spec_under_a_sweeps_name_is_refused_naming_the_field(swept) -> None:
    from rl_core.config.common import ConfigError

    with pytest.raises(ConfigError, match="with other seeds"):
        _sweep(f"file://{swept[0]}", "lr", seeds=[0, 1, 2]).result()


def test_the_spec_names_members_deterministically_and_routes_algorithm_fields() -> None:
    from rl_core.config.sweep import load_spec, parse_values

    spec = load_spec({"name": "lr", "seeds": parse_values("0,1"), "grid": {"learning_rate": parse_values("1e-3,3e-4")},
                      "options": OPTIONS})
    members = spec.members()
    assert [m.name for m in members] == ["lr-learning_rate-0.001-s0", "lr-learning_rate-0.001-s1",
                                         "lr-learning_rate-0.0003-s0", "lr-learning_rate-0.0003-s1"]
    assert members[0].options["hyperparameters"] == {"learning_rate": 1e-3}  # no launch option: the algorithm's
    assert members[0].config.algorithm.learning_rate == 1e-3 and members[1].config.seed == 1
    assert [m.name for m in load_spec(spec.model_dump()).members()] == [m.name for m in members]


@pytest.mark.parametrize(("values", "named"), [
    ({"grid": {"learnin_rate": [1e-3]}}, "unknown key learnin_rate"),
    ({"options": {"seed": 3}}, "seed set by the sweep itself"),
    ({"seeds": [1, 1]}, "seeds: Value error, distinct seeds"),
    ({"grid": {"learning_rate": [-1.0]}}, ("member bad-learning_rate--1-s0: invalid run configuration:\n  "
                                           "algorithm.learning_rate")),
    ({"flow": "agent", "options": {"num_workers": 0, "preset": "tiny"}}, "env.num_workers"),
    ({"max_concurrent": 0}, "max_concurrent"),
])
def test_a_bad_spec_is_refused_naming_the_field(values: dict, named: str) -> None:
    from rl_core.config.common import ConfigError
    from rl_core.config.sweep import load_spec

    with pytest.raises(ConfigError, match=re.escape(named)):
        load_spec({"name": "bad", **values}).members()


def test_the_guides_example_spec_file_gives_its_twenty_members_with_flags_on_top() -> None:
    from flows.tooling.cli import parse_args
    from flows.tooling.sweep_cli import spec_values
    from rl_core.config.sweep import load_spec

    args = parse_args(["sweep", "run", "hopper-lr", "--spec", "examples/sweeps/hopper-lr.yaml", "--max-concurrent",
                       "3", "--set", "iterations=5"])
    spec = load_spec(spec_values(args))
    members = spec.members()
    assert len(members) == 20 and spec.max_concurrent == 3
    assert {m.config.env.name for m in members} == {"Hopper-v5"} and {m.config.iterations for m in members} == {5}
