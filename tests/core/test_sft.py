"""The SFT warm start: demonstrations laid out as rollouts lay out episodes (loss on the agent's tokens only),
a loss that falls, and a warm start that is a pure function of the config."""
from __future__ import annotations

import numpy as np

from rl_core.algos.grpo.learner import GRPOLearner
from rl_core.algos.grpo.sft import demonstration_segment
from rl_core.config.presets import build_agent_config
from rl_core.envs.agent import make_agent_env
from rl_core.envs.agent.pendulum_gains import parse_plan
from rl_core.policies.char_tokenizer import CharTokenizer


def test_a_tool_demonstration_trains_on_the_agents_tokens_only() -> None:
    env = make_agent_env("CalcTool-v0")
    tokenizer = CharTokenizer(env.alphabet)
    seed = next(s for s in env.problem_seeds("train", 50) if len(env.sft_demonstration(s)) == 2)  # with the tool
    segment = demonstration_segment(env, tokenizer, seed)
    call, answer = env.demonstration(seed)
    trained = "".join(tokenizer.decode([t]) for t, m in zip(segment.tokens, segment.loss_mask) if m)
    assert trained == call + answer
    output = tokenizer.decode(t for t, turn in zip(segment.tokens, segment.turns) if turn == 2)
    assert output == f"<out>{answer[5:-6]}</out>"  # the tool's output: in the sequence, not in the loss


def test_warm_start_lowers_the_loss_and_repeats_exactly() -> None:
    cfg = build_agent_config("tiny", sft_steps=40, sft_batch_size=16)
    runs = [GRPOLearner(cfg) for _ in range(2)]
    metrics = [learner.warm_start() for learner in runs]
    assert metrics[0]["sft_last_loss"] < 0.6 * metrics[0]["sft_first_loss"]
    for name, value in runs[0].state().items():
        assert np.array_equal(value, runs[1].state()[name]), name


def test_pendulum_warm_start_writes_plans_good_and_bad() -> None:
    env = make_agent_env("PendulumGains-v0")
    plans = [parse_plan(env.sft_demonstration(seed)[0]) for seed in env.problem_seeds("train", 64)]
    rewards = env.evaluator(plans, env.problem_seeds("train", 64))
    assert 0.05 < np.mean(np.array(rewards) == 1.0) < 0.8  # RL has room to gain, and something to find
