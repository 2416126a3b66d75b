"""The instability guard in a real flow run: an iteration whose advantages are NaN (a poisoned batch, injected)
skips every minibatch update, gives up at algorithm.nonfinite_limit, and rolls back to the last committed version;
the run completes, the poisoned iteration's version repeats its parent's state, and training goes on after it."""
from __future__ import annotations

import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore
from rl_core.reporting.metric_sinks import read_metrics
from tests.flows.flow_helpers import inject_faults

LEARNER = ("model.", "obs_norm.", "return_norm.", "optim.")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "local_ray")]


def test_a_poisoned_update_rolls_back_and_the_run_goes_on(tmp_path, monkeypatch) -> None:
    from flows.train_control import train_control

    inject_faults(monkeypatch, tmp_path, "train.batch:iteration=1,action=poison")
    summary = train_control(preset="tiny", store=f"file://{tmp_path}/runs", run_name="poisoned", iterations=3,
                            nonfinite_limit=2)
    store = CheckpointStore(f"{summary['run_dir']}/checkpoints")
    assert store.versions() == [0, 1, 2, 3]
    states = {v: store.load(v) for v in (1, 2, 3)}
    assert states[2].tensors.keys() == states[1].tensors.keys()
    learner = [k for k in states[1].tensors if k.startswith(LEARNER)]
    assert any(k.startswith("model.") for k in learner) and any(k.startswith("optim.") for k in learner), learner
    changed = sorted(k for k, v in states[1].tensors.items() if not np.array_equal(states[2].tensors[k], v))
    assert not [k for k in changed if k.startswith(LEARNER)], changed  # the learner rolled back
    assert changed, "the envs moved on (their state is in the version too)"
    assert any(not np.array_equal(states[3].tensors[k], v) for k, v in states[2].tensors.items())  # trains on
    assert all(np.isfinite(v).all() for v in states[3].tensors.values() if v.dtype.kind == "f")
    metrics = {int(r["iteration"]): r for r in read_metrics(summary["run_dir"])}
    assert metrics[2]["rolled_back"] == 1 and metrics[2]["skipped_updates"] == 2 and metrics[2]["rolled_back_to"] == 1
    assert "rolled_back" not in metrics[1] and "rolled_back" not in metrics[3]
    assert summary["iterations"] == 3 and np.isfinite(summary["final_return"])
