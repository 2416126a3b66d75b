"""Agent rollouts keep the tokens that were sampled: ids never re-tokenized, the agent's tokens masked in and the
env's out, behaviour log-probs of the sampled distribution (the trainer recomputes them to the bit), a new segment
where appending would not be exact, and the same counters giving the same bits."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from rl_core.algos.grpo.episodes import EpisodeSpec, run_agent_episodes, sampling_params
from rl_core.algos.grpo.learner import score
from rl_core.algos.grpo.phases import rollout_chunk
from rl_core.algos.grpo.trajectories import PROMPT_TURN, TrajectoryBatch
from rl_core.algos.grpo.update import ScoredTokens, logprob_parity
from rl_core.config.presets import build_agent_config
from rl_core.envs.agent import make_agent_env
from rl_core.generation import Generation, GenerationRequest, SamplingParams
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.policies.char_tokenizer import CharTokenizer
from rl_core.policies.llama import LlamaLM
from rl_core.policies.lm_policy import build_language_model


class ScriptedGenerator:
    """Answers each request with the next scripted action of its episode (for the token-layout tests, where a
    tiny random model would never write a tool call). Log-prob of every token: -0.5."""

    def __init__(self, tokenizer: CharTokenizer, actions: dict[int, list[str]]) -> None:
        self.tokenizer, self.actions = tokenizer, actions

    def __call__(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            group, turn = request.seed_counters[-3], request.seed_counters[-1]
            ids = tuple(self.tokenizer.encode(self.actions[group][turn - 1]))
            out.append(Generation(request.prompt, ids, (-0.5,) * len(ids), "stop", 3))
        return out


class MergingTokenizer(CharTokenizer):
    """A tokenizer that writes "><" as one token, as BPE merges do: re-tokenizing "...</calc>" + "<out>..." then
    differs from the ids already held."""

    MERGED = "><"

    def __init__(self, alphabet: str) -> None:
        super().__init__(alphabet)
        self.merged_id = super().vocab_size

    @property
    def vocab_size(self) -> int:
        return self.merged_id + 1

    def encode(self, text: str) -> list[int]:
        parts = text.split(self.MERGED)
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i:
                ids.append(self.merged_id)
            ids.extend(super().encode(part))
        return ids

    def decode(self, ids) -> str:
        plain = super().decode
        return "".join(self.MERGED if int(i) == self.merged_id else plain([i]) for i in ids)


def _tool_episode(tokenizer: CharTokenizer) -> tuple:
    env = make_agent_env("CalcTool-v0")
    seed = env.problem_seeds("train", 1)[0]
    generate = ScriptedGenerator(tokenizer, {0: env.demonstration(seed)})
    episodes = run_agent_episodes([EpisodeSpec(0, 0, seed)], lambda: make_agent_env("CalcTool-v0"), tokenizer, generate,
                            SamplingParams(max_tokens=24), (0, 1, 0), context=96, version=3)
    return env, seed, episodes[0]


def test_a_tool_episode_keeps_every_id_with_the_agents_tokens_masked_in() -> None:
    tokenizer = CharTokenizer(make_agent_env("CalcTool-v0").alphabet)
    env, seed, episode = _tool_episode(tokenizer)
    (segment,) = episode.segments
    call, answer = env.demonstration(seed)
    prompt = env.reset(seed)
    output = f"<out>{product_of(prompt)}</out>"
    assert segment.tokens == [tokenizer.bos_id, *tokenizer.encode(prompt + call + output + answer)]
    kinds = {turn: "".join(tokenizer.decode([t]) for t, u in zip(segment.tokens, segment.turns) if u == turn)
             for turn in sorted(set(segment.turns))}
    assert kinds == {PROMPT_TURN: prompt, 1: call, 2: output, 3: answer}  # prompt, action, tool output, action
    mask = np.array(segment.loss_mask)
    assert mask.sum() == len(call) + len(answer)  # the tool's output is in the trajectory but not in the loss
    assert all(lp == -0.5 for lp, m in zip(segment.logprobs, mask) if m) and not any(
        lp for lp, m in zip(segment.logprobs, mask) if not m)
    assert episode.reward == 1.0 and episode.info["correct"] and episode.version == 3


def product_of(prompt: str) -> int:
    left, right = prompt.rstrip("=").split("*")
    return int(left) * int(right)


def test_an_observation_that_would_retokenize_the_prefix_starts_a_new_segment() -> None:
    tokenizer = MergingTokenizer(make_agent_env("CalcTool-v0").alphabet)
    env, seed, episode = _tool_episode(tokenizer)
    first, second = episode.segments
    call, answer = env.demonstration(seed)
    assert first.tokens[-len(call):] == tokenizer.encode(call) and sum(first.loss_mask) == len(call)
    # the new segment's prompt is the whole conversation re-tokenized (the "><" merged), then the answer as sampled
    assert second.tokens[:-len(answer)] == tokenizer.conversation_ids(episode.messages[:3])
    assert [role for role, _ in episode.messages] == ["user", "assistant", "user", "assistant"]
    assert tokenizer.merged_id in second.tokens and sum(second.loss_mask) == len(answer)
    batch = TrajectoryBatch.from_episodes([episode], tokenizer.pad_id)
    assert batch.row_episode.tolist() == [0, 0] and batch.generated_tokens == len(call) + len(answer)


@pytest.fixture(scope="module")
def peaked_cfg():
    """A tiny run whose random model is peaked enough that top-k and top-p both cut."""
    return build_agent_config("tiny", run_name="parity", temperature=0.7, top_p=0.9, top_k=5, env="Arithmetic-v0",
                              max_tokens=12)


def _generator(cfg) -> tuple[TorchGenerator, CharTokenizer, LlamaLM]:
    model, tokenizer = build_language_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.mul_(10)  # initializer_range 0.2: a confident model, so truncation matters
    return TorchGenerator(model, version=0), tokenizer, model


def test_trainer_recomputes_the_behaviour_logprobs_exactly(peaked_cfg) -> None:
    generator, tokenizer, model = _generator(peaked_cfg)
    make_env = lambda: make_agent_env(peaked_cfg.env.name)  # noqa: E731
    arrays, meta = rollout_chunk(peaked_cfg, make_env, tokenizer, lambda r: generator.generate(r, 0), 64, 0, 0, 0)
    batch = ScoredTokens.from_arrays(score(peaked_cfg, [arrays], [meta]))
    parity = logprob_parity(model, batch, torch.arange(len(batch.tokens)), sampling_params(peaked_cfg),
                            _one_process())
    assert batch.loss_mask.sum() > 30  # sampled tokens compared
    assert parity["logprob_parity_max"] == 0, parity
    # the same check against the raw softmax finds the offset that a trainer ignoring top-k/top-p would carry
    raw = logprob_parity(model, batch, torch.arange(len(batch.tokens)), SamplingParams(temperature=0.7),
                         _one_process())
    assert raw["logprob_parity_max"] > 1e-3


def _one_process():
    from rl_core.algos.base import UpdateHooks

    return UpdateHooks()


def test_a_chunk_regenerated_from_its_counters_is_bit_identical(peaked_cfg) -> None:
    make_env = lambda: make_agent_env(peaked_cfg.env.name)  # noqa: E731
    runs = []
    for _ in range(2):
        generator, tokenizer, _ = _generator(peaked_cfg)
        runs.append(rollout_chunk(peaked_cfg, make_env, tokenizer, lambda r: generator.generate(r, 0), 64, 1, 0, 1))
    (a, meta_a), (b, meta_b) = runs
    assert meta_a == meta_b and meta_a["groups"] == [2, 4] and meta_a["iteration"] == 1
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    other, _ = rollout_chunk(peaked_cfg.model_copy(update={"seed": 1}), make_env, tokenizer,
                             lambda r: generator.generate(r, 0), 64, 1, 0, 1)
    assert not np.array_equal(other["tokens"], a["tokens"])  # another seed draws other tokens


def test_an_episode_whose_context_is_full_ends_with_reward_zero() -> None:
    tokenizer = CharTokenizer(make_agent_env("CalcTool-v0").alphabet)
    env = make_agent_env("CalcTool-v0")
    seed = env.problem_seeds("train", 1)[0]
    calls = ["<calc>1*1</calc>"] * 3
    generate = ScriptedGenerator(tokenizer, {0: calls})
    (episode,) = run_agent_episodes([EpisodeSpec(0, 0, seed)], lambda: make_agent_env("CalcTool-v0"), tokenizer, generate,
                              SamplingParams(max_tokens=24), (0, 1, 0), context=30, version=3)
    assert episode.done and episode.reward == 0.0 and "context of 30 positions is full" in episode.info["error"]


def test_a_generation_from_another_version_is_refused() -> None:
    tokenizer = CharTokenizer(make_agent_env("Arithmetic-v0").alphabet)
    generate = ScriptedGenerator(tokenizer, {0: ["12\n"]})  # stamps version 3
    with pytest.raises(RuntimeError, match="policy version 3, not the asked version 4"):
        run_agent_episodes([EpisodeSpec(0, 0, 0)], lambda: make_agent_env("Arithmetic-v0"), tokenizer, generate,
                     SamplingParams(max_tokens=4), (0, 1, 0), context=32, version=4)


class Growing:
    """Problem `seed`'s prompt is seed // 2 + 1 letters: later iterations outgrow a small context."""

    name = "Growing-v0"
    alphabet = "a\n"
    max_turns = 1
    stop = ("\n",)

    def reset(self, seed: int) -> str:
        return "a" * (seed // 2 + 1)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        return "", 0.0, True, {"correct": False}

    def demonstration(self, seed: int) -> list[str]:
        return ["a\n"]

    def problem_seeds(self, split, count: int, start: int = 0) -> list[int]:
        from rl_core.envs.agent import split_seeds

        return split_seeds(split, count, start)


def test_a_prompt_longer_than_the_context_fails_the_step_before_anything_is_written(tmp_path, monkeypatch) -> None:
    from rl_core.envs.agent import register_agent_env, registry
    from rl_core.runtime.agent.actors import AgentActors
    from rl_core.runtime.agent.rollouts import rollout_iteration

    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))  # registered for this test only
    register_agent_env(Growing, Growing.name)
    cfg = build_agent_config("tiny", run_name="growing", env="Growing-v0", context=32, eval_problems=4,
                             store=f"file://{tmp_path}")  # iteration 0's prompts fit: the run starts
    with pytest.raises(ValueError, match="Growing-v0 train problem 64: its prompt is 34 tokens .* context of 32"):
        rollout_iteration(cfg, AgentActors(cfg), iteration=8, version=8)
    assert not (tmp_path / "growing").exists()
