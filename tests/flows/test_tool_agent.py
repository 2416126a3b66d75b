"""The tool agent (examples/agents/tool_agent.py) through the real flow: OpenAI tool calling on LookupCalc-v0, the
model's `<look>`/`<calc>` tags handed to the program as `tool_calls` and its `tool` messages handed back as `<out>`
text, trains the same weights to the bit as the env's own turn loop: not one token changed on the way."""
from __future__ import annotations

import pytest

from rl_core.data import read_tensors
from tests.flows.flow_helpers import task_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "local_ray")]
SEED = 7
AGENT = "examples.agents.tool_agent:run"
SETTINGS = {"preset": "tiny", "seed": SEED, "env": "LookupCalc-v0", "sft_steps": 300, "sft_batch_size": 32}


def test_the_tool_agent_trains_the_same_weights_as_the_turn_loop(tmp_path) -> None:
    from flows.train_agent import train_agent

    store = f"file://{tmp_path}/runs"
    loop = train_agent(store=store, run_name="turn-loop", **SETTINGS)
    state = train_agent(store=store, run_name="tool-agent", agent=AGENT, return_state=True, **SETTINGS)
    tools = state.result()
    assert tools["policy_sha256"] == loop["policy_sha256"] and tools["tokens_generated"] == loop["tokens_generated"]
    rollouts = [t.state.result() for t in task_runs(state.state_details.flow_run_id) if t.name.startswith("rollout")]
    assert sum(r["program_calls"] for r in rollouts) > sum(r["episodes"] for r in rollouts)  # tools were called
    assert all(r["program_failed_programs"] == 0 for r in rollouts)
    _, header = read_tensors(f"{tools['run_dir']}/trajectories/000001/chunk-000.safetensors")
    called = [name for info in header["infos"] for name in info["called"]]
    assert set(called) <= {"lookup", "calculator"} and called
