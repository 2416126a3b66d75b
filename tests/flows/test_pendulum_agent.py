"""The pendulum tuner (examples/agents/pendulum_tuner.py): an agent program whose reward comes from MuJoCo, through a
tool that runs our batched envs. It trains through the real flow, its simulations on the Ray simulation workers, and
the model reads nothing it cannot spell."""
from __future__ import annotations

import pytest

from examples.agents import pendulum_tuner
from rl_core.checkpoint import CheckpointStore
from rl_core.data import read_tensors
from rl_core.envs.agent.pendulum_gains import ALPHABET, EPISODE_STEPS, PendulumGains
from tests.flows.flow_helpers import task_runs

AGENT = "examples.agents.pendulum_tuner:run"
SEED = 7
CONTEXT = 96  # the default model context: prompt, first plan, feedback and a revised plan must fit it
LONGEST_PLAN = "kp=12.34 kd=1.23\n"


def test_the_feedback_is_in_the_alphabet_for_every_score_and_leaves_room_for_the_revision() -> None:
    prompts = [PendulumGains().reset(seed) for seed in range(0, 200, 2)]
    for up in [None, *(steps / EPISODE_STEPS for steps in range(EPISODE_STEPS + 1))]:
        told = pendulum_tuner.feedback(up)
        assert set(told) <= set(ALPHABET), told
        assert all(1 + len(p) + len(LONGEST_PLAN) + len(told) + len(LONGEST_PLAN) <= CONTEXT for p in prompts)
    assert pendulum_tuner.feedback(0.445) == "up=0.45:" and pendulum_tuner.feedback(None) == "no plan:"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api", "local_ray")  # on this test only: the fast one above needs neither
def test_the_tuner_trains_through_the_flow_on_rewards_simulated_by_the_workers(tmp_path) -> None:
    from flows.train_agent import train_agent

    state = train_agent(preset="tiny", store=f"file://{tmp_path}/runs", run_name="pendulum-tuner", seed=SEED,
                        env="PendulumGains-v0", num_workers=2, sft_steps=300, sft_batch_size=32, agent=AGENT,
                        return_state=True)  # enough SFT to write well-formed first plans
    summary = state.result()
    assert CheckpointStore(f"{summary['run_dir']}/checkpoints").versions() == [0, 1, 2]
    rollouts = [t.state.result() for t in task_runs(state.state_details.flow_run_id) if t.name.startswith("rollout")]
    assert len(rollouts) == 2
    for rollout in rollouts:  # two calls an episode, none failed, nothing replayed in a run that never failed
        assert rollout["program_calls"] == 2 * rollout["episodes"], rollout
        assert rollout["program_failed_programs"] == 0 and rollout["program_divergences"] == 0
    chunk, header = read_tensors(f"{summary['run_dir']}/trajectories/000000/chunk-000.safetensors")
    episodes = len(header["infos"])
    assert all(len(reasons) == 2 for reasons in header["finish_reasons"])
    # one row per episode, as the second prompt extends the first: plan (turn 1), feedback (2), revised plan (3)
    assert chunk["row_episode"].tolist() == list(range(episodes))
    assert all(set(turns.tolist()) >= {1, 2, 3} for turns in chunk["turns"])
    assert chunk["rewards"].max() > 0  # some plan kept the pole up a while: the reward came from MuJoCo
    for info, reward in zip(header["infos"], chunk["rewards"].tolist()):
        assert reward == pytest.approx(max(info["first_up"] or 0.0, info["second_up"] or 0.0))
    assert 0 <= summary["mean_reward_final"] <= 1
