"""checkpoint_diff's kept store: one per flow run, reused by each of its commits, opened afresh by the next run (a
rerun from the UI, or a second run on a long-lived worker), and dropped at the run's end."""
from __future__ import annotations

from prefect import flow, task

import tasks.checkpoint_diff as checkpoint_diff_module
from rl_core.checkpoint import CheckpointStore
from rl_core.config.control_presets import build_config


@task
def _writer(store: str) -> CheckpointStore:
    cfg = build_config("tiny", run_name="kept", store=store)
    return checkpoint_diff_module._flow_run_writer(cfg)


@flow
def _two_commits_worth(store: str) -> list[CheckpointStore]:
    return [_writer(store), _writer(store)]


def test_a_flow_run_keeps_one_store_and_the_next_run_opens_its_own(tmp_path, prefect_api) -> None:
    store = f"file://{tmp_path}/runs"
    first = _two_commits_worth(store)
    second = _two_commits_worth(store)
    assert first[0] is first[1] and second[0] is second[1] and first[0] is not second[0]
    checkpoint_diff_module.release_flow_run_writer()
    assert checkpoint_diff_module._writer is None
