"""Reasoning-gym datasets as agent envs (`rg:<dataset>`): the same problem for a seed in every process, disjoint
splits by question text, the dataset's own score as the reward, and a clear error for every name that cannot run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rl_core.algos.preflight import preflight
from rl_core.config.common import ConfigError
from rl_core.config.presets import build_agent_config
from rl_core.envs.agent import make_agent_env, register_agent_env, uses_simulator, validate_agent_env_name
from rl_core.envs.agent.reasoning_gym_task import ALPHABET, MISSING_EXTRA, ReasoningGymTask
from tests.smollm2 import smollm2_gguf

pytest.importorskip("reasoning_gym", reason="the tasks extra (reasoning-gym) is not installed")

SMALL_SUMS = "rg:chain_sum?max_terms=3&max_digits=2"


def answer_once(env: ReasoningGymTask, seed: int, action: str) -> tuple[float, dict]:
    """The reward and info of answering problem `seed` with `action`."""
    env.reset(seed)
    _, reward, done, info = env.step(action)
    assert done
    return reward, info


@pytest.mark.parametrize("name", ["rg:basic_arithmetic", "rg:chain_sum", "rg:countdown", "rg:gsm_symbolic"])
def test_each_dataset_resets_steps_and_scores_with_its_own_scorer(name: str) -> None:
    env = make_agent_env(name)
    for seed in env.problem_seeds("train", 3) + env.problem_seeds("heldout", 3):
        prompt = env.reset(seed)
        assert prompt.endswith("\nReply with only the final answer, on one line.")
        (demonstration,) = env.demonstration(seed)
        assert demonstration.endswith("\n") and "\n" not in demonstration[:-1]
        assert answer_once(env, seed, demonstration)[0] == 1.0
        reward, info = answer_once(env, seed, "no idea\n")
        assert reward < 1.0 and not info["correct"]


def test_a_seed_is_the_same_problem_in_another_process() -> None:
    """Problems are a function of the seed, not of the process (nor of its PYTHONHASHSEED)."""
    env = make_agent_env(SMALL_SUMS)
    seeds = env.problem_seeds("train", 5) + env.problem_seeds("heldout", 5)
    here = [env.reset(s) for s in seeds]
    assert here == [make_agent_env(SMALL_SUMS).reset(s) for s in seeds]
    script = ("import sys; from rl_core.envs.agent import make_agent_env; env = make_agent_env(sys.argv[1]); "
              "print(repr([env.reset(int(s)) for s in sys.argv[2:]]))")
    there = subprocess.run([sys.executable, "-c", script, SMALL_SUMS, *map(str, seeds)], check=True,
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert there.stdout.strip() == repr(here)


@pytest.mark.parametrize("name", ["rg:basic_arithmetic", "rg:chain_sum?max_terms=2&max_digits=1&size=300"])
def test_train_and_heldout_never_share_a_question(name: str) -> None:
    """Also over a pool of 300 problems, where seeds of one split draw the same question again and again."""
    env = make_agent_env(name)
    train = {env.reset(s) for s in env.problem_seeds("train", 300)}
    heldout = {env.reset(s) for s in env.problem_seeds("heldout", 300)}
    assert len(heldout) > 10 and not train & heldout


def test_the_answer_is_the_stripped_text_before_the_first_newline() -> None:
    env = make_agent_env("rg:basic_arithmetic")
    seed = env.problem_seeds("train", 1)[0]
    answer = env.demonstration(seed)[0].rstrip("\n")
    for action in (answer, f"{answer}\n", f"  {answer} \nbecause I computed it", f"{answer}\n\n7"):
        reward, info = answer_once(env, seed, action)
        assert (reward, info["correct"], info["expected"]) == (1.0, True, answer), action
    assert answer_once(env, seed, f"{int(answer) + 1}")[0] == 0.0
    reward, info = answer_once(env, seed, f"{answer}1")  # basic_arithmetic's own score: credit for containing it
    assert 0.0 < reward < 1.0 and not info["correct"]
    assert answer_once(env, seed, f"\n{answer}")[0] == 0.0  # an empty first line is an empty answer
    with pytest.raises(RuntimeError, match="no episode is running"):  # the episode above has ended
        env.step(answer)
    assert set(env.reset(seed) + env.demonstration(seed)[0]) <= set(ALPHABET)


def test_a_scorer_that_fails_on_the_text_scores_zero_and_says_why() -> None:
    env = make_agent_env("rg:prime_factorization")  # its score_answer parses every factor with int()
    reward, info = answer_once(env, env.problem_seeds("train", 1)[0], "seven\n")
    assert (reward, info["correct"]) == (0.0, False)
    assert info["error"].startswith("score_answer failed on 'seven': ValueError")


@pytest.mark.parametrize("name, message", [
    ("rg:nope", "unknown reasoning-gym dataset 'nope' in 'rg:nope'; some names: ab, acre"),
    ("rg:chain_summ", "unknown reasoning-gym dataset 'chain_summ' in 'rg:chain_summ'; close names: chain_sum"),
    ("rg:", "'rg:' names no dataset"),
    ("rg:composite", "'rg:composite': reasoning-gym dataset 'composite' is not supported: it mixes other datasets"),
    ("rg:ransom_note", "its problems depend on PYTHONHASHSEED"),
    ("rg:chain_sum?max_terms", "option 'max_terms' is not key=value"),
    ("rg:chain_sum?max_terms=2&max_terms=3", "option 'max_terms' is given twice"),
    ("rg:chain_sum?terms=3", "dataset 'chain_sum' has no option 'terms'; its options: min_terms, max_terms"),
    ("rg:chain_sum?max_terms=x", "option 'max_terms' takes an integer, got 'x'"),
    ("rg:chain_sum?allow_negation=maybe", "option 'allow_negation' takes true or false, got 'maybe'"),
    ("rg:basic_arithmetic?format_style=fancy", "option 'format_style' takes one of simple, natural, got 'fancy'"),
    ("rg:chain_sum?seed=3", "the env seeds every problem itself; drop the option 'seed'"),
    ("rg:chain_sum?min_terms=4&max_terms=3", "reasoning-gym refuses these options: max_terms must be >= min_terms"),
    ("Chess-v0", "PendulumGains-v0, or rg:<dataset> for a reasoning-gym dataset"),
])
def test_a_name_that_cannot_run_says_why(name: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        validate_agent_env_name(name)
    assert message in str(err.value)


def test_options_set_the_datasets_config() -> None:
    env = make_agent_env("rg:basic_arithmetic?operators=+,-&allow_parentheses=false&allow_negation=false"
                         "&max_terms=2&max_digits=1&format_style=natural")
    questions = [env.reset(s) for s in env.problem_seeds("train", 30)]
    assert not any(char in q for q in questions for char in "*/()")
    assert not any(q.startswith("Calculate") for q in questions)  # natural style: "What is 3 + 4?" and others


def test_rg_names_are_plain_envs_and_reserved() -> None:
    assert not uses_simulator("rg:chain_sum")
    with pytest.raises(ValueError, match="agent env 'rg:chain_sum' does not simulate, so it takes no evaluator"):
        make_agent_env("rg:chain_sum", evaluator=lambda plans, seeds: [0.0] * len(plans))
    with pytest.raises(ValueError, match="names starting with 'rg:' select reasoning-gym datasets"):
        register_agent_env(ReasoningGymTask, "rg:mine")


def test_without_the_tasks_extra_an_rg_name_says_what_to_install(monkeypatch) -> None:
    make_agent_env("rg:chain_sum")  # cached in this process: the check must not skip the import
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` now raises ImportError
    for call in (validate_agent_env_name, make_agent_env, uses_simulator):
        with pytest.raises(ImportError) as err:
            call("rg:chain_sum")
        assert str(err.value) == MISSING_EXTRA == "rg: envs need reasoning-gym: pip install -e '.[tasks]'"


def test_the_preflight_refuses_answers_the_tokenizer_cannot_write(tmp_path) -> None:
    """A built model writes printable ASCII (the rg alphabet): prime_factorization answers with '×'."""
    with pytest.raises(ConfigError) as err:
        preflight(build_agent_config("tiny", env="rg:prime_factorization", run_name=f"rg-{tmp_path.name}"))
    assert "env.name (--env): Value error, the run's tokenizer cannot write '" in str(err.value)
    assert "×" in str(err.value) and "the answer of rg:prime_factorization train problem" in str(err.value)
    assert "(got 'rg:prime_factorization')" in str(err.value)

    with pytest.raises(ConfigError) as err:  # a dataset that only verifies answers has none to write
        preflight(build_agent_config("tiny", env="rg:rush_hour", run_name=f"rg-{tmp_path.name}"))
    assert "env.name (--env): Value error, rg:rush_hour: the dataset gives no reference answer" in str(err.value)

    with pytest.raises(ConfigError) as err:  # an action ends at a newline: multi-line answers cannot be given
        preflight(build_agent_config("tiny", env="rg:mini_sudoku", run_name=f"rg-{tmp_path.name}"))
    assert "env.name (--env): Value error, rg:mini_sudoku: the answer of problem 0 spans lines" in str(err.value)


@pytest.mark.slow
def test_smollm2_writes_answers_a_built_model_cannot() -> None:
    """The same env runs with SmolLM2, whose byte-level tokenizer writes propositional logic's '∧' and '→'."""
    name = "rg:propositional_logic"
    cfg = build_agent_config("tiny", env=name, model_path=smollm2_gguf(), sft_steps=0, run_name="rg-smollm2")
    assert preflight(cfg) is cfg
    with pytest.raises(ConfigError, match="the run's tokenizer cannot write"):
        preflight(build_agent_config("tiny", env=name, sft_steps=0, run_name="rg-built"))
