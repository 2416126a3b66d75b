"""`gymflow fork` without training: what a fork may and may not change (named in the error), the run.json and
checkpoint lineage it writes, the versions it borrows, and the training command it prints, for both kinds of run.
The parents' versions are committed directly (the state's contents do not matter to a fork)."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest

from flows.tooling.cli import parse_args
from flows.tooling.fork import add_fork_parser, fork_command
from rl_core.checkpoint import CheckpointError, CheckpointStore
from rl_core.config.common import ConfigError
from rl_core.config.launch_options import agent_launch_options, launch_options
from rl_core.config.presets import build_agent_config, build_control_config
from rl_core.data.run_fork import make_fork, plan_fork
from rl_core.data.run_info import open_run
from rl_core.data.run_layout import RunLayout
from rl_core.data.run_listing import list_runs


def _fork(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_fork_parser(parser.add_subparsers(dest="command"), "file://./runs", "")
    return fork_command(parser.parse_args(["fork", *argv]))


def _parent(cfg, versions: int = 3) -> CheckpointStore:
    """A run whose checkpoints hold `versions` versions, as if it had trained that many iterations."""
    open_run(cfg)
    store = CheckpointStore(RunLayout(cfg.run_url).checkpoints)
    for i in range(versions):
        store.commit({"model.w": np.arange(1000, dtype=np.float32) + i}, {"iteration": i, "env_steps": 64 * i})
    return store


@pytest.fixture
def store(tmp_path) -> str:
    return f"file://{tmp_path}/runs"


def test_a_control_fork_records_its_lineage_and_prints_the_command_that_rebuilds_it(store: str, capsys) -> None:
    parent = _parent(build_control_config("tiny", run_name="p", store=store, iterations=3, seed=2))
    made = _fork(["p@1", "f", "--store", store, "--set", "iterations=6", "--set", "seed=5", "--set",
                  "num_workers=1", "--set", "envs_per_worker=8", "--set", "eval_episodes=3"])
    digest = parent._reader.digest(1)
    assert made["forked_from"] == {"run": "p", "version": 1, "manifest_sha256": digest} and made["versions"] == [1]
    with open(RunLayout(made["run_url"]).run_info.removeprefix("file://")) as run_json:
        record = json.load(run_json)
    assert record["forked_from"] == made["forked_from"] and record["config"]["seed"] == 5
    fork = CheckpointStore(RunLayout(made["run_url"]).checkpoints)
    meta = fork.meta(1)
    assert meta["forked_from"] == made["forked_from"] and meta["config"]["run_name"] == "f"
    assert meta["env_steps"] == 64 and meta["seed"] == 5  # the parent's counters go on; the fork's seed from here
    assert {r["run"]: r["forked_from"] for r in list_runs(store)} == {"f": made["forked_from"], "p": None}

    command = made["continue"]
    assert capsys.readouterr().out.splitlines()[-1] == "continue it with: " + " ".join(command)
    args = parse_args(command[1:])  # the command line's own parsing, then its building: the fork's config exactly
    rebuilt = build_control_config(**{name: getattr(args, name) for name in launch_options()})
    assert rebuilt.model_dump(mode="json") == record["config"]
    assert command[:4] == ["gymflow", "train", "--preset", "tiny"]


@pytest.mark.parametrize(("change", "field"), [
    ("env.name=Hopper-v5", "env.name"),
    ("algorithm.hidden=[32,32]", "algorithm.hidden"),
    ("num_workers=4", "env.num_workers x env.envs_per_worker"),
    ("storage.url=file:///elsewhere", "storage.url"),
    ("algorithm.log_std_init=-1.0", "algorithm.log_std_init"),
])
def test_a_control_fork_refuses_what_the_state_is_made_of(store: str, change: str, field: str) -> None:
    _parent(build_control_config("tiny", run_name="p", store=store, iterations=3))
    with pytest.raises(ConfigError, match=rf"a fork cannot change:\n  {field}: "):
        _fork(["p", "f", "--store", store, "--set", "iterations=9", "--set", change])
    assert [r["run"] for r in list_runs(store)] == ["p"]  # nothing written


def test_a_control_fork_keeps_the_seed_of_randomized_dynamics_and_asks_for_more_iterations(store: str) -> None:
    _parent(build_control_config("tiny", run_name="p", store=store, iterations=3, randomize_dynamics=0.2))
    with pytest.raises(ConfigError, match="seed: each env's randomized dynamics are drawn from the seed"):
        _fork(["p", "f", "--store", store, "--set", "seed=1", "--set", "iterations=9"])
    with pytest.raises(ConfigError, match=r"iterations: the fork starts at version 2 .* --set iterations=N"):
        _fork(["p", "f", "--store", store, "--set", "iterations=2"])
    made = _fork(["p", "f", "--store", store, "--set", "iterations=9"])
    assert "--randomize-dynamics" in made["continue"] and "0.2" in made["continue"]


def test_bad_requests_are_refused_naming_what_is_wrong(store: str) -> None:
    _parent(build_control_config("tiny", run_name="p", store=store, iterations=3))
    cases = [
        (["p", "f", "--set", "nonsense=1"], "nonsense: Extra inputs are not permitted"),
        (["p", "f", "--set", "iterations=-1"], "iterations: Input should be greater than or equal to 1"),
        (["p", "f", "--set", "env=Hopper-v5"], "'env' is a section; set its fields one by one"),
        (["p", "f", "--set", "iterations"], "expected field=value"),
        (["p", "f", "--set", "run_name=g"], "the fork's name is 'f'"),
        (["p@9", "f", "--set", "iterations=12"], "has no committed version 9 .*committed: 0, 1, 2"),
        (["p@x", "f"], r"the version after '@' is a number"),
        (["q", "f"], "no run 'q' under"),
        (["p", "p", "--set", "iterations=9"], "run 'p' exists under"),
        # PPO's fields have no option of `gymflow train`, which could then not continue the fork
        (["p", "f", "--set", "iterations=9", "--set", "algorithm.learning_rate=1e-4"],
         "`gymflow train` has no option for algorithm.learning_rate"),
    ]
    for argv, message in cases:
        with pytest.raises(ConfigError, match=message):
            _fork([*argv, "--store", store])
    assert [r["run"] for r in list_runs(store)] == ["p"]


def test_a_half_made_fork_is_finished_by_running_it_again(store: str) -> None:
    """Killed between borrowing the versions and writing the run.json: the same fork again writes the run.json."""
    _parent(build_control_config("tiny", run_name="p", store=store, iterations=3))
    plan = plan_fork(store, "p", "f", 2, {"iterations": 5})
    CheckpointStore(plan.parent_checkpoints).fork(RunLayout(plan.cfg.run_url).checkpoints, [2], lineage={"run": "p"})
    made = make_fork(plan_fork(store, "p", "f", 2, {"iterations": 5}), [2])
    assert made["forked_from"]["version"] == 2 and [r["run"] for r in list_runs(store)] == ["f", "p"]
    other = plan_fork(store, "p", "g", 1, {"iterations": 5})
    CheckpointStore(plan.parent_checkpoints).fork(RunLayout(other.cfg.run_url).checkpoints, [2])
    with pytest.raises(ConfigError, match=r"holds checkpoint versions \[2\] that are not this fork's"):
        make_fork(other, [1])


def test_a_version_that_fails_verification_is_not_forked_and_nothing_is_written(store: str, tmp_path) -> None:
    """A chunk only version 1 stores, corrupted in storage (bit rot, a torn write): forking version 1 is refused, and
    so is forking version 2 with overlap (its first collection acts with version 1's policy), each error naming the
    run, the version and the chunk; neither writes anything, not the new run nor a pin on the parent. Version 2 on
    its own (a full version, which reads nothing of version 1) still forks."""
    cfg = build_control_config("tiny", run_name="p", store=store, iterations=3)
    open_run(cfg)
    parent = CheckpointStore(RunLayout(cfg.run_url).checkpoints, full_every=2, embed_bytes=0)  # v1 a delta on v0
    weights = np.random.default_rng(0).standard_normal(50_000).astype(np.float32)
    for i in range(3):
        weights = weights.copy()
        weights[1000 * i:1000 * (i + 1)] += 1.0
        parent.commit({"model.w": weights}, {"iteration": i, "env_steps": 64 * i})

    def chunks(version: int) -> set[str]:
        return {c["chunk"] for e in parent.manifest(version)["tensors"].values() for c in e["chunks"]}

    [sha] = chunks(1) - chunks(0) - chunks(2)
    chunk = tmp_path / "runs" / "p" / "checkpoints" / "chunks" / sha[:2] / sha
    rotted = bytearray(chunk.read_bytes())
    rotted[len(rotted) // 2] ^= 0xFF
    chunk.write_bytes(bytes(rotted))
    for argv, refusal in [(["p@1", "f"], "version 1 of run 'p' does not restore, so it cannot be forked"),
                          (["p@2", "f", "--set", "overlap=true"],
                           "version 1 of run 'p' does not restore, so version 2, which reads it, cannot be forked")]:
        with pytest.raises(CheckpointError, match=rf"{re.escape(refusal)}: .*{sha[:12]}"):
            _fork([*argv, "--store", store, "--set", "iterations=5"])
        assert [r["run"] for r in list_runs(store)] == ["p"] and not (tmp_path / "runs" / "f").exists()
        assert parent.pins() == {}
    assert _fork(["p@2", "f", "--store", store, "--set", "iterations=5"])["versions"] == [2]


def test_an_agent_fork_changes_how_it_learns_not_its_model(store: str) -> None:
    parent_cfg = build_agent_config("tiny", run_name="a", store=store, iterations=3)
    _parent(parent_cfg)
    made = _fork(["a", "b", "--store", store, "--set", "iterations=5", "--set", "learning_rate=1e-4", "--set",
                  "sampling.temperature=0.7", "--set", "algorithm.beta=0"])
    assert made["versions"] == [0, 2]  # and the warm start, whose held-out accuracy the fork's run reports
    command = " ".join(made["continue"])
    assert command.startswith("gymflow train-agent --preset tiny --run-name b") and "--learning-rate 0.0001" in command
    args = parse_args(made["continue"][1:])
    rebuilt = build_agent_config(**{name: getattr(args, name) for name in agent_launch_options()})
    with open(RunLayout(made["run_url"]).run_info.removeprefix("file://")) as run_json:
        assert rebuilt.model_dump(mode="json") == json.load(run_json)["config"]
    assert rebuilt.algorithm.learning_rate == 1e-4 and rebuilt.sampling.temperature == 0.7
    for change, field in [("model.hidden_size=48", "model.hidden_size"), ("sft.steps=3", "sft.steps"),
                          ("env.name=Arithmetic-v0", "env.name"), ("algorithm.beta=0.1", "algorithm.beta")]:
        with pytest.raises(ConfigError, match=rf"a fork cannot change:\n  {field}: "):
            _fork(["a", "c", "--store", store, "--set", "iterations=9", "--set", change])


def test_an_agent_fork_with_staleness_borrows_the_version_its_first_rollout_samples_from(store: str) -> None:
    """With max_staleness 1, iteration i samples from version i - 1 (`behaviour_version`): the fork borrows both (and
    the warm start, version 0)."""
    _parent(build_agent_config("tiny", run_name="a", store=store, iterations=3))
    made = _fork(["a", "s", "--store", store, "--set", "iterations=5", "--set", "max_staleness=1"])
    assert made["versions"] == [0, 1, 2] and "--max-staleness 1" in " ".join(made["continue"])
    fork = CheckpointStore(RunLayout(made["run_url"]).checkpoints)
    assert fork.versions() == [0, 1, 2] and fork.verify()["errors"] == {}
    assert len(CheckpointStore(RunLayout(f"{store}/a").checkpoints).pins()) == 3


def test_a_control_fork_with_overlap_borrows_the_version_its_first_collection_acts_with(store: str) -> None:
    """With overlap, the envs of version v are stepped by the policy of version v - 1 (`acting_version`)."""
    _parent(build_control_config("tiny", run_name="p", store=store, iterations=3))
    made = _fork(["p", "o", "--store", store, "--set", "iterations=5", "--set", "overlap=true"])
    assert made["versions"] == [1, 2] and "--overlap" in made["continue"]
    assert CheckpointStore(RunLayout(made["run_url"]).checkpoints).verify()["errors"] == {}
