"""A sweep's members one at a time reuse the env-worker and trainer-rank processes of the members before them
(`rl_core.runtime.warm_actors`), and each ends with the weights it has when trained alone in fresh processes."""
from __future__ import annotations

import pytest

from rl_core.runtime import warm_actors

OPTIONS = {"preset": "tiny", "iterations": 2, "num_workers": 1, "num_ranks": 1}


@pytest.mark.slow
def test_members_in_turn_reuse_their_processes_and_train_what_fresh_processes_train(
        tmp_path, prefect_api, local_ray, monkeypatch) -> None:
    from flows.sweep import sweep
    from flows.train_control import train_control
    from rl_core.config.sweep import load_spec

    taken: list[bool] = []  # per actor a member asked for: whether it was a parked one
    take_or_start = warm_actors.ParkedActors.take_or_start

    def recorded(self, kind: str, run: str):
        handle = take_or_start(self, kind, run)
        taken.append(handle is not None)
        return handle

    monkeypatch.setattr(warm_actors.ParkedActors, "take_or_start", recorded)
    given = {"name": "warm", "seeds": [0, 1, 2], "options": OPTIONS, "store": f"file://{tmp_path}/sweep",
             "max_concurrent": 1}
    report = sweep(**given)
    assert taken == [False, False, True, True, True, True]  # the first member starts both; the others take them
    swept = {m["member"]: m["policy_sha256"] for m in report["members"]}
    last = load_spec(given).members()[-1]
    alone = train_control(**{**last.options, "run_name": "alone", "store": f"file://{tmp_path}/alone"})
    assert alone["policy_sha256"] == swept[last.name]
