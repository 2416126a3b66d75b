"""An agent run's configuration: presets and flags derived from the model, and every bad input refused at start,
naming the field or the cause, before anything is written."""
from __future__ import annotations

import json

import pytest

from flows.tooling.cli import main
from rl_core.algos.preflight import preflight
from rl_core.config.agent import AgentRunConfig, parse_run_config
from rl_core.config.common import ConfigError
from rl_core.config.control import ControlRunConfig
from rl_core.config.launch_options import agent_launch_options
from rl_core.config.presets import build_agent_config
from rl_core.data.run_info import open_run
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.pretrained import save_pretrained


def test_presets_build_and_round_trip_as_actors_receive_them() -> None:
    cfg = build_agent_config("tiny", seed=3, temperature=0.7, scale_std=False)
    assert cfg.run_name == "CalcTool-v0-tiny-s3" and cfg.sampling.temperature == 0.7 and not cfg.algorithm.scale_std
    assert parse_run_config(cfg.model_dump_json()) == cfg
    assert isinstance(parse_run_config(build_agent_config("quick").model_dump()), AgentRunConfig)
    assert isinstance(parse_run_config({"run_name": "c", "iterations": 1}), ControlRunConfig)


def test_every_scalar_field_is_a_launch_option() -> None:
    options = agent_launch_options()
    for name in ("env", "env_module", "model_path", "context", "temperature", "top_p", "top_k", "max_tokens",
                 "sft_steps", "sft_learning_rate", "learning_rate", "group_size", "beta", "scale_std", "token_level",
                 "store", "rollout_groups_per_write", "eval_problems"):
        assert name in options, name
    assert options["sft_learning_rate"].path == ("sft", "learning_rate")
    assert options["learning_rate"].path == ("algorithm", "learning_rate")


@pytest.mark.parametrize("options, named", [
    ({"env": "Nope-v0"}, "env.name (--env): Value error, unknown agent env 'Nope-v0'; allowed: Arithmetic-v0"),
    ({"temperature": 0.0}, "sampling.temperature (--temperature): Input should be greater than 0"),
    ({"top_p": 0.0}, "sampling.top_p (--top-p): Input should be greater than 0"),
    ({"top_p": 1.5}, "sampling.top_p (--top-p): Input should be less than or equal to 1"),
    ({"top_k": -1}, "sampling.top_k (--top-k): Input should be greater than or equal to 0"),
    ({"max_tokens": 0}, "sampling.max_tokens (--max-tokens): Input should be greater than or equal to 1"),
    ({"group_size": 1}, "algorithm.group_size (--group-size): Input should be greater than or equal to 2"),
    ({"context": 8}, "its prompt is 8 tokens (bos included), which leaves no room for a completion in the model's "
                     "context of 8 positions"),
    ({"num_ranks": 3}, "num_ranks 3 must divide the prompts of a minibatch (4)"),
    ({"model_path": "/nonexistent/model"}, "model.path (--model-path): Value error, /nonexistent/model is not a "
                                           "directory"),
])
def test_bad_values_are_refused_naming_the_field(options: dict, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        preflight(build_agent_config("tiny", **options))
    assert named in str(err.value)


def _save_model(directory, alphabet: str, vocab_size: int | None = None) -> None:
    tokenizer = CharTokenizer(alphabet)
    model = LlamaLM(LlamaSpec(vocab_size=tokenizer.vocab_size, hidden_size=16, intermediate_size=32,
                              num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64))
    save_pretrained(model, tokenizer, directory)
    if vocab_size is not None:  # a config that does not match its tokenizer
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "vocab_size": vocab_size}))


def test_model_directories_are_checked_at_start(tmp_path) -> None:
    from rl_core.envs.agent.arithmetic import ALPHABET

    good = tmp_path / "arithmetic-model"
    _save_model(good, ALPHABET)
    cfg = preflight(build_agent_config("tiny", env="Arithmetic-v0", model_path=str(good)))
    assert cfg.model.path == str(good)

    with pytest.raises(ConfigError, match="the model's tokenizer cannot write .* of CalcTool-v0's alphabet"):
        preflight(build_agent_config("tiny", env="CalcTool-v0", model_path=str(good)))

    mismatched = tmp_path / "mismatched"
    _save_model(mismatched, ALPHABET, vocab_size=99)
    with pytest.raises(ConfigError, match="tokenizer has 18 ids but its model's vocab_size is 99"):
        preflight(build_agent_config("tiny", env="Arithmetic-v0", model_path=str(mismatched)))

    not_llama = tmp_path / "not-llama"
    _save_model(not_llama, ALPHABET)
    config = json.loads((not_llama / "config.json").read_text())
    (not_llama / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"],
                                                       "model_type": "bert"}))
    with pytest.raises(ConfigError, match="not a Llama causal LM"):
        preflight(build_agent_config("tiny", env="Arithmetic-v0", model_path=str(not_llama)))

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        preflight(build_agent_config("tiny", model_path=str(empty)))


def test_a_config_is_data_and_the_preflight_runs_once_per_process(tmp_path, monkeypatch) -> None:
    """Parsing a config (as every actor does) asks nothing of the world; the preflight asks once per process."""
    cfg = build_agent_config("tiny", env="Nope-v0", model_path=str(tmp_path / "missing"))
    assert parse_run_config(cfg.model_dump_json()) == cfg  # no env registry, no model files consulted
    calls = []
    monkeypatch.setattr("rl_core.algos.grpo.checks._check_prompts_fit", calls.append)
    good = build_agent_config("tiny", run_name=f"once-{tmp_path.name}")  # a config no other test has checked
    assert preflight(good) is good and preflight(good) is good
    assert calls == [good]


def test_the_command_line_refuses_bad_input_before_writing_anything(tmp_path, capsys) -> None:
    store = tmp_path / "runs"
    assert main(["train-agent", "--preset", "tiny", "--env", "Nope-v0", "--store", f"file://{store}"]) == 2
    assert "unknown agent env 'Nope-v0'" in capsys.readouterr().err
    assert main(["train-agent", "--preset", "tiny", "--top-p", "2", "--store", f"file://{store}"]) == 2
    assert "sampling.top_p (--top-p)" in capsys.readouterr().err
    assert not store.exists()


def test_evaluating_an_agent_run_as_a_control_run_says_what_it_is(tmp_path) -> None:
    from rl_core.data.run_info import load_run_config

    open_run(build_agent_config("tiny", run_name="agent", store=f"file://{tmp_path}/runs"))
    with pytest.raises(ConfigError, match="run 'agent' under .* is an agent run"):
        load_run_config(f"file://{tmp_path}/runs", "agent")


def test_a_continued_run_must_sample_as_it_did(tmp_path) -> None:
    store = f"file://{tmp_path}/runs"
    first = open_run(build_agent_config("tiny", run_name="same", store=store))
    again = open_run(build_agent_config("tiny", run_name="same", store=store, iterations=5, eval_problems=3))
    assert again.incarnation == first.incarnation and not again.is_new
    with pytest.raises(ConfigError, match="sampling.temperature: was 1.0, now 0.5"):
        open_run(build_agent_config("tiny", run_name="same", store=store, temperature=0.5))
    with pytest.raises(ConfigError, match="flow: was 'agent', now None"):
        open_run(ControlRunConfig(run_name="same", iterations=1, storage={"url": store}))
