"""A member that fails for good (a bad override a deployment run's parameters let through: the command line's
preflight refuses it before anything runs) does not stop the others: the sweep trains them, reports that member as
failed with its error, and fails itself so the run shows it."""
from __future__ import annotations

import json

import pytest

from rl_core.checkpoint import CheckpointStore


@pytest.mark.slow
def test_a_member_that_fails_for_good_is_reported_with_its_error(tmp_path, prefect_api, local_ray) -> None:
    from flows.sweep import sweep

    state = sweep(name="envs", grid={"env": ["HalfCheetah-v5", "NoSuch-v0"]},
                  options={"preset": "tiny", "iterations": 1, "num_workers": 1, "num_ranks": 1},
                  store=f"file://{tmp_path}", return_state=True)
    assert state.is_failed() and "1 of 2 members failed (envs-env-NoSuch-v0-s0)" in state.message
    report = json.loads((tmp_path / "envs" / "report.json").read_text())
    assert list(report["failed"]) == ["envs-env-NoSuch-v0-s0"]
    assert "unknown environment 'NoSuch-v0'" in report["failed"]["envs-env-NoSuch-v0-s0"]
    rows = {r["member"]: r for r in report["members"]}
    assert rows["envs-env-NoSuch-v0-s0"]["score"] is None and "NoSuch-v0" in rows["envs-env-NoSuch-v0-s0"]["error"]
    assert rows["envs-env-HalfCheetah-v5-s0"]["score"] is not None
    assert CheckpointStore(f"{tmp_path}/envs-env-HalfCheetah-v5-s0/checkpoints").latest() == 1
    assert "- envs-env-NoSuch-v0-s0: " in (tmp_path / "envs" / "report.md").read_text()
