"""Env workers and trainer ranks (without Ray): restoring from a version continues exactly as staying in memory.

This is what makes retries and resumes exact: a step run by a fresh process that restores from the store
must produce the same bytes as the long-lived actor that just carried on.
"""
from __future__ import annotations

import uuid

import numpy as np
import pytest

from rl_core.algos.base import build_learner
from rl_core.checkpoint import CheckpointStore
from rl_core.config.presets import build_control_config
from rl_core.data import RunLayout, read_tensors, write_tensors
from rl_core.runtime.commits import commit_initial, commit_iteration, writer_store
from rl_core.runtime.control.env_worker import EnvWorker
from rl_core.runtime.trainer import TrainerRank
from tasks.score import score


@pytest.fixture
def cfg():
    return build_control_config("tiny", run_name="w", store=f"memory://gymflow-test-{uuid.uuid4().hex}", num_ranks=1)


def _start_run(cfg) -> None:
    commit_initial(cfg, build_learner(cfg).state())


def test_simulate_after_restore_equals_simulate_in_memory(cfg) -> None:
    _start_run(cfg)
    layout = RunLayout(cfg.run_url)
    worker = EnvWorker(cfg.model_dump_json(), 0)
    first = worker.simulate(0, 0)
    write_tensors(layout.staged_learner(0), build_learner(cfg).state())
    commit_iteration(cfg, 0, 0, layout.staged_learner(0), [first["uri"]])

    in_memory = read_tensors(worker.simulate(1, 1)["uri"])[0]
    restored = read_tensors(EnvWorker(cfg.model_dump_json(), 0).simulate(1, 1)["uri"])[0]
    assert in_memory.keys() == restored.keys()
    for key in in_memory:
        assert np.array_equal(in_memory[key], restored[key]), key


def test_commit_iteration_is_idempotent_and_checks_lineage(cfg) -> None:
    _start_run(cfg)
    layout = RunLayout(cfg.run_url)
    sim = EnvWorker(cfg.model_dump_json(), 0).simulate(0, 0)
    write_tensors(layout.staged_learner(0), build_learner(cfg).state())
    first = commit_iteration(cfg, 0, 0, layout.staged_learner(0), [sim["uri"]])
    again = commit_iteration(cfg, 0, 0, layout.staged_learner(0), [sim["uri"]])
    assert first["version"] == again["version"] == 1
    assert CheckpointStore(layout.checkpoints).versions() == [0, 1]
    with pytest.raises(RuntimeError, match="newest committed version"):
        commit_iteration(cfg, 5, 5, layout.staged_learner(0), [sim["uri"]])


def test_train_after_restore_equals_train_in_memory(cfg) -> None:
    _start_run(cfg)
    layout = RunLayout(cfg.run_url)
    sim = EnvWorker(cfg.model_dump_json(), 0).simulate(0, 0)
    score.fn(cfg, "inc", 0, 0, [sim["uri"]])
    rank = TrainerRank(cfg.model_dump_json(), 0, 1)
    metrics = rank.train(0, 0)
    assert np.isfinite(list(metrics.values())).all()
    commit_iteration(cfg, 0, 0, layout.staged_learner(0), [sim["uri"]])

    sim = EnvWorker(cfg.model_dump_json(), 0).simulate(1, 1)
    score.fn(cfg, "inc", 1, 1, [sim["uri"]])
    rank.train(1, 1)
    in_memory = read_tensors(layout.staged_learner(1))[0]
    TrainerRank(cfg.model_dump_json(), 0, 1).train(1, 1)
    restored = read_tensors(layout.staged_learner(1))[0]
    for key in in_memory:
        assert np.array_equal(in_memory[key], restored[key]), key


def test_a_version_whose_commit_has_not_landed_restores_from_the_step_outputs(cfg) -> None:
    """The flow commits v1 beside train_shard(1), after simulate(1): a fresh worker or rank restores v1 meanwhile from
    iteration 0's staged learner and experience shards, and computes what the long-lived ones compute."""
    _start_run(cfg)
    layout = RunLayout(cfg.run_url)
    worker, rank = EnvWorker(cfg.model_dump_json(), 0), TrainerRank(cfg.model_dump_json(), 0, 1)
    sim = worker.simulate(0, 0)
    score.fn(cfg, "inc", 0, 0, [sim["uri"]])
    rank.train(0, 0)  # stages v1's learner; v1 is not committed

    in_memory = read_tensors(worker.simulate(1, 1)["uri"])[0]
    restored = read_tensors(EnvWorker(cfg.model_dump_json(), 0).simulate(1, 1)["uri"])[0]
    assert in_memory.keys() == restored.keys()
    for key in in_memory:
        assert np.array_equal(in_memory[key], restored[key]), key
    score.fn(cfg, "inc", 1, 1, [layout.experience(1, 0)])
    rank.train(1, 1)
    trained = read_tensors(layout.staged_learner(1))[0]
    TrainerRank(cfg.model_dump_json(), 0, 1).train(1, 1)
    for key, value in read_tensors(layout.staged_learner(1))[0].items():
        assert np.array_equal(trained[key], value), key
    assert CheckpointStore(layout.checkpoints).versions() == [0]


def test_an_uncommitted_version_without_its_step_outputs_is_a_clear_error(cfg) -> None:
    _start_run(cfg)
    with pytest.raises(RuntimeError, match="version 3 of .* is not committed and iteration 2 left none of the learner state"):
        EnvWorker(cfg.model_dump_json(), 0).simulate(3, 3)


def test_a_kept_writer_commits_what_fresh_stores_commit(cfg) -> None:
    """A flow run keeps one store across its commits (`writer_store`); every version it writes restores to the
    bytes the step outputs held, as when each commit opened the store afresh."""
    _start_run(cfg)
    layout = RunLayout(cfg.run_url)
    kept = writer_store(cfg)
    worker = EnvWorker(cfg.model_dump_json(), 0)
    learner = build_learner(cfg)
    for iteration in range(cfg.storage.full_every + 2):  # across a rebase
        sim = worker.simulate(iteration, iteration)
        state = {name: value + iteration for name, value in learner.state().items()}
        write_tensors(layout.staged_learner(iteration), state)
        committed = commit_iteration(cfg, iteration, iteration, layout.staged_learner(iteration), [sim["uri"]], kept)
        assert committed["version"] == iteration + 1
        restored = CheckpointStore(layout.checkpoints).load(iteration + 1)
        for name, value in state.items():
            assert np.array_equal(restored.tensors[name], value), (iteration, name)
        assert restored.meta["iteration"] == iteration + 1
