"""The CommitPipeline: one writer per flow run, reused by each of its commits (a rerun builds its own), one commit in
flight at a time, and a commit that lands as another version than its iteration's is refused by name."""
from __future__ import annotations

import pytest
from prefect import flow, task

from flows.run.commit_pipeline import CommitPipeline
from rl_core.checkpoint import CheckpointStore
from rl_core.config.presets import build_control_config
from rl_core.iteration_clock import StepWaits


@task
def _fake_diff(cfg, incarnation: str, iteration: int, version: int, staged: str, experience: list[str],
               writer: CheckpointStore) -> dict:
    """checkpoint_diff's signature; answers the version it would commit and which store it was handed."""
    _fake_diff.writers.append(writer)
    return {"version": version + 1 if staged != "wrong" else version + 7}


_fake_diff.writers = []


@flow
def _two_iterations(store: str) -> list[int]:
    cfg = build_control_config("tiny", run_name="kept", store=store)
    commits = CommitPipeline(cfg, _fake_diff)
    landed = []
    for iteration in range(2):
        commits.add("inc", iteration, iteration, "staged", [], context=f"iteration {iteration}")
        with pytest.raises(RuntimeError, match="has not landed: versions land in order"):
            commits.add("inc", iteration + 1, iteration + 1, "staged", [])
        commits.start()
        done = commits.land(StepWaits())
        assert done.context == f"iteration {iteration}"
        landed.append(done.committed["version"])
    commits.add("inc", 2, 2, "wrong", [])
    with pytest.raises(RuntimeError, match="iteration 2 committed version 9, expected 3"):
        commits.land(StepWaits())
    commits.close()
    assert commits.writer is None
    return landed


def test_a_flow_run_keeps_one_writer_and_the_next_run_opens_its_own(tmp_path, prefect_api) -> None:
    store = f"file://{tmp_path}/runs"
    _fake_diff.writers.clear()
    assert _two_iterations(store) == [1, 2]
    first = list(_fake_diff.writers)
    _two_iterations(store)
    second = _fake_diff.writers[len(first):]
    assert all(w is first[0] for w in first) and all(w is second[0] for w in second)
    assert first[0] is not second[0] and first[0]._sole_writer
