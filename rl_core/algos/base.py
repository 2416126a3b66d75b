"""The algorithm seam: what the runtime (env workers, trainer ranks, the in-process loop) needs of an algorithm.

An algorithm is registered once (`register_algorithm`) under the name its config section carries
(`ControlRunConfig.algorithm.name`) and provides one function per phase of an iteration:

    collect   policy + envs -> experience         (env workers; the in-process loop on threads)
    score     experience of all workers -> batch  (the score step)
    update    Learner.update(batch, iteration)    (each trainer rank; the in-process loop)

plus how to build its `Learner` (trains: weights, optimizer, statistics) and its `Policy` (acts: only what acting
needs). The runtime calls these and nothing else, so a new algorithm is a new module that registers itself.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np
import torch

from rl_core.data.tensorfile import Tensors

if TYPE_CHECKING:
    from rl_core.config.control import ControlRunConfig

Epochs = list[dict[str, float]]
"""Per-epoch metrics of an update, in order."""
AllReduceMean = Callable[[torch.Tensor], None]
"""Averages a flat tensor across ranks in place; identity for a single process."""
Calls = dict[str, tuple[dict, "int | None"]]
"""op name -> (shape it is called with, torch thread count of the calling process; None: the current one)."""


def single_process(_: torch.Tensor) -> None:
    """AllReduceMean for one process: nothing to average."""


@dataclass(frozen=True)
class Spaces:
    """Sizes of the task's observation and action vectors."""

    obs_dim: int
    action_dim: int


@dataclass(frozen=True)
class UpdateHooks:
    """How the process running an update takes part in it. The defaults are one process, nothing saved.

    `resume` runs once the batch is prepared against the weights the update starts from: it may restore a partly
    done update (the learner's state after some epochs) and returns those epochs' metrics, so only the rest run.
    `on_epoch_end(epochs, last)` follows every epoch with the metrics so far (`last`: no epoch follows).
    """

    rank: int = 0
    world_size: int = 1
    all_reduce_mean: AllReduceMean = single_process
    all_reduce_max: AllReduceMean = single_process  # elementwise max across ranks, in place
    resume: Callable[[], Epochs] = field(default=lambda: [])
    on_epoch_end: Callable[[Epochs, bool], None] | None = None


class Policy(Protocol):
    """What an acting process holds: weights and statistics, no optimizer."""

    def state(self) -> Tensors:
        """The tensors acting needs (a subset of the learner's `state()`, under the same names)."""
        ...

    def load_state(self, state: Tensors) -> None:
        """Take the acting tensors from a policy or learner state (other keys are ignored)."""
        ...


class Learner(Protocol):
    """What a training process holds: the policy it improves, its optimizer and statistics. An algorithm registered
    with `warm_start=True` also gives its learner `warm_start() -> metrics`, which prepares a new run's version 0."""

    policy: Policy  # acts with the learner's current weights (shared, not a copy)

    def update(self, batch: Tensors, iteration: int, hooks: UpdateHooks = UpdateHooks()) -> dict[str, float]:
        """One iteration's update from the scored `batch` (schedules and seeds from the run config); metrics."""
        ...

    def state(self) -> Tensors:
        """Every tensor needed to continue bit-exactly, keyed by stable dotted names."""
        ...

    def load_state(self, state: Tensors) -> None:
        """Restore from `state()`."""
        ...

    def policy_state(self) -> Tensors:
        """The acting subset of `state()`: what env workers load."""
        ...


@dataclass(frozen=True)
class Rollouts:
    """How an algorithm whose experience is agent episodes (GRPO) collects it, as the agent runtime's rollout step
    and held-out evaluation drive it: an iteration's episodes in chunks, each written as soon as it is sampled (the
    rollout's safe points). The episodes' types (env factory, tokenizer, generate) are the algorithm's own."""

    chunks: Callable[[Any], int]
    """cfg -> how many chunks an iteration's rollout writes."""
    check: Callable[..., None]
    """(cfg, make_env, tokenizer, context, iteration) -> a ValueError when the iteration's prompts leave no room."""
    chunk: Callable[..., tuple[Tensors, dict[str, Any]]]
    """(cfg, make_env, tokenizer, generate, context, iteration, version, chunk, step_threads) -> (arrays, meta)."""
    metrics: Callable[[list[Tensors], int], dict[str, float]]
    """(the iteration's chunks in order, the tokenizer's pad id) -> the rollout's metrics."""
    evaluate: Callable[..., dict[str, Any]]
    """(cfg, make_env, tokenizer, generate, context, version, step_threads) -> held-out metrics of `version`."""


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm: its builders and its phase functions (see the module docstring)."""

    name: str
    learner: Callable[["ControlRunConfig", "Spaces | None"], Learner]
    policy: Callable[["ControlRunConfig", "Spaces | None"], Policy]
    score: Callable[["ControlRunConfig", list[Tensors], list[dict[str, Any]]], Tensors]
    """(cfg, experience of each worker in worker order, their metas) -> the batch every rank updates from."""
    hot_ops: Callable[["ControlRunConfig", "Spaces | None", int, "int | None", "int | None"], Calls]
    """(cfg, spaces, ranks, trainer threads, env-worker threads) -> the kernels its phases dispatch, to tune."""
    initial_carry: Callable[[int], Tensors] | None = None
    """Per-env arrays an algorithm carries across iterations with the envs (checkpointed with them), for N envs;
    None for an algorithm whose experience does not come from env workers (GRPO's comes from rollouts)."""
    collect: (Callable[["ControlRunConfig", Policy, Any, Tensors, int, int], tuple[Tensors, dict[str, Any]]]
              | None) = None
    """(cfg, policy, envs, carry, iteration, first env index) -> (experience, small JSON meta); updates carry."""
    counters: Callable[["ControlRunConfig", list[str], "dict[str, Any] | None"], dict[str, Any]] | None = None
    """(cfg, the iteration's experience URIs, the parent version's meta; None for version 0) -> JSON counters of
    the version's meta (env steps; tokens and the trajectories an update consumed), beside iteration and seed."""
    warm_start: bool = False
    """Whether a new run's version 0 is the learner after its `warm_start()` (GRPO: SFT) instead of as built."""
    uses_spaces: bool = True
    """Whether its builders need the MuJoCo task's observation and action sizes (`env_spaces`); else they get None."""
    rollouts: Rollouts | None = None
    """How agent episodes are collected, for an algorithm whose experience comes from rollouts, not env workers."""
    behaviour_version: Callable[[Any, int], int] = lambda cfg, iteration: iteration
    """(cfg, iteration) -> the policy version that acts in (collects or samples) iteration `iteration`: the version it
    trains from, or with overlap or staleness the one before. A rule, not a mode: a retried step asks the same."""
    rests_on: Callable[["ControlRunConfig"], dict[str, str]] | None = None
    """(cfg) -> what the run's versions need from outside the store, by digest (GRPO with LoRA: the frozen base
    model's files): recorded in run.json by a new run, and a continued run must present the same."""
    check: Callable[["ControlRunConfig"], None] | None = None
    """The algorithm's part of the preflight (`rl_core.algos.preflight`): raises a `FieldProblem` naming what the
    world refuses (a model file, a backend); called once per process by the edges, never by the actors."""


_ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm) -> None:
    """Make `algorithm` runnable under its name; never silently replaces another."""
    if _ALGORITHMS.get(algorithm.name, algorithm) is not algorithm:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    _ALGORITHMS[algorithm.name] = algorithm


def algorithm_of(cfg: "ControlRunConfig") -> Algorithm:
    """The registered algorithm the run's config section names."""
    try:
        return _ALGORITHMS[cfg.algorithm.name]
    except KeyError:
        raise KeyError(f"algorithm {cfg.algorithm.name!r} has a config section but no implementation registered; "
                       f"registered: {', '.join(sorted(_ALGORITHMS))}") from None


def env_spaces(cfg: "ControlRunConfig") -> Spaces:
    """The run's observation and action sizes, from a one-env probe batch."""
    from rl_core.envs import make_batch

    probe = make_batch(cfg.env.name, 1, seed=0)
    return Spaces(probe.obs_dim, probe.action_dim)


def spaces_for(cfg: "ControlRunConfig", spaces: Spaces | None = None) -> Spaces | None:
    """`spaces`, else the run's task's when its algorithm uses them (probing a one-env batch), else None."""
    return spaces or (env_spaces(cfg) if algorithm_of(cfg).uses_spaces else None)


def build_learner(cfg: "ControlRunConfig", spaces: Spaces | None = None) -> Learner:
    """The run's learner, seeded from the run's seed: equal configs give equal initial weights."""
    return algorithm_of(cfg).learner(cfg, spaces_for(cfg, spaces))


def build_policy(cfg: "ControlRunConfig", spaces: Spaces | None = None) -> Policy:
    """A policy to act with; its weights come from `load_state` (a checkpoint's policy tensors)."""
    return algorithm_of(cfg).policy(cfg, spaces_for(cfg, spaces))


def policy_sha256(state: Tensors) -> str:
    """Hash of the policy parameters' bytes (the `model.` tensors) in name order: equal hashes mean bit-identical
    weights."""
    digest = hashlib.sha256()
    for name in sorted(k for k in state if k.startswith("model.")):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(state[name]).tobytes())
    return digest.hexdigest()
