"""Run agent episodes with a generator: the env's text goes in as token ids, the sampled ids come back with their
behaviour log-probs, and every episode keeps exactly the tokens that were sampled (`trajectories`).

All episodes given are stepped turn by turn together: each round sends one request per running episode to the
generator (one call, so a backend can batch them), hands each completion's text to its env, and appends the env's
observation. An episode's random stream is a pure function of its counters, (seed, stream, iteration, group,
sample, turn), so whichever call or retry generates it, an episode draws the same tokens.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from rl_core.algos.grpo.trajectories import Episode, Tokenizer
from rl_core.config.agent import AgentRunConfig
from rl_core.envs.agent import AgentEnv
from rl_core.generation import Generation, GenerationRequest, SamplingParams

ROLLOUT_STREAM = 0x524F4C4C  # "ROLL": training rollouts
EVAL_STREAM = 0x4556414C  # "EVAL": held-out evaluation

Generate = Callable[[Sequence[GenerationRequest]], list[Generation]]
"""Requests in, one generation per request out, from the policy version the caller asked for."""


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to run: problem `problem_seed` as sample `sample` of prompt group `group`."""

    group: int
    sample: int
    problem_seed: int


def stop_sequences(env: AgentEnv, tokenizer: Tokenizer) -> tuple[tuple[int, ...], ...]:
    """The env's stop strings as token ids, and eos: generation of a turn ends with the first of them."""
    return (*(tuple(tokenizer.encode(text)) for text in env.stop), (tokenizer.eos_id,))


def first_prompts(make_env: Callable[[], AgentEnv], tokenizer: Tokenizer, seeds: Sequence[int]) -> list[int]:
    """Token count of each problem's first prompt as the model sees it, to check them against the context up front."""
    env = make_env()
    return [len(tokenizer.conversation_ids([("user", env.reset(seed))])) for seed in seeds]


def run_agent_episodes(
    specs: Sequence[EpisodeSpec],
    make_env: Callable[[], AgentEnv],
    tokenizer: Tokenizer,
    generate: Generate,
    params: SamplingParams,
    counters: tuple[int, ...],
    context: int,
    version: int,
    step_threads: int = 1,
) -> list[Episode]:
    """Play every episode of `specs` to its end; `counters` (e.g. (seed, ROLLOUT_STREAM, iteration)) lead every
    request's seed counters, and `version` is the policy version `generate` samples from (each generation must
    carry it). A turn gets at most `params.max_tokens` tokens and never more than the context has left; an
    episode whose context is full ends with reward 0 and says so in its info. `step_threads` > 1 steps that many
    envs at once (for envs whose step waits on a simulation elsewhere); episodes never share state, so the result
    is the same."""
    envs = [make_env() for _ in specs]
    episodes = [Episode.begin(tokenizer, s.group, s.sample, s.problem_seed, version, env.reset(s.problem_seed))
                for s, env in zip(specs, envs)]
    stop = stop_sequences(envs[0], tokenizer) if envs else ()
    for turn in range(1, max((env.max_turns for env in envs), default=0) + 1):
        running = [i for i, e in enumerate(episodes) if not e.done]
        requests, asked = [], []
        for i in running:
            episode, room = episodes[i], context - len(episodes[i].current.tokens)
            if room < 1:
                episode.done = True
                episode.info = {"correct": False, "error": f"the context of {context} positions is full after "
                                f"{turn - 1} turns"}
                continue
            turn_params = replace(params, max_tokens=min(params.max_tokens, room), stop=stop)
            requests.append(GenerationRequest(tuple(episode.current.tokens), turn_params,
                                              (*counters, episode.group, episode.sample, turn)))
            asked.append(i)
        if not requests:
            break
        generations = generate(requests)
        if len(generations) != len(asked):
            raise RuntimeError(f"the generator answered {len(generations)} of {len(asked)} requests")
        steps = [(episodes[i], envs[i], generation, tokenizer, turn, version) for i, generation in
                 zip(asked, generations)]
        if step_threads > 1:
            with ThreadPoolExecutor(step_threads, thread_name_prefix="agent-env-step") as pool:
                list(pool.map(lambda args: _take_turn(*args), steps))
        else:
            for args in steps:
                _take_turn(*args)
    for episode in episodes:
        if not episode.done:  # the env wanted more turns than it declared
            episode.done = True
            episode.info.setdefault("error", f"the episode did not end within max_turns={envs[0].max_turns}")
    return episodes


def _take_turn(episode: Episode, env: AgentEnv, generation: Generation, tokenizer: Tokenizer, turn: int,
               version: int) -> None:
    """Append the completion, step the env with its text, and append the observation unless the episode ended."""
    if generation.version != version:
        raise RuntimeError(f"the generator answered with policy version {generation.version}, not the asked "
                           f"version {version}: its samples would be mislabelled")
    action = tokenizer.decode(generation.completion)
    episode.act(list(generation.completion), list(generation.logprobs), action, 2 * turn - 1)
    episode.finish_reasons.append(generation.finish_reason)
    observation, reward, done, info = env.step(action)
    episode.reward += float(reward)
    episode.info = info
    episode.done = bool(done)
    if not done:
        episode.observe(tokenizer, observation, 2 * turn)


def sampling_params(cfg: AgentRunConfig) -> SamplingParams:
    """The distribution rollouts sample from, which the update recomputes (stop sequences are per env)."""
    s = cfg.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens)
