"""LoRA adapters on the Llama policy: only the adapters train, travel and are stored; the generator and the trainer
compute the same bits through them; the merged weight is what a reader without adapters (transformers) multiplies by;
bad ranks and targets are refused naming the flag."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_core.algos.base import UpdateHooks
from rl_core.algos.grpo.episodes import sampling_params
from rl_core.algos.grpo.learner import GRPOLearner, score
from rl_core.algos.grpo.phases import rollout_chunk
from rl_core.algos.grpo.update import ScoredTokens, logprob_parity
from rl_core.algos.preflight import preflight
from rl_core.config.common import ConfigError
from rl_core.config.presets import build_agent_config
from rl_core.envs.agent import make_agent_env
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.policies.lm_policy import LMPolicy, build_language_model
from rl_core.policies.lora import LoRALinear


def _cfg(**overrides):
    values = {"env": "Arithmetic-v0", "temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_tokens": 12,
              "lora_rank": 4, **overrides}
    return build_agent_config("tiny", run_name="lora", **values)


def _confident(model) -> None:
    """A peaked random model (top-k and top-p cut) whose adapters already change its function."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim > 1 and "lora_" not in name:
                param.mul_(10)
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=generator)


def test_only_the_adapters_train_and_only_they_are_the_policy_state() -> None:
    model, tokenizer = build_language_model(_cfg())
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 7 * model.spec.num_hidden_layers
    state = LMPolicy(model, tokenizer).state()
    assert set(state) == {f"model.{n}" for n in trained}
    # a new adapter changes nothing: B starts at zero, so the merged weights are the base's
    base, _ = build_language_model(_cfg(lora_rank=None))
    merged = model.hf_state_dict()
    assert all(torch.equal(merged[name], value) for name, value in base.hf_state_dict().items())


@pytest.mark.parametrize("sampling", [{"top_p": 1.0, "top_k": 0}, {"top_k": 0}, {"top_p": 1.0}],
                         ids=["temperature", "top-p", "top-k"])
def test_generator_and_trainer_compute_the_same_bits_through_the_adapters(sampling: dict) -> None:
    cfg = _cfg(**sampling)
    model, tokenizer = build_language_model(cfg)
    _confident(model)
    generator = TorchGenerator(model, version=0)
    make_env = lambda: make_agent_env(cfg.env.name)
    arrays, meta = rollout_chunk(cfg, make_env, tokenizer, lambda r: generator.generate(r, 0), 64, 0, 0, 0)
    batch = ScoredTokens.from_arrays(score(cfg, [arrays], [meta]))
    parity = logprob_parity(model, batch, torch.arange(len(batch.tokens)), sampling_params(cfg), UpdateHooks())
    assert batch.loss_mask.sum() > 30 and parity["logprob_parity_max"] == 0, parity


def test_an_update_moves_the_adapters_and_leaves_the_base_alone() -> None:
    cfg = _cfg(group_size=4, prompts_per_iteration=2)
    learner = GRPOLearner(cfg)
    _confident(learner.policy.model)
    base = {n: p.detach().clone() for n, p in learner.policy.model.named_parameters() if not p.requires_grad}
    before = learner.policy_state()
    generator = TorchGenerator(learner.policy.model, version=0)
    make_env = lambda: make_agent_env(cfg.env.name)
    arrays, meta = rollout_chunk(cfg, make_env, learner.policy.tokenizer, lambda r: generator.generate(r, 0), 64,
                                 0, 0, 0)
    arrays["rewards"] = np.arange(len(arrays["rewards"]), dtype=np.float32) % 2  # every group has an advantage
    learner.update(score(cfg, [arrays], [meta]), 0)
    after = learner.policy_state()
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    assert all(torch.equal(p, base[n]) for n, p in learner.policy.model.named_parameters() if not p.requires_grad)
    state = learner.state()
    assert {k for k in state if k.startswith("optim.")} and not [k for k in state if k.startswith("model.") and
                                                                  ".lora_" not in k]
    restored = GRPOLearner(cfg)
    restored.load_state(state)
    assert all(np.array_equal(v, restored.state()[k]) for k, v in state.items())


def test_the_merged_weights_are_what_the_model_computes_with() -> None:
    """An export (transformers, vLLM) loads the merged weights: a plain model holding them computes the same bits."""
    model, _ = build_language_model(_cfg())
    _confident(model)
    plain, _ = build_language_model(_cfg(lora_rank=None))
    plain.load_hf_state(model.hf_state_dict())
    ids = torch.tensor([[1, 5, 7, 3, 9, 4]])
    with torch.no_grad():
        assert torch.equal(model(ids)[0], plain(ids)[0])


def test_the_adapters_gradients_are_those_of_the_merged_product() -> None:
    """The backward computes LoRA's own gradients (never the full weight's); they equal autograd's through
    x (W + s B A)^T."""
    model, _ = build_language_model(_cfg())
    _confident(model)
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, 5, layer.in_features, generator=torch.Generator().manual_seed(0), requires_grad=True)
    grads = torch.autograd.grad(layer(x).square().sum(), (x, layer.lora_A.weight, layer.lora_B.weight))
    a, b = (layer.lora_A.weight.detach().requires_grad_(), layer.lora_B.weight.detach().requires_grad_())
    expected = torch.autograd.grad((x @ (layer.weight + layer.scale * b @ a).t()).square().sum(), (x, a, b))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"lora_targets": "q_proj,qproj"}, "model.lora_targets (--lora-targets): Value error, qproj names no projection"),
    ({"lora_rank": 999}, "model.lora_rank (--lora-rank): Value error, rank 999 exceeds the width of"),
    ({"lora_rank": 0}, "model.lora_rank (--lora-rank): Input should be greater than or equal to 1"),
    ({"lora_targets": "q_proj,,v_proj"}, "model.lora_targets (--lora-targets): Value error, expected comma-separated"),
])
def test_bad_lora_settings_are_refused_naming_the_flag(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        preflight(_cfg(**overrides))
    assert message in " ".join(str(caught.value).split())


@pytest.fixture(scope="module", params=["full", "lora"])
def smollm2(request):
    """SmolLM2-135M-Instruct as the flow's generator and trainer hold it: full fine-tuning, or LoRA adapters already
    moved off zero (so they take part in every product)."""
    from tests.smollm2 import smollm2_gguf

    lora = {"lora_rank": 8} if request.param == "lora" else {}
    cfg = build_agent_config("tiny", run_name="smol", model_path=smollm2_gguf(), env="Arithmetic-v0", sft_steps=0,
                             max_tokens=6, prompts_per_iteration=4, group_size=2, **lora)
    model, tokenizer = build_language_model(cfg)
    if lora:
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.02, generator=generator)
    return cfg, model, tokenizer


@pytest.mark.parametrize(("sampling", "groups_per_write"), [
    ({"temperature": 0.7}, 4), ({"temperature": 0.7}, 2), ({"temperature": 0.7}, 1),
    ({"temperature": 1.0, "top_p": 0.8}, 4), ({"temperature": 1.0, "top_k": 20}, 4),
], ids=["temperature-4", "temperature-2", "temperature-1", "top-p", "top-k"])
def test_smollm2_behaviour_logprobs_are_recomputed_exactly(smollm2, sampling: dict, groups_per_write: int) -> None:
    """Parity 0.0 on SmolLM2 in every sampling mode and rollout chunking, full fine-tune and LoRA: the trainer's
    log-probs of the sampled tokens equal the generator's to the bit."""
    base, model, tokenizer = smollm2
    sampling = {"top_p": 1.0, "top_k": 0, **sampling}
    cfg = base.model_copy(update={"sampling": base.sampling.model_copy(update=sampling),
                                  "rollout_groups_per_write": groups_per_write})
    generator = TorchGenerator(model, version=0)
    make_env = lambda: make_agent_env(cfg.env.name)
    context = model.spec.max_position_embeddings
    chunks = [rollout_chunk(cfg, make_env, tokenizer, lambda r: generator.generate(r, 0), context, 0, 0, chunk)
              for chunk in range(4 // groups_per_write)]
    batch = ScoredTokens.from_arrays(score(cfg, [c for c, _ in chunks], [m for _, m in chunks]))
    parity = logprob_parity(model, batch, torch.arange(len(batch.tokens)), sampling_params(cfg), UpdateHooks())
    assert batch.loss_mask.sum() >= 8 and parity["logprob_parity_max"] == 0.0, parity
