"""The torch generator samples from the distribution it reports: a sample is a pure function of its counters
(whatever shared its batch), and its behaviour log-probs are what a full forward through `sampling_logprobs` gives."""
from __future__ import annotations

import math

import pytest
import torch

from rl_core.generation.base import (
    Generation,
    GenerationRequest,
    Generator,
    SamplingParams,
    VersionMismatchError,
)
from rl_core.generation.sampling import sampling_logprobs
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.llama import LlamaLM, LlamaSpec

TOKENIZER = CharTokenizer("0123456789+-=")
SPEC = LlamaSpec(vocab_size=TOKENIZER.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                 initializer_range=0.2)  # peaked enough that top-k and top-p both cut
PROMPT = (TOKENIZER.bos_id, *TOKENIZER.encode("12+34="))
TRUNCATED = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_tokens=24)
PLAIN = SamplingParams(temperature=1.0, max_tokens=24)


@pytest.fixture(scope="module")
def generator() -> TorchGenerator:
    return TorchGenerator(LlamaLM(SPEC, seed=11))


def requests(params: SamplingParams, samples: range | list[int], prompt: tuple[int, ...] = PROMPT,
             prompt_index: int = 0) -> list[GenerationRequest]:
    return [GenerationRequest(prompt, params, (5, 1, prompt_index, s)) for s in samples]


def recomputed_logprobs(model: LlamaLM, generation: Generation, params: SamplingParams) -> torch.Tensor:
    """(completion, vocab) sampled-distribution log-probs from one full forward of prompt + completion."""
    ids = torch.tensor([generation.prompt + generation.completion])
    with torch.no_grad():
        logits, _ = model(ids)
    return sampling_logprobs(logits[0, len(generation.prompt) - 1:-1], params)


def test_is_a_generator(generator: TorchGenerator) -> None:
    assert isinstance(generator, Generator)


def test_a_sample_does_not_depend_on_its_batch(generator: TorchGenerator) -> None:
    other_prompt = (TOKENIZER.bos_id, *TOKENIZER.encode("7-5="))
    group = generator.generate(requests(TRUNCATED, range(4)) + requests(TRUNCATED, [0], other_prompt, 1), 0)
    alone = generator.generate(requests(TRUNCATED, [2]), 0)[0]
    assert group[2].completion == alone.completion
    assert group[2].logprobs == pytest.approx(alone.logprobs, abs=1e-5)  # batched matmuls round differently
    assert group[4].prompt == other_prompt and group[0].prompt == PROMPT


def test_different_counters_give_different_samples(generator: TorchGenerator) -> None:
    completions = {g.completion for g in generator.generate(requests(PLAIN, range(4)), 0)}
    assert len(completions) == 4


@pytest.mark.parametrize("params", [TRUNCATED, PLAIN], ids=["T0.7-p0.9-k5", "T1"])
def test_behaviour_logprobs_equal_a_full_forward_through_sampling_logprobs(generator: TorchGenerator,
                                                                           params: SamplingParams) -> None:
    worst = 0.0
    for generation in generator.generate(requests(params, range(4)), 0):
        recomputed = recomputed_logprobs(generator.model, generation, params)
        chosen = recomputed.gather(-1, torch.tensor(generation.completion)[:, None]).squeeze(-1)
        worst = max(worst, (chosen - torch.tensor(generation.logprobs)).abs().max().item())
    assert worst <= 1e-5, f"behaviour log-probs differ from the recomputed ones by {worst}"


def test_sampled_tokens_lie_inside_the_top_k_top_p_set(generator: TorchGenerator) -> None:
    for generation in generator.generate(requests(TRUNCATED, range(8)), 0):
        recomputed = recomputed_logprobs(generator.model, generation, TRUNCATED)
        assert (torch.isfinite(recomputed).sum(-1) <= TRUNCATED.top_k).all()
        assert all(math.isfinite(recomputed[t, token]) for t, token in enumerate(generation.completion))


def test_sampling_logprobs_is_temperature_then_top_k_then_top_p() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    scaled = (logits / 0.5).log_softmax(-1)
    torch.testing.assert_close(sampling_logprobs(logits, SamplingParams(temperature=0.5)), scaled)
    top2 = sampling_logprobs(logits, SamplingParams(top_k=2))
    torch.testing.assert_close(top2[0, :2].exp(), logits[0, :2].softmax(-1))
    assert torch.isinf(top2[0, 2:]).all()
    # softmax of [4, 3, 2, 1, 0] is [0.636, 0.234, 0.086, 0.032, 0.012]: 0.8 needs the first two tokens
    assert torch.isfinite(sampling_logprobs(logits, SamplingParams(top_p=0.8))).sum() == 2
    assert torch.isfinite(sampling_logprobs(logits, SamplingParams(top_p=0.5))).sum() == 1


def test_stop_sequences_end_a_sample_and_max_tokens_gives_length(generator: TorchGenerator) -> None:
    unstopped = generator.generate(requests(PLAIN, [3]), 0)[0]
    assert unstopped.finish_reason == "length" and len(unstopped.completion) == PLAIN.max_tokens
    pair = unstopped.completion[:2]
    stopped = generator.generate(requests(SamplingParams(max_tokens=24, stop=[[99], list(pair)]), [3]), 0)[0]
    assert stopped.completion == pair and stopped.finish_reason == "stop"
    assert stopped.logprobs == pytest.approx(unstopped.logprobs[:2], abs=1e-6)
    short = generator.generate(requests(SamplingParams(max_tokens=3), [3]), 0)[0]
    assert short.completion == unstopped.completion[:3] and short.finish_reason == "length"
    assert len(short.logprobs) == 3


def test_update_weights_changes_the_output_and_the_version() -> None:
    generator = TorchGenerator(LlamaLM(SPEC, seed=11))
    before = generator.generate(requests(PLAIN, range(2)), 0)
    state = {name: tensor.numpy() for name, tensor in LlamaLM(SPEC, seed=12).hf_state_dict().items()}
    generator.update_weights(state, 1)
    assert generator.version == 1
    after = generator.generate(requests(PLAIN, range(2)), 1)
    assert all(g.version == 1 for g in after) and all(g.version == 0 for g in before)
    assert [g.logprobs for g in after] != [g.logprobs for g in before]
    with pytest.raises(VersionMismatchError, match="asked for policy version 0.*holds version 1"):
        generator.generate(requests(PLAIN, [0]), 0)
    with pytest.raises(ValueError, match="missing"):
        generator.update_weights({"lm_head.weight": state["lm_head.weight"]}, 2)
    assert generator.version == 1


@pytest.mark.parametrize("field,value", [("temperature", 0.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
                                         ("max_tokens", 0), ("stop", [[]])])
def test_invalid_sampling_values_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})


def test_a_prompt_longer_than_the_context_is_refused(generator: TorchGenerator) -> None:
    too_long = GenerationRequest((1,) * 50, SamplingParams(max_tokens=1), (0,))
    with pytest.raises(ValueError, match="prompt of 50 tokens plus max_tokens 1 is 51 positions, over the model's "
                                         "context of 48"):
        generator.generate([too_long], 0)
    with pytest.raises(ValueError, match="lower max_tokens to at most 41"):
        generator.generate(requests(SamplingParams(max_tokens=42), [0]), 0)
