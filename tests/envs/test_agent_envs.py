"""Agent envs (rl_core.envs.agent): deterministic problems, disjoint splits, correct demonstrations, strict parsing."""
from __future__ import annotations

import pytest

from rl_core.envs import import_env_module
from rl_core.envs.agent import (
    AgentEnv,
    Arithmetic,
    CalcTool,
    LookupCalc,
    PendulumGains,
    agent_env_names,
    evaluate_plans,
    make_agent_env,
    register_agent_env,
    split_seeds,
    validate_agent_env_name,
)
from rl_core.envs.agent.calc_tool import SFT_TOOL_FRACTION
from rl_core.envs.agent.lookup_calc import CATALOGUE

BUILT_INS = ("Arithmetic-v0", "CalcTool-v0", "LookupCalc-v0", "PendulumGains-v0")
TEXT_ENVS = ("Arithmetic-v0", "CalcTool-v0", "LookupCalc-v0")  # cheap to score: many seeds per test


def play(env: AgentEnv, seed: int, actions: list[str]) -> tuple[list[str], float, dict]:
    """Run `actions` on problem `seed`; every observation (prompt first), the last reward and the last info."""
    observations = [env.reset(seed)]
    reward, done, info = 0.0, False, {}
    for turn, action in enumerate(actions, start=1):
        assert not done, f"episode ended before action {turn} of {actions}"
        observation, reward, done, info = env.step(action)
        observations.append(observation)
    assert done and turn <= env.max_turns, f"{actions} did not end the episode within {env.max_turns} turns"
    return observations, reward, info


@pytest.mark.parametrize("name", BUILT_INS)
def test_a_seed_is_one_problem_and_the_splits_share_none(name: str) -> None:
    env = make_agent_env(name)
    train, heldout = env.problem_seeds("train", 300), env.problem_seeds("heldout", 300)
    assert [env.reset(s) for s in train[:20]] == [make_agent_env(name).reset(s) for s in train[:20]]
    assert not set(train) & set(heldout)
    train_prompts, heldout_prompts = {env.reset(s) for s in train}, {env.reset(s) for s in heldout}
    assert len(heldout_prompts) > 20 and not train_prompts & heldout_prompts
    assert env.problem_seeds("train", 5, start=3) == train[3:8]


def test_a_bad_split_or_seed_says_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="split must be one of train, heldout, got 'test'"):
        split_seeds("test", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="problem seeds are >= 0"):
        Arithmetic().reset(-1)


@pytest.mark.parametrize("name", TEXT_ENVS)
def test_demonstrations_are_correct_and_in_the_alphabet(name: str) -> None:
    env = make_agent_env(name)
    for seed in env.problem_seeds("train", 30) + env.problem_seeds("heldout", 30):
        demonstration = env.demonstration(seed)
        observations, reward, info = play(env, seed, demonstration)
        assert (reward, info["correct"]) == (1.0, True), (seed, demonstration, info)
        assert set("".join(observations + demonstration)) <= set(env.alphabet)


def test_arithmetic_scores_the_integer_before_the_newline() -> None:
    env = Arithmetic()
    seed = next(s for s in env.problem_seeds("train", 100) if "-" in env.reset(s))
    answer = env.demonstration(seed)[0].rstrip("\n")
    assert play(env, seed, [answer])[1] == 1.0  # ended by the end of the text
    assert play(env, seed, [answer + "\n99"])[1] == 1.0  # text after the newline is not part of the action
    assert play(env, seed, [str(int(answer) + 1) + "\n"])[1] == 0.0
    _, reward, info = play(env, seed, ["about 7\n"])
    assert reward == 0.0 and not info["correct"] and "expected an integer" in info["error"]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("1\n")  # the episode is over
    assert {env.reset(s)[2] for s in env.problem_seeds("train", 100)} == {"+", "-", "*"}


def test_calc_tool_runs_the_calculator_then_scores_the_answer() -> None:
    env = CalcTool()
    prompt = env.reset(0)
    left, right = (int(n) for n in prompt.rstrip("=").split("*"))
    assert 100 <= left <= 999 and 10 <= right <= 99
    observation, reward, done, info = env.step(f"<calc>{left}*{right}</calc>")
    assert (observation, reward, done) == (f"<out>{left * right}</out>", 0.0, False) and info["tool_output"]
    observation, reward, done, info = env.step(f"<ans>{left * right}</ans>")
    assert (observation, reward, done, info["correct"], info["tool_calls"]) == ("", 1.0, True, True, 1)
    assert play(env, 0, ["<calc>12-40</calc>", f"<ans>{left * right + 1}</ans>"])[0][1] == "<out>-28</out>"
    _, reward, info = play(env, 0, [f"<ans>{left * right + 1}</ans>"])
    assert (reward, info["correct"], info["expected"]) == (0.0, False, str(left * right))
    assert play(env, 0, [f"<ans>{left * right}</ans> and more text"])[1] == 1.0  # the action ends at </ans>


@pytest.mark.parametrize("call", ["<calc>__import__('os')</calc>", "<calc>2**99</calc>", "<calc>1+2+3</calc>",
                                  "<calc>1234567*2</calc>", "<calc>12*3"])
def test_a_malformed_call_is_an_error_output_that_costs_a_turn(call: str) -> None:
    env = CalcTool()
    env.reset(4)
    observation, reward, done, info = env.step(call)
    assert (observation, reward, done, info["turn"]) == ("<out>error</out>", 0.0, False, 1) and info["tool_output"]
    assert "malformed tool call" in info["error"] and set(observation) <= set(env.alphabet)


def test_calc_tool_ends_without_reward_on_no_answer_or_too_many_turns() -> None:
    env = CalcTool()
    _, reward, info = play(env, 2, ["I think 40"])
    assert (reward, info["correct"]) == (0.0, False) and "expected a tool call" in info["error"]
    _, reward, info = play(env, 2, ["<ans>4O</ans>"])
    assert reward == 0.0 and "expected a tool call" in info["error"]
    calls = ["<calc>1*1</calc>"] * env.max_turns
    observations, reward, info = play(env, 2, calls)
    assert (reward, observations[-1]) == (0.0, "") and f"within {env.max_turns} turns" in info["error"]


def test_the_sft_mix_shows_the_tool_rarely() -> None:
    env = CalcTool()
    seeds = env.problem_seeds("train", 400)
    with_tool = [len(env.sft_demonstration(s)) == 2 for s in seeds]
    assert 0.5 * SFT_TOOL_FRACTION < sum(with_tool) / len(seeds) < 2 * SFT_TOOL_FRACTION
    for seed in seeds[:20]:
        assert play(env, seed, env.direct_demonstration(seed))[1] == 1.0
        assert env.sft_demonstration(seed) in (env.demonstration(seed), env.direct_demonstration(seed))


def test_lookup_calc_looks_the_price_up_multiplies_then_scores_the_answer() -> None:
    env = LookupCalc()
    item, quantity = env.reset(6).lstrip("$").rstrip("=").split("*")
    price = CATALOGUE[item]
    observations, reward, info = play(env, 6, [f"<look>{item}</look>", f"<calc>{price}*{quantity}</calc>",
                                               f"<ans>{price * int(quantity)}</ans>"])
    assert observations[1:3] == [f"<out>{price}</out>", f"<out>{price * int(quantity)}</out>"]
    assert (reward, info["correct"], info["tool_calls"]) == (1.0, True, 2)
    for bad in ("<look>7</look>", "<look>1+2</look>", "<calc>2**9</calc>"):
        env.reset(6)
        observation, reward, done, info = env.step(bad)
        assert (observation, done) == ("<out>error</out>", False) and "malformed tool call" in info["error"]
    _, reward, info = play(env, 6, ["12<look>00</look>"])  # text before a call is neither a call nor an answer
    assert reward == 0.0 and "expected a tool call" in info["error"]
    observations, reward, info = play(env, 6, ["<look>00</look>"] * env.max_turns)
    assert (reward, observations[-1]) == (0.0, "") and f"within {env.max_turns} turns" in info["error"]


def test_lookup_calc_declares_its_tools_and_the_format_its_model_writes_them_in() -> None:
    env = LookupCalc()
    assert [tool["function"]["name"] for tool in env.tools] == ["lookup", "calculator"]
    content, calls = env.tool_format.parse("<look>17</look>", "c")
    assert content is None and calls == [{"id": "c_0", "type": "function", "function": {
        "name": "lookup", "arguments": '{"item": "17"}'}}]
    assert env.tool_format.assistant_text(content, calls) == "<look>17</look>"
    assert env.tool_format.result_text("374") == "<out>374</out>"


def test_pendulum_gains_are_scored_by_the_simulation() -> None:
    env = PendulumGains()
    seeds = env.problem_seeds("train", 2) + env.problem_seeds("heldout", 2)
    for seed in seeds:
        demonstration = env.demonstration(seed)
        observations, reward, info = play(env, seed, demonstration)
        assert reward >= 0.9 and info["kp"] > 0, (observations[0], info)
        assert set(observations[0] + demonstration[0]) <= set(env.alphabet)
    bad = evaluate_plans([(0.0, 0.0)] * len(seeds), seeds)
    assert max(bad) < 0.3, bad


@pytest.mark.parametrize("plan, error", [("kp=12.5", "expected a plan like"), ("kp=1e3 kd=1", "expected a plan"),
                                         ("kp=12.5 kd=12", "kd=12 is outside [0, 10]"),
                                         ("kp = 3 kd = 1", "expected a plan")])
def test_an_unusable_plan_earns_nothing_and_says_why(plan: str, error: str) -> None:
    _, reward, info = play(PendulumGains(evaluator=lambda plans, seeds: pytest.fail("scored")), 0, [plan])
    assert (reward, info["correct"]) == (0.0, False) and error in info["error"]


def test_plans_score_the_same_in_a_batch_as_one_by_one() -> None:
    plans = [(10.0, 1.0), (0.0, 0.0), (30.0, 0.5), (2.0, 2.0), (50.0, 10.0)]
    seeds = [0, 0, 3, 5, 8]
    batched = evaluate_plans(plans, seeds)
    assert batched == [evaluate_plans([plan], [seed])[0] for plan, seed in zip(plans, seeds, strict=True)]
    assert len(set(batched)) > 2  # the plans differ, so the check above compares different rewards
    with pytest.raises(ValueError, match="one seed per plan"):
        evaluate_plans(plans, seeds[:2])


def test_a_runtime_routes_the_scoring_through_its_own_evaluator() -> None:
    calls = []

    def evaluator(plans: list[tuple[float, float]], seeds: list[int]) -> list[float]:
        calls.append((plans, seeds))
        return [0.25] * len(plans)

    _, reward, _ = play(PendulumGains(evaluator=evaluator), 6, ["kp=12.5 kd=1.25\n"])
    assert (reward, calls) == (0.25, [([(12.5, 1.25)], [6])])


def test_envs_by_name_and_a_clear_error_for_an_unknown_one() -> None:
    assert set(BUILT_INS) <= set(agent_env_names())
    assert make_agent_env("CalcTool-v0") is not make_agent_env("CalcTool-v0")
    with pytest.raises(ValueError, match=r"unknown agent env 'Chess-v0'; allowed: .*Arithmetic-v0, CalcTool-v0, "
                                         r"LookupCalc-v0, PendulumGains-v0.*\(env_module / --env-module\)"):
        validate_agent_env_name("Chess-v0")
    with pytest.raises(ValueError, match="already registered"):
        register_agent_env(CalcTool, "Arithmetic-v0")
    register_agent_env(Arithmetic, "Arithmetic-v0")  # the same registration again changes nothing


def test_a_users_env_is_found_by_name_after_importing_its_module() -> None:
    import_env_module("tests.envs.agent_env_example")
    env = make_agent_env("Echo-v0")
    seed = env.problem_seeds("heldout", 1)[0]
    assert play(env, seed, env.demonstration(seed))[1] == 1.0
