"""Sampling completions from a language-model policy: the interface (`base`), the sampled distribution
(`sampling`), and the in-process torch backend (`torch_generator`)."""
from rl_core.generation.base import (
    Generation,
    GenerationRequest,
    Generator,
    SamplingParams,
    VersionMismatchError,
)
from rl_core.generation.sampling import sampling_logprobs

__all__ = ["Generation", "GenerationRequest", "Generator", "SamplingParams", "VersionMismatchError",
           "sampling_logprobs"]
