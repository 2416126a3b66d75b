"""The Llama policy is HF's LlamaForCausalLM: its saved directory loads in transformers with the same logits, round
trips bit-exactly, decodes with a KV cache as a full forward computes, and is drawn from its seed alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.kv_cache import KVCache
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.pretrained import load_pretrained, save_pretrained

TOKENIZER = CharTokenizer("0123456789+-=")


def tiny_spec(**overrides: object) -> LlamaSpec:
    return LlamaSpec(**{"vocab_size": TOKENIZER.vocab_size, "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64,
                        "rope_theta": 500.0, **overrides})


def random_ids(batch: int, steps: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TOKENIZER.vocab_size, (batch, steps), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tied,kv_heads", [(False, None), (True, 2)], ids=["untied-mha", "tied-gqa"])
def test_saved_model_loads_in_transformers_with_the_same_logits(tmp_path: Path, tied: bool, kv_heads: int) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed; it stays out of the dev extra because transformers 5 "
        "brings Hugging Face's `kernels` package, whose top-level name shadows this repository's kernels/")
    model = LlamaLM(tiny_spec(tie_word_embeddings=tied, num_key_value_heads=kv_heads, initializer_range=0.2), seed=1)
    save_pretrained(model, TOKENIZER, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["torch_dtype"] == "float32"
    # use_kernels=False: transformers 5 otherwise swaps layers for kernels fetched from the Hub.
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, use_kernels=False,
                                                                 output_loading_info=True)
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = random_ids(3, 24)
    with torch.no_grad():
        ours, theirs = model.eval()(ids)[0], hf.eval()(ids).logits
    assert ours.shape == (3, 24, TOKENIZER.vocab_size)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_load_pretrained_round_trip_is_bit_exact(tmp_path: Path) -> None:
    model = LlamaLM(tiny_spec(tie_word_embeddings=True, num_key_value_heads=1), seed=2)
    loaded, tokenizer = load_pretrained(save_pretrained(model, TOKENIZER, tmp_path))
    assert loaded.spec == model.spec and tokenizer == TOKENIZER
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert model.state_dict().keys() == loaded.state_dict().keys()
    assert all(torch.equal(a, loaded.state_dict()[name]) for name, a in model.state_dict().items())


@pytest.mark.parametrize("prefill", [1, 6])
def test_cached_decoding_equals_the_full_forward(prefill: int) -> None:
    model = LlamaLM(tiny_spec(num_key_value_heads=2, initializer_range=0.2), seed=3).eval()
    ids = random_ids(2, 20, seed=1)
    with torch.no_grad():
        full, _ = model(ids)
        cache = KVCache.allocate(model.spec, batch=2, capacity=20)
        steps, cache = model(ids[:, :prefill], cache)
        pieces = [steps]
        for t in range(prefill, 20):
            step, cache = model(ids[:, t:t + 1], cache)
            pieces.append(step)
    assert cache.length == 20
    assert torch.equal(torch.cat(pieces, dim=1), full)


def test_a_cache_too_small_or_a_context_overrun_is_refused() -> None:
    model = LlamaLM(tiny_spec(max_position_embeddings=8))
    with pytest.raises(ValueError, match="capacity >= 5"):
        model(random_ids(1, 5), KVCache.allocate(model.spec, batch=1, capacity=4))
    with pytest.raises(ValueError, match="batch=2"):
        model(random_ids(2, 3), KVCache.allocate(model.spec, batch=1, capacity=4))
    with pytest.raises(ValueError, match="context of 8"):
        model(random_ids(1, 9))


def test_load_pretrained_refuses_what_is_not_this_model(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_pretrained(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)
    directory = save_pretrained(LlamaLM(tiny_spec()), TOKENIZER, tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"],
                                                       "model_type": "bert"}))
    with pytest.raises(ValueError, match="not a Llama causal LM.*BertModel"):
        load_pretrained(directory)
    (directory / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="gelu"):
        load_pretrained(directory)
    (directory / "config.json").write_text(json.dumps(config))
    CharTokenizer("abc").save(directory / "char_tokenizer.json")
    with pytest.raises(ValueError, match=f"tokenizer has 6 ids but its model's vocab_size is {TOKENIZER.vocab_size}"):
        load_pretrained(directory)


def test_weights_of_another_shape_are_refused() -> None:
    model = LlamaLM(tiny_spec())
    other = LlamaLM(tiny_spec(hidden_size=16)).hf_state_dict()
    with pytest.raises(ValueError, match="wrong shapes: model.embed_tokens.weight"):
        model.load_hf_state(other)
    with pytest.raises(ValueError, match="tied embeddings"):
        LlamaLM(tiny_spec(tie_word_embeddings=True)).load_hf_state(model.hf_state_dict())


def test_seeded_init_is_reproducible_and_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    first, again, other = (LlamaLM(tiny_spec(), seed=seed).state_dict() for seed in (7, 7, 8))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(tensor, again[name]) for name, tensor in first.items())
    assert not torch.equal(first["model.layers.0.self_attn.q_proj.weight"],
                           other["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(first["model.norm.weight"], torch.ones(32))


def test_spec_refuses_heads_that_do_not_divide() -> None:
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        tiny_spec(hidden_size=30)
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        tiny_spec(num_key_value_heads=3)


def test_tokenizer_round_trips_and_assigns_ids_from_the_alphabet(tmp_path: Path) -> None:
    text = "12+34=46"
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text
    assert TOKENIZER.decode([TOKENIZER.bos_id, *TOKENIZER.encode(text), TOKENIZER.eos_id]) == text
    assert CharTokenizer("cab").encode("abc") == CharTokenizer("abcabc").encode("abc") == [3, 4, 5]
    TOKENIZER.save(tmp_path / "tok.json")
    assert CharTokenizer.load(tmp_path / "tok.json") == TOKENIZER


def test_tokenizer_refuses_a_character_outside_its_alphabet() -> None:
    with pytest.raises(ValueError, match=r"character 'x' at index 2 is not in the alphabet"):
        TOKENIZER.encode("12x")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOKENIZER.decode([TOKENIZER.vocab_size])
