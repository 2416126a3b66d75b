"""The rollout step of an agent run, driven from the process that runs the flow:
episodes are plain Python here, generation happens on the generator actor, simulations on the simulation workers.

A rollout writes each chunk of prompt groups to the store as soon as it is generated (its safe points), and a
retried or resumed rollout keeps the chunks already written for this iteration and version, regenerating only the
rest: with counter-seeded sampling the result is bit-identical to a rollout that never stopped.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from rl_core.algos.base import Tensors, algorithm_of
from rl_core.config.agent import AgentRunConfig
from rl_core.data import RunLayout, TensorFileError, read_tensors, write_tensors
from rl_core.policies.lm_policy import model_spec, tokenizer_of
from rl_core.runtime.agent.program_chunks import program_chunk
from rl_core.runtime.faults import maybe_fail

if TYPE_CHECKING:
    from rl_core.runtime.agent.actors import AgentActors


def _written(uri: str, iteration: int, version: int) -> Tensors | None:
    """The chunk at `uri` if an earlier attempt wrote it whole for this iteration and version, else None."""
    try:
        arrays, meta = read_tensors(uri)
    except TensorFileError:  # missing, or cut short by a crash: generated again
        return None
    if (meta.get("iteration"), meta.get("version")) != (iteration, version):
        return None
    return arrays


def rollout_iteration(cfg: AgentRunConfig, actors: "AgentActors", iteration: int, version: int) -> dict:
    """Every prompt group of `iteration`, sampled from `version` (`behaviour_version`), written chunk by chunk; URIs
    and metrics."""
    algorithm = algorithm_of(cfg)
    behaviour, rollouts = algorithm.behaviour_version(cfg, iteration), algorithm.rollouts
    if version != behaviour:
        raise ValueError(f"iteration {iteration} samples from policy version {behaviour} "
                         f"(max_staleness {cfg.algorithm.max_staleness}), not {version}")
    started = time.perf_counter()
    layout = RunLayout(cfg.run_url)
    tokenizer, context = tokenizer_of(cfg), model_spec(cfg).max_position_embeddings
    rollouts.check(cfg, actors.make_env, tokenizer, context, iteration)  # before anything is generated or written
    actors.generator.sync(version)
    generate = lambda requests: actors.generator.generate(requests, version)  # noqa: E731
    uris, chunks, resumed, calls = [], [], 0, Counter()
    for chunk in range(rollouts.chunks(cfg)):
        uri = layout.trajectories(iteration, chunk)
        arrays = _written(uri, iteration, version)
        if arrays is None:
            if actors.program is not None:
                arrays, meta = program_chunk(cfg, actors, generate, iteration, version, chunk)
                calls.update(meta["calls"])
            else:
                arrays, meta = rollouts.chunk(cfg, actors.make_env, tokenizer, generate, context, iteration, version,
                                              chunk, actors.step_threads)
            write_tensors(uri, arrays, meta)
        else:
            resumed += 1
        maybe_fail("rollout.chunk_written", iteration=iteration, chunk=chunk)
        uris.append(uri)
        chunks.append(arrays)
    metrics = rollouts.metrics(chunks, tokenizer.pad_id)
    return {"trajectories": uris, **metrics, "chunks_resumed": resumed, **{f"program_{k}": v for k, v in calls.items()},
            "seconds": time.perf_counter() - started}

