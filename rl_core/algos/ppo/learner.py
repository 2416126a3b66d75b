"""PPO behind the algorithm seam: its policy (acts), its learner (trains) and its phase functions, registered as "ppo".

State is flat arrays under stable dotted names: `model.*` (actor-critic), `obs_norm.*` and `return_norm.*`
(running statistics) are the policy; `optim.*` (Adam) completes the learner. `state()` / `load_state()` give exactly
what a checkpoint needs to continue bit-exactly.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

import gymflow_kernels as kernels
from rl_core.algos.base import Algorithm, Calls, Spaces, Tensors, UpdateHooks, register_algorithm
from rl_core.algos.ppo.advantages import score_experience
from rl_core.algos.ppo.batches import Experience, ScoredBatch
from rl_core.algos.ppo.collect import acting_version, collect_rollout
from rl_core.algos.ppo.update import RolloutBatch, decoupled, ppo_update, summarize_epochs
from rl_core.config.control import ControlRunConfig, PPOConfig
from rl_core.config.threads import SCORE_THREADS, update_cores
from rl_core.optim.adam import FusedAdam
from rl_core.optim.optimizer_state import load_optimizer_arrays, optimizer_arrays
from rl_core.policies.mlp import ActorCritic
from rl_core.policies.normalizer import Moments, ObservationNormalizer
from rl_core.seeding import action_noise, derive_seed

UPDATE_STREAM = 7
"""An iteration's minibatch order is drawn from (derive_seed(seed, iteration, UPDATE_STREAM), epoch)."""


class PPOPolicy:
    """Actor-critic and the running statistics it acts with; seeded so equal seeds give equal initial weights."""

    def __init__(self, spaces: Spaces, cfg: PPOConfig, seed: int) -> None:
        with torch.random.fork_rng(devices=[]):  # the initializers draw from torch's global generator: keep the
            torch.manual_seed(seed)  # caller's stream as it was
            self.model = ActorCritic(spaces.obs_dim, spaces.action_dim, cfg.hidden, cfg.log_std_init)
        self.cfg = cfg
        self.obs_norm = ObservationNormalizer(spaces.obs_dim)
        self.return_norm = ObservationNormalizer(1)  # variance of discounted returns, for reward scaling

    def reward_scale(self) -> float:
        """1/std of discounted returns (gymnasium's NormalizeReward), 1 before data or when disabled."""
        m = self.return_norm.moments
        if not self.cfg.scale_rewards or m.count < 2:
            return 1.0
        return float(1.0 / np.sqrt(m.m2[0] / m.count + 1e-8))

    def deterministic_action(self, obs: np.ndarray) -> np.ndarray:
        """The mean action for raw observations (evaluation)."""
        with torch.no_grad():
            x = torch.from_numpy(self.obs_norm.normalize(obs))
            return self.model.deterministic_action(x).numpy().astype(np.float64)

    def update_statistics(self, obs: Moments, returns: Moments) -> None:
        """Fold a rollout's raw-observation and discounted-return moments in (after its update)."""
        self.obs_norm.update(obs)
        self.return_norm.update(returns)

    def state(self) -> Tensors:
        out = {f"model.{k}": v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        out.update({f"obs_norm.{k}": v for k, v in self.obs_norm.state().items()})
        out.update({f"return_norm.{k}": v for k, v in self.return_norm.state().items()})
        return out

    def load_state(self, state: Tensors) -> None:
        self.model.load_state_dict({k[6:]: torch.from_numpy(v.copy()) for k, v in state.items()
                                    if k.startswith("model.")})
        self.obs_norm.load_state({k[9:]: v for k, v in state.items() if k.startswith("obs_norm.")})
        self.return_norm.load_state({k[12:]: v for k, v in state.items() if k.startswith("return_norm.")})


class PPOLearner:
    """A PPOPolicy, the Adam that trains it, and the run's schedule (learning-rate annealing, minibatch seeds)."""

    def __init__(self, run: ControlRunConfig, spaces: Spaces) -> None:
        self.run = run
        self.cfg: PPOConfig = run.algorithm  # type: ignore[assignment]
        self.policy = PPOPolicy(spaces, self.cfg, run.seed)
        self._optimizer: FusedAdam | None = None

    @property
    def optimizer(self) -> FusedAdam:
        """Adam over the model's parameters (`FusedAdam`: torch.optim.Adam(fused=True)'s bits, without importing
        `torch._dynamo`), created on first use. Its state holds nothing before the first step, so when it is created
        does not change any result."""
        if self._optimizer is None:
            self._optimizer = FusedAdam(self.policy.model.parameters(), lr=self.cfg.learning_rate, eps=1e-5)
        return self._optimizer

    def update(self, batch: Tensors, iteration: int, hooks: UpdateHooks = UpdateHooks()) -> dict[str, float]:
        """PPO epochs on iteration's scored batch, then the batch's statistics folded into the policy's."""
        scored = ScoredBatch.from_arrays(batch)
        rollout = RolloutBatch.from_scored(scored)
        if self.run.overlap:  # collected one update ago: clip against the weights this update starts from
            rollout = decoupled(self.policy.model, rollout)
        done = hooks.resume()
        frac = 1.0 - iteration / self.run.iterations if self.cfg.anneal_lr else 1.0
        with kernels.using_cores(update_cores(self.run.num_ranks, self.run.overlap)):
            history = ppo_update(self.policy.model, self.optimizer, rollout, self.cfg,
                                 generator_seed=derive_seed(self.run.seed, iteration, UPDATE_STREAM),
                                 learning_rate=self.cfg.learning_rate * max(frac, 0.0), hooks=hooks, done=done)
        self.policy.update_statistics(scored.obs_moments, scored.ret_moments)
        metrics = summarize_epochs(history)
        metrics["epochs_resumed"] = float(len(done))  # > 0: this attempt continued a failed one
        return metrics

    def policy_state(self) -> Tensors:
        return self.policy.state()

    def state(self) -> Tensors:
        return {**self.policy.state(), **optimizer_arrays(self._optimizer)}

    def load_state(self, state: Tensors) -> None:
        self.policy.load_state(state)
        load_optimizer_arrays(self.optimizer, state)


def initial_carry(num_envs: int) -> Tensors:
    """Each env's running discounted return (reward scaling), carried with the env across iterations."""
    return {"discounted_return": np.zeros(num_envs)}


RNG_SCHEME = "counter-based: every stream is seeded from (seed, iteration, env index, episode index)"


def counters(cfg: ControlRunConfig, experience: list[str], parent_meta: dict[str, Any] | None) -> dict[str, Any]:
    """The run's env-step count and how its randomness is seeded."""
    steps = 0 if parent_meta is None else parent_meta["env_steps"] + cfg.batch_size
    return {"env_steps": steps, "rng": RNG_SCHEME}


def collect(cfg: ControlRunConfig, policy: PPOPolicy, env: Any, carry: Tensors, iteration: int,
            first_env: int) -> tuple[Tensors, dict[str, Any]]:
    """One rollout of `cfg.env.rollout_steps` steps; env e's action noise comes from (seed, iteration, e)."""
    steps = cfg.env.rollout_steps
    noise = action_noise(cfg.seed, iteration, first_env, env.num_envs, steps, env.action_dim)
    experience, info = collect_rollout(env, policy.model, policy.obs_norm, steps, policy.cfg.gamma,
                                       carry["discounted_return"], noise)
    return experience.to_arrays(), {"reward_scale": policy.reward_scale(), **info}


def score(cfg: ControlRunConfig, parts: list[Tensors], metas: list[dict[str, Any]]) -> Tensors:
    """GAE over every worker's experience, with the reward scale they all acted with."""
    scales = {m["reward_scale"] for m in metas}
    if len(scales) != 1:
        raise RuntimeError(f"workers used different reward scales {scales}; rerun simulate")
    ppo: PPOConfig = cfg.algorithm  # type: ignore[assignment]
    previous = torch.get_num_threads()
    torch.set_num_threads(SCORE_THREADS)  # the count GAE was tuned at (`hot_ops`), whatever the process's own
    try:
        scored = score_experience([Experience.from_arrays(p) for p in parts], scales.pop(), ppo.gamma, ppo.gae_lambda)
    finally:
        torch.set_num_threads(previous)
    return scored.to_arrays()


def hot_ops(cfg: ControlRunConfig, spaces: Spaces, num_ranks: int, trainer_threads: int | None,
            env_worker_threads: int | None) -> Calls:
    """GAE over the whole rollout in the score step, the PPO gradient on one rank's share of a minibatch, and the
    policy's forward pass on one env worker's envs at every step. A policy with two hidden layers of one width (the
    shape the MLP ops are tuned for) takes the whole minibatch gradient (`ppo_grad`); any other only the loss."""
    ppo: PPOConfig = cfg.algorithm  # type: ignore[assignment]
    ops: Calls = {"gae": ({"T": cfg.env.rollout_steps, "N": cfg.env.num_envs}, SCORE_THREADS)}
    minibatch = ppo.minibatch_size // num_ranks
    if len(ppo.hidden) == 2 and ppo.hidden[0] == ppo.hidden[1]:
        widths = {"D": spaces.obs_dim, "H": ppo.hidden[0], "A": spaces.action_dim}
        ops["ppo_grad"] = ({"B": minibatch, **widths}, trainer_threads)
        ops["policy_mlp_forward"] = ({"B": cfg.env.envs_per_worker, **widths}, env_worker_threads)
    else:
        ops["ppo_loss"] = ({"B": minibatch}, trainer_threads)
    return ops


def build_ppo_policy(cfg: ControlRunConfig, spaces: Spaces) -> PPOPolicy:
    return PPOPolicy(spaces, cfg.algorithm, cfg.seed)  # type: ignore[arg-type]


register_algorithm(Algorithm(
    name="ppo",
    learner=PPOLearner,
    policy=build_ppo_policy,
    score=score,
    hot_ops=hot_ops,
    counters=counters,
    initial_carry=initial_carry,
    collect=collect,
    behaviour_version=acting_version,
))
