"""The torch generator: a sample is a pure function of its counters whatever shared its batch or slot (continuous
batching), the sampled distribution is temperature, then top-k, then top-p, and bad requests are refused. What every
backend must do is tests/core/test_generator_contract.py."""
from __future__ import annotations

import pytest
import torch

from rl_core.generation.base import (
    Generation,
    GenerationRequest,
    SamplingParams,
)
from rl_core.generation.sampling import sampling_logprobs
from rl_core.generation.torch_generator import TorchGenerator, inverse_cdf_sample
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec

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


def test_a_sample_does_not_depend_on_its_batch(generator: TorchGenerator) -> None:
    other_prompt = (TOKENIZER.bos_id, *TOKENIZER.encode("7-5="))
    group = generator.generate(requests(TRUNCATED, range(4)) + requests(TRUNCATED, [0], other_prompt, 1), 0)
    alone = generator.generate(requests(TRUNCATED, [2]), 0)[0]
    assert group[2].completion == alone.completion
    assert group[2].logprobs == alone.logprobs  # rows multiply alike in any batch (oneDNN, fixed-order attention)
    assert group[4].prompt == other_prompt and group[0].prompt == PROMPT


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


def _mixed_requests() -> list[GenerationRequest]:
    """Groups of one prompt, other prompts, other lengths and stops: slots free and refill at different steps."""
    other = (TOKENIZER.bos_id, *TOKENIZER.encode("7-5="))
    short = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_tokens=5)
    stopping = SamplingParams(max_tokens=20, stop=[list(TOKENIZER.encode("1")), list(TOKENIZER.encode("="))])
    return (requests(TRUNCATED, range(5)) + requests(short, range(3), other, 1)
            + requests(stopping, range(6), PROMPT, 2) + requests(PLAIN, range(4), other, 3))


def test_continuous_batching_gives_each_request_what_it_gets_alone() -> None:
    """With 3 slots for 18 requests, finished sequences free slots that waiting ones take (and the tail compacts):
    every request's tokens and log-probs are those it gets alone, to the bit."""
    model = LlamaLM(SPEC, seed=11)
    mixed = _mixed_requests()
    together = TorchGenerator(model, max_batch=3).generate(mixed, 0)
    alone = [TorchGenerator(model, max_batch=1).generate([r], 0)[0] for r in mixed]
    assert [g.completion for g in together] == [g.completion for g in alone]
    assert [g.finish_reason for g in together] == [g.finish_reason for g in alone]
    assert {g.finish_reason for g in together} == {"stop", "length"}
    assert [g.logprobs for g in together] == [g.logprobs for g in alone]
    wide = TorchGenerator(model, max_batch=64).generate(mixed, 0)
    assert [g.completion for g in wide] == [g.completion for g in together]


def test_inverse_cdf_never_draws_a_token_outside_the_sampled_set() -> None:
    logprobs = torch.tensor([[0.0, float("-inf"), float("-inf")], [float("-inf"), -0.6931, -0.6931]])
    for u in (0.0, 0.25, 0.5, 0.75, 0.999999):
        tokens = inverse_cdf_sample(logprobs, torch.full((2,), u, dtype=torch.float64))
        assert tokens[0] == 0 and tokens[1] in (1, 2)
    assert inverse_cdf_sample(logprobs[1:], torch.tensor([0.49], dtype=torch.float64)).item() == 1
    assert inverse_cdf_sample(logprobs[1:], torch.tensor([0.51], dtype=torch.float64)).item() == 2


@pytest.mark.parametrize("vocab,scale", [(30, 5.0), (1000, 15.0), (49152, 1.5)])
def test_the_nucleus_of_the_most_likely_tokens_is_the_full_sorts(vocab: int, scale: float) -> None:
    """Sorting only the most likely tokens (as many as reach top_p) keeps exactly the tokens a full sort keeps."""
    from rl_core.generation.sampling import outside_nucleus

    probs = (torch.randn(8, vocab, generator=torch.Generator().manual_seed(vocab)) * scale).softmax(-1)
    for top_p in (0.1, 0.5, 0.9, 0.999):
        ordered, order = probs.sort(dim=-1, descending=True, stable=True)
        removed = (ordered.cumsum(-1) - ordered) >= top_p
        assert torch.equal(outside_nucleus(probs, top_p), torch.empty_like(removed).scatter_(-1, order, removed))
