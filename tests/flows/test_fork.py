"""Forks trained by the ordinary flows: `gymflow fork` (through its command function), then the training command it
prints (parsed by the command line's own parser, run as the flow) continues the fork from the borrowed version; every
version verifies, and the fork's own versions live in the fork's folder."""
from __future__ import annotations

import argparse

import pytest

from flows.tooling.cli import parse_args
from flows.tooling.export import export_version
from flows.tooling.fork import add_fork_parser, fork_command
from rl_core.algos.base import policy_sha256
from rl_core.checkpoint import CheckpointStore
from rl_core.config.launch_options import agent_launch_options, launch_options

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "local_ray")]


def _fork(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_fork_parser(parser.add_subparsers(dest="command"), "file://./runs", "")
    return fork_command(parser.parse_args(["fork", *argv]))


def _continue(command: list[str]) -> dict:
    """The printed training command, as `gymflow train`/`train-agent` runs it: the same options to the same flow."""
    args = parse_args(command[1:])
    if args.command == "train":
        from flows.train_control import train_control

        return train_control(**{name: getattr(args, name) for name in launch_options()})
    from flows.train_agent import train_agent

    return train_agent(**{name: getattr(args, name) for name in agent_launch_options()})


def _own_objects(store: CheckpointStore, version: int) -> bool:
    """Whether every stored object of `version` is in `store`'s own folder."""
    objects = store._objects
    return all(objects.fs.exists(objects.chunk_path(sha))
               for sha in store._reader.manifest(version, version).stored_objects())


def test_a_control_fork_continues_with_the_training_command(tmp_path, monkeypatch) -> None:
    from flows.train_control import train_control

    monkeypatch.setenv("GYMFLOW_KERNELS", "reference")  # the same kernels in every run, tuned or not
    store = f"file://{tmp_path}/runs"
    train_control(preset="tiny", store=store, run_name="p", seed=3)  # versions 0, 1, 2
    parent = CheckpointStore(f"{tmp_path}/runs/p/checkpoints")

    same = _fork(["p@1", "same", "--store", store])  # changes nothing: computes what the parent computed
    assert same["versions"] == [1]
    _continue(same["continue"])
    again = CheckpointStore(f"{tmp_path}/runs/same/checkpoints")
    assert again.versions() == [1, 2] and again.verify()["errors"] == {}
    assert policy_sha256(again.load(2).tensors) == policy_sha256(parent.load(2).tensors)

    longer = _fork(["p@2", "longer", "--store", store, "--set", "iterations=4", "--set", "seed=4",
                    "--set", "num_workers=1", "--set", "envs_per_worker=8"])
    summary = _continue(longer["continue"])
    fork = CheckpointStore(f"{tmp_path}/runs/longer/checkpoints")
    assert fork.versions() == [2, 3, 4] and summary["iterations"] == 4 and fork.verify()["errors"] == {}
    assert fork.meta(4)["env_steps"] == parent.meta(2)["env_steps"] * 2  # its counters went on from the parent's
    assert fork.manifest(2)["borrowed"] and _own_objects(fork, 3) and _own_objects(fork, 4)
    assert fork.meta(4)["seed"] == 4 and fork.load(4).tensors["env.episode_step"].shape == (8,)

    for version in (2, 4):  # a borrowed version and one of the fork's own export as any run's
        exported = export_version("longer", store, version, "safetensors", tmp_path / f"longer-{version}.safetensors")
        assert exported["version"] == version
    parent.gc(keep_last=1, grace_s=0)  # keeps what the forks borrowed (1 and 2)
    assert set(parent.versions()) >= {1, 2}
    for name in ("same", "longer"):
        assert CheckpointStore(f"{tmp_path}/runs/{name}/checkpoints").verify()["errors"] == {}


def test_an_agent_fork_with_staleness_continues_with_the_training_command(tmp_path) -> None:
    from flows.train_agent import train_agent

    store = f"file://{tmp_path}/runs"
    train_agent(preset="tiny", store=store, run_name="a", seed=7)  # versions 0, 1, 2
    made = _fork(["a@1", "b", "--store", store, "--set", "iterations=3", "--set", "max_staleness=1",
                  "--set", "learning_rate=1e-4"])
    assert made["versions"] == [0, 1]  # iteration 1 samples from version 0 with staleness 1
    summary = _continue(made["continue"])
    fork = CheckpointStore(f"{tmp_path}/runs/b/checkpoints")
    assert fork.versions() == [0, 1, 2, 3] and summary["iterations"] == 3 and fork.verify()["errors"] == {}
    assert fork.meta(2)["generated_by_versions"] == [0] and fork.meta(3)["generated_by_versions"] == [1]
    assert _own_objects(fork, 2) and _own_objects(fork, 3)
    assert fork.meta(1)["forked_from"]["run"] == "a" and fork.meta(3)["config"]["algorithm"]["learning_rate"] == 1e-4
