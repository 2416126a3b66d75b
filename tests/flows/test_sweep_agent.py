"""An agent (GRPO) population: two tiny agent runs, one generation apart, the worse one forking the better with a
perturbed learning rate (a launch option of agent runs, where a control run's is an algorithm field)."""
from __future__ import annotations

import json

import pytest

from rl_core.checkpoint import CheckpointStore


@pytest.mark.slow
def test_an_agent_population_trains_exploits_and_reports(tmp_path, prefect_api, local_ray) -> None:
    from flows.sweep import sweep

    report = sweep(name="agents", flow="agent", seeds=[0, 1], options={"preset": "tiny", "iterations": 2},
                   store=f"file://{tmp_path}", max_concurrent=1, strategy="pbt",
                   pbt={"interval": 1, "quantile": 0.5, "mutable": {"learning_rate": [1e-6, 1e-2]}})
    [exploit] = json.loads((tmp_path / "agents" / "pbt" / "g0.json").read_text())["exploits"]
    rows = {r["member"]: r for r in report["members"]}
    assert rows[exploit["member"]]["run"] == f"{exploit['member']}-g1"
    run = json.loads((tmp_path / f"{exploit['member']}-g1" / "run.json").read_text())
    assert run["forked_from"]["run"] == exploit["source"] and run["forked_from"]["version"] == 1
    assert run["config"]["algorithm"]["learning_rate"] == exploit["values"]["learning_rate"]
    for row in rows.values():
        store = CheckpointStore(f"{tmp_path}/{row['run']}/checkpoints")
        assert store.latest() == 2 and store.verify()["errors"] == {}
        assert 0 <= row["score"] <= 1  # held-out accuracy
