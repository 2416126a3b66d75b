"""Population-based training (`gymflow sweep run --strategy pbt`): the decisions are pure and seeded; a population of
4 tiny control members trains 2 generations, the bottom member forks the top one zero-copy with a perturbed learning
rate, and the report draws the lineage; the sweep's command SIGKILLed in the second generation and run again ends
bit-identical to the undisturbed population."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from rl_core.checkpoint import CheckpointStore
from rl_core.config.common import ConfigError
from rl_core.config.sweep import load_spec
from rl_core.population.pbt import decide, ranked
from tests.flows.flow_helpers import artifacts, kill_when

NAME = "pop"
SPEC = {"seeds": [0, 1], "grid": {"learning_rate": [1e-3, 3e-4]},
        "options": {"preset": "tiny", "iterations": 4, "num_workers": 1, "num_ranks": 1},
        "strategy": "pbt", "pbt": {"interval": 2, "mutable": {"learning_rate": [1e-5, 1e-2], "update_epochs": [1, 8]}},
        "max_concurrent": 2}
BOUNDS = {"lr": (1e-5, 1e-2), "epochs": (1, 8)}


def test_the_bottom_quantile_exploits_the_top_with_values_in_bounds() -> None:
    scores = {"a": 3.0, "b": 1.0, "c": 2.0, "d": -1.0, "e": math.nan, "f": 0.5, "g": 2.5, "h": 0.0}
    values = {m: {"lr": 9e-3 if m in "ag" else 1e-4, "epochs": 8 if m == "a" else 2} for m in scores}
    assert ranked(scores) == ["a", "g", "c", "b", "f", "h", "d", "e"]  # NaN last
    exploits = decide(7, 3, scores, values, 0.25, BOUNDS, (0.8, 1.2))
    assert [e.member for e in exploits] == ["d", "e"]  # the bottom 2 of 8, in name order
    assert all(e.source in ("a", "g") for e in exploits)
    for e in exploits:
        assert BOUNDS["lr"][0] <= e.values["lr"] <= BOUNDS["lr"][1] and isinstance(e.values["lr"], float)
        assert e.values["lr"] in (min(values[e.source]["lr"] * f, 1e-2) for f in (0.8, 1.2))
        assert isinstance(e.values["epochs"], int) and 1 <= e.values["epochs"] <= 8
    assert decide(7, 3, scores, values, 0.25, BOUNDS, (0.8, 1.2)) == exploits  # seeded: the same again
    drawn = {tuple((e.source, tuple(e.values.items())) for e in decide(7, g, scores, values, 0.25, BOUNDS,
                                                                         (0.8, 1.2))) for g in range(12)}
    assert len(drawn) > 1  # and each generation draws anew


@pytest.mark.parametrize(("change", "named"), [
    ({"pbt": None}, "strategy pbt takes pbt's settings"),
    ({"strategy": "grid"}, "strategy pbt takes pbt's settings"),
    ({"seeds": [0], "grid": {"learning_rate": [1e-3]}}, "a population of 1 has no member in its 0.25 quantile"),
    ({"pbt": {"interval": 2, "mutable": {"lerning_rate": [1e-5, 1e-2]}}}, "pbt.mutable: unknown key lerning_rate"),
    ({"pbt": {"interval": 2, "mutable": {"learning_rate": [1e-2, 1e-5]}}}, "0 < low < high"),
    ({"pbt": {"interval": 2, "mutable": {"seed": [1, 5]}}}, "pbt.mutable: seed set by the sweep itself"),
    ({"pbt": {"interval": 4, "mutable": {"learning_rate": [1e-5, 1e-2]}}}, "leaves no decision in 4 iterations"),
    ({"pbt": {"interval": 2, "mutable": {"env": [1, 2]}}}, "pbt.mutable: env not a number"),
])
def test_a_bad_population_is_refused_naming_the_field(change: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_spec({"name": NAME, **SPEC, **change}).members()


def _sweep(store: str):
    from flows.sweep import sweep

    return sweep(name=NAME, store=store, return_state=True, **SPEC)


@pytest.fixture(scope="module")
def population(tmp_path_factory, prefect_api, local_ray) -> tuple:
    """The population, trained once undisturbed: (its store's folder, the sweep's final state)."""
    folder = tmp_path_factory.mktemp("pbt")
    return folder, _sweep(f"file://{folder}")


@pytest.mark.slow
def test_a_population_exploits_by_zero_copy_forks_and_draws_its_lineage(population) -> None:
    folder, state = population
    report = state.result()
    decided = json.loads((folder / NAME / "pbt" / "g0.json").read_text())
    assert decided["version"] == 2 and len(decided["exploits"]) == 1  # a quarter of 4
    exploit = decided["exploits"][0]
    rows = {r["member"]: r for r in report["members"]}
    forked = rows[exploit["member"]]
    assert forked["run"] == f"{exploit['member']}-g1" and forked["values"] == exploit["values"]
    run = json.loads((folder / forked["run"] / "run.json").read_text())
    assert run["forked_from"]["run"] == exploit["source"] and run["forked_from"]["version"] == 2
    assert run["config"]["algorithm"]["learning_rate"] == exploit["values"]["learning_rate"]
    assert run["config"]["seed"] == forked["seed"]  # its own luck from the fork on
    borrowed = CheckpointStore(f"{folder}/{forked['run']}/checkpoints").meta(2)["forked_from"]
    assert borrowed["run"] == exploit["source"]  # version 2 is the source's, borrowed (tests/checkpoint/test_fork.py)
    for row in rows.values():
        store = CheckpointStore(f"{folder}/{row['run']}/checkpoints")
        assert store.latest() == 4 and store.verify()["errors"] == {}
    assert [g["version"] for g in report["generations"]] == [2, 4]
    from flows.train_control import train_control

    kept = next(m for m in load_spec({"name": NAME, **SPEC}).members() if m.name != exploit["member"])
    alone = train_control(**{**kept.options, "run_name": "alone", "store": f"file://{folder}/alone"})
    assert alone["policy_sha256"] == rows[kept.name]["policy_sha256"]  # generations do not change how a run learns
    assert report["missing"] == [] and report["failed"] == {} and report["groups"][0]["members"] == 4
    page = folder / NAME
    assert (page / "lineage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{exploit['member']} <- {exploit['source']}" in (page / "report.md").read_text()
    assert "data:image/png;base64," in artifacts(state.state_details.flow_run_id)[f"{NAME}-sweep-report"].data


@pytest.mark.slow
@pytest.mark.chaos  # a SIGKILL drill of 40-50 s: make chaos
def test_a_population_killed_mid_generation_and_run_again_ends_bit_identical(population, tmp_path) -> None:
    """SIGKILL the sweep's command (its process group: the flow, its Prefect API, its Ray) while generation 1 trains,
    after generation 0's decision and forks; the same command ends with every member's weights equal to the
    undisturbed population's, and decides the same."""
    folder, state = population
    expected = {r["member"]: (r["run"], r["policy_sha256"]) for r in state.result()["members"]}
    spec = tmp_path / "pop.yaml"
    spec.write_text(json.dumps({**SPEC, "store": f"file://{tmp_path}/runs"}))  # JSON is YAML
    cmd = [sys.executable, "-m", "flows.tooling.cli", "sweep", "run", NAME, "--spec", str(spec)]
    faults = tmp_path / "faults"
    faults.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GYMFLOW_FAULT_DIR": str(faults),
           "GYMFLOW_FAULTS": "simulate.rollout_end:iteration=3,worker=0,action=stall"}
    decision = tmp_path / "runs" / NAME / "pbt" / "g0.json"
    kill_when(cmd, env, lambda: decision.exists() and any(faults.iterdir()), 300,
              "reached generation 1's stalled iteration")
    assert not (tmp_path / "runs" / NAME / "report.json").exists()
    env.pop("GYMFLOW_FAULTS")
    done = subprocess.run(cmd, env=env, start_new_session=True, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    again = json.loads((tmp_path / "runs" / NAME / "report.json").read_text())
    assert {r["member"]: (r["run"], r["policy_sha256"]) for r in again["members"]} == expected
    assert decision.read_text() == (folder / NAME / "pbt" / "g0.json").read_text()


@pytest.mark.parametrize(("file", "members", "strategy"), [("halfcheetah-lr.yaml", 10, "grid"),
                                                           ("halfcheetah-pbt.yaml", 4, "pbt")])
def test_the_guides_halfcheetah_spec_files_build_their_members(file: str, members: int, strategy: str) -> None:
    from flows.tooling.cli import parse_args
    from flows.tooling.sweep_cli import spec_values

    spec = load_spec(spec_values(parse_args(["sweep", "run", "cheetah", "--spec", f"examples/sweeps/{file}"])))
    assert len(spec.members()) == members and spec.strategy == strategy


def test_pbt_flags_override_the_spec_files_settings() -> None:
    from flows.tooling.cli import parse_args
    from flows.tooling.sweep_cli import spec_values

    values = spec_values(parse_args(["sweep", "run", "cheetah", "--spec", "examples/sweeps/halfcheetah-pbt.yaml",
                                     "--interval", "10", "--mutable", "ent_coef=1e-4,0.01"]))
    assert values["pbt"]["interval"] == 10 and values["pbt"]["quantile"] == 0.25
    assert values["pbt"]["mutable"] == {"ent_coef": [1e-4, 0.01]}  # the flags' mutable fields replace the file's
    with pytest.raises(ConfigError, match="expected FIELD=LOW,HIGH"):
        spec_values(parse_args(["sweep", "run", "x", "--strategy", "pbt", "--mutable", "learning_rate=1e-3"]))
