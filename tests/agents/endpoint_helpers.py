"""What the OpenAI endpoint's tests share: a backend over a real TorchGenerator (sessions mapped to seed counters),
tiny models for gymflow's char tokenizer and for SmolLM2's tokenizer, and a served app per test module."""
from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rl_core.generation.base import Generation, GenerationRequest, SamplingParams
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.hf_tokenizer import HFTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.runtime.agent.chat_rendering import ChatFormat
from rl_core.runtime.agent.openai_endpoint import EndpointServer, SessionEnded, openai_app
from rl_core.runtime.agent.openai_request import SamplingPolicy
from rl_core.runtime.loopback_server import new_token
from tests.smollm2 import smollm2_gguf

MODEL = "gymflow-tiny"
CHARS = CharTokenizer("0123456789+-=*/?.,:; abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ<>\n")
CHAR_CONTEXT = 96
RUN_SEED = 7


def char_generator() -> TorchGenerator:
    """A tiny random Llama over `CHARS`."""
    spec = LlamaSpec(vocab_size=CHARS.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CHAR_CONTEXT,
                     initializer_range=0.2)
    return TorchGenerator(LlamaLM(spec, seed=11))


@functools.cache
def smollm2_tokenizer() -> HFTokenizer:
    """SmolLM2-135M-Instruct's tokenizer and chat template, read from its GGUF file once per test process (seconds)."""
    import transformers

    gguf = Path(smollm2_gguf())
    transformers.utils.logging.disable_progress_bar()
    return HFTokenizer(transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))


def smollm2_sized_generator(context: int) -> TorchGenerator:
    """A tiny random Llama with SmolLM2's vocabulary: real sampling over the real token ids, in milliseconds."""
    tokenizer = smollm2_tokenizer()
    spec = LlamaSpec(vocab_size=tokenizer.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=context,
                     initializer_range=0.2)
    return TorchGenerator(LlamaLM(spec, seed=3))


class GeneratorBackend:
    """The endpoint's backend over a real TorchGenerator: each open session has an index, and a request's seed
    counters are (run seed, session index, request key, sample), so a replayed request redraws the same tokens."""

    def __init__(self, generator: TorchGenerator) -> None:
        self.generator = generator
        self.sessions: dict[str, int] = {}
        self.ended: set[str] = set()
        self.calls: list[tuple[str, list[int], SamplingParams, int, str]] = []
        self.generations: list[list[Generation]] = []
        self._lock = threading.Lock()  # one generate at a time: requests from concurrent clients queue

    def open(self, session: str) -> None:
        self.sessions[session] = len(self.sessions)

    def close(self, session: str) -> None:
        self.sessions.pop(session, None)

    def knows(self, session: str) -> bool:
        return session in self.sessions

    async def complete(self, session: str, prompt_ids: list[int], params: SamplingParams, n: int,
                       request_key: str) -> list[Generation]:
        if session in self.ended:
            raise SessionEnded(f"test ended session {session!r}")
        self.calls.append((session, prompt_ids, params, n, request_key))
        counters = (RUN_SEED, self.sessions[session], int(request_key[:12], 16))
        requests = [GenerationRequest(tuple(prompt_ids), params, (*counters, sample)) for sample in range(n)]
        return await asyncio.to_thread(self._generate, requests)

    def _generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        with self._lock:
            generations = self.generator.generate(requests, self.generator.version)
            self.generations.append(generations)
            return generations


@contextmanager
def served(backend: GeneratorBackend, chat: ChatFormat, policy: SamplingPolicy, context: int
           ) -> Iterator[tuple[EndpointServer, str]]:
    """The app on 127.0.0.1 and a free port, and its token; stopped on exit."""
    token = new_token()
    app = openai_app(backend, model_name=MODEL, token=token, policy=policy, chat=chat, context=context)
    with EndpointServer(app) as server:
        yield server, token
