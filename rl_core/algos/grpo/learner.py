"""GRPO behind the algorithm seam: the LM policy, its learner (Adam, the frozen reference) and its phases,
registered as "grpo".

Its experience does not come from env workers: the agent flow's rollout step writes token-exact trajectories
(`trajectories.TrajectoryBatch`), `score` turns them into group-relative advantages, and `GRPOLearner.update` runs
on every trainer rank. A new run's initial state is the SFT warm start (`warm_start`), which also becomes the
frozen reference the KL term (beta > 0) pulls towards.

State is flat arrays under stable dotted names: `model.*` (HF parameter names: the policy), `reference.*` (the
frozen reference, kept only when beta > 0) and `optim.*` (Adam).
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rl_core.algos.base import Algorithm, Calls, Rollouts, Spaces, Tensors, UpdateHooks, register_algorithm
from rl_core.algos.grpo.checks import check_agent_run
from rl_core.algos.grpo.episodes import sampling_params
from rl_core.algos.grpo.phases import (
    behaviour_version,
    check_iteration_fits,
    evaluate_heldout,
    iteration_metrics,
    num_chunks,
    rollout_chunk,
)
from rl_core.algos.grpo.sft import demonstration_segment, supervised_warm_start
from rl_core.algos.grpo.trajectories import TrajectoryBatch
from rl_core.algos.grpo.update import ScoredTokens, UpdateStart, group_advantages, grpo_update
from rl_core.data import RunLayout
from rl_core.envs.agent import make_agent_env
from rl_core.optim.optimizer_state import load_optimizer_arrays, optimizer_arrays
from rl_core.policies.hf_model import model_digest
from rl_core.policies.lm_policy import LMPolicy, hf_state, tokenizer_of
from rl_core.seeding import derive_seed

if TYPE_CHECKING:
    from rl_core.config.agent import AgentRunConfig

UPDATE_STREAM = 7
"""An iteration's group order is drawn from (derive_seed(seed, iteration, UPDATE_STREAM), epoch)."""
REFERENCE_PREFIX = "reference."
RNG_SCHEME = ("counter-based: a rollout token is drawn from (seed, stream, iteration, group, sample, turn), an "
              "update's group order from (seed, iteration, epoch)")


class GRPOLearner:
    """An LMPolicy, the Adam that trains it and (beta > 0) the frozen reference; the run's update schedule."""

    def __init__(self, run: AgentRunConfig, spaces: Spaces | None = None) -> None:
        self.run = run
        self.cfg = run.algorithm
        self.policy = LMPolicy.build(run)
        self.reference = self._frozen_copy() if self.cfg.beta > 0 else None
        self._optimizer: torch.optim.Adam | None = None

    def _frozen_copy(self) -> torch.nn.Module:
        reference = copy.deepcopy(self.policy.model).eval()
        for param in reference.parameters():
            param.requires_grad_(False)
        return reference

    @property
    def optimizer(self) -> torch.optim.Adam:
        """Adam over the model's parameters, created on first use (it imports torch._dynamo: seconds)."""
        if self._optimizer is None:
            trained = [p for p in self.policy.model.parameters() if p.requires_grad]  # LoRA: the adapters alone
            self._optimizer = torch.optim.Adam(trained, lr=self.cfg.learning_rate)
        return self._optimizer

    def warm_start(self) -> dict[str, float]:
        """SFT on the env's demonstrations (a new run's version 0); the reference becomes the warm-started policy."""
        sft = self.run.sft
        env = make_agent_env(self.run.env.name)
        metrics = supervised_warm_start(
            self.policy.model, self.policy.tokenizer, env, sft.steps, sft.batch_size, sft.learning_rate,
            lambda count, start: env.problem_seeds("train", count, start))
        if self.reference is not None:
            self.reference = self._frozen_copy()
        return metrics

    def update(self, batch: Tensors, iteration: int, hooks: UpdateHooks = UpdateHooks()) -> dict[str, float]:
        """GRPO epochs on the iteration's scored token batch."""
        scored = ScoredTokens.from_arrays(batch)
        # From the weights the update starts from (version `iteration`), before a resume restores a later state.
        start = UpdateStart.prepare(self.policy.model, scored, sampling_params(self.run), iteration,
                                    self.cfg.max_staleness, self.cfg.tis_cap, hooks)
        done = hooks.resume()
        history = grpo_update(
            self.policy.model, self.optimizer, scored, params=sampling_params(self.run),
            minibatches=self.cfg.minibatches, update_epochs=self.cfg.update_epochs, clip_eps=self.cfg.clip_eps,
            beta=self.cfg.beta, token_level=self.cfg.token_level, max_grad_norm=self.cfg.max_grad_norm,
            nonfinite_limit=self.cfg.nonfinite_limit,
            generator_seed=derive_seed(self.run.seed, iteration, UPDATE_STREAM), start=start,
            reference=self.reference, hooks=hooks, done=done)
        metrics = {k: float(np.mean([h[k] for h in history if k in h])) for k in history[0]}
        metrics.update(epochs=float(len(history)), epochs_resumed=float(len(done)),
                       skipped_updates=sum(h.get("skipped_updates", 0.0) for h in history))
        return metrics

    def policy_state(self) -> Tensors:
        return self.policy.state()

    def state(self) -> Tensors:
        out = self.policy.state()
        if self.reference is not None:
            out.update({REFERENCE_PREFIX + k: v.detach().numpy().copy()
                        for k, v in self.reference.policy_state_dict().items()})
        return {**out, **optimizer_arrays(self._optimizer)}

    def load_state(self, state: Tensors) -> None:
        self.policy.load_state(state)
        if self.reference is not None:
            self.reference.load_policy_state({k: torch.from_numpy(np.array(v, dtype=np.float32))
                                              for k, v in hf_state(state, REFERENCE_PREFIX).items()})
        load_optimizer_arrays(self.optimizer, state)


def score(cfg: AgentRunConfig, parts: list[Tensors], metas: list[dict[str, Any]]) -> Tensors:
    """Group-relative advantages of the iteration's episodes, broadcast to their token rows."""
    batch = TrajectoryBatch.concatenate([TrajectoryBatch.from_arrays(p) for p in parts], tokenizer_of(cfg).pad_id)
    advantages = group_advantages(batch.rewards, batch.episode_group, cfg.algorithm.scale_std)
    return {"tokens": batch.tokens, "loss_mask": batch.loss_mask, "behaviour_logprobs": batch.behaviour_logprobs,
            "lengths": batch.lengths, "advantages": advantages[batch.row_episode],
            "groups": batch.episode_group[batch.row_episode], "versions": batch.versions[batch.row_episode],
            "rewards": batch.rewards}


def hot_ops(cfg: AgentRunConfig, spaces: Spaces | None, num_ranks: int, trainer_threads: int | None,
            env_worker_threads: int | None) -> Calls:
    """The loss of one rank's minibatch, at the length of a solved episode (the env's scripted demonstration; the
    shape bucket rounds it up). Not the token log-probs: they go through the model's own LM head, as the generator's
    do, so that the behaviour log-probs are recomputed exactly (`update.token_logprobs`)."""
    grpo = cfg.algorithm
    rows = grpo.prompts_per_iteration * grpo.group_size // grpo.minibatches // num_ranks
    env = make_agent_env(cfg.env.name)
    seed = env.problem_seeds("train", 1)[0]
    tokenizer = tokenizer_of(cfg)
    try:
        steps = len(demonstration_segment(env, tokenizer, seed, env.demonstration(seed)).tokens) - 1
    except ValueError:  # an env without demonstrations (an OpenEnv server): its prompt and one whole turn
        steps = len(tokenizer.conversation_ids([("user", env.reset(seed))])) + cfg.sampling.max_tokens - 1
    return {"grpo_loss": ({"B": rows, "T": steps}, trainer_threads)}


def rests_on(cfg: AgentRunConfig) -> dict[str, str]:
    """A LoRA run on a model from files rests on those files (its versions hold only the adapters): their digest.
    A built model is rebuilt from the config's seed, and a full fine-tune's versions hold every weight."""
    if cfg.model.lora_rank is None or cfg.model.path is None:
        return {}
    return {"model.path": f"{cfg.model.path} {model_digest(cfg.model.path)}"}


def counters(cfg: AgentRunConfig, experience: list[str], parent_meta: dict[str, Any] | None) -> dict[str, Any]:
    """Tokens generated, episodes played and train problems used so far (the dataset's position: iteration i plays
    problems [i * P, (i + 1) * P)), and the lineage: the trajectories this version's update consumed (paths under
    the run's folder) and the policy versions that generated them."""
    from rl_core.data import read_tensors

    tokens = episodes = 0
    generated_by: set[int] = set()
    for uri in experience:
        arrays, _ = read_tensors(uri)
        tokens += int(arrays["loss_mask"].sum())
        episodes += len(arrays["rewards"])
        generated_by.update(int(v) for v in arrays["versions"])
    root = RunLayout(cfg.run_url).run_url.rstrip("/") + "/"
    before = parent_meta or {"tokens_generated": 0, "episodes": 0, "train_problems_used": 0}
    problems = 0 if parent_meta is None else cfg.algorithm.prompts_per_iteration
    return {"tokens_generated": before["tokens_generated"] + tokens, "episodes": before["episodes"] + episodes,
            "train_problems_used": before["train_problems_used"] + problems,
            "trajectories": [uri.removeprefix(root) for uri in experience],
            "generated_by_versions": sorted(generated_by), "rng": RNG_SCHEME, "generator": cfg.generator,
            "bit_reproducible": cfg.generator == "torch", **({"rests_on": base} if (base := rests_on(cfg)) else {})}


register_algorithm(Algorithm(
    name="grpo",
    learner=GRPOLearner,
    policy=lambda cfg, spaces: LMPolicy.build(cfg),
    score=score,
    hot_ops=hot_ops,
    counters=counters,
    warm_start=True,
    uses_spaces=False,
    check=check_agent_run,
    rests_on=rests_on,
    behaviour_version=behaviour_version,
    rollouts=Rollouts(chunks=num_chunks, check=check_iteration_fits, chunk=rollout_chunk, metrics=iteration_metrics,
                      evaluate=evaluate_heldout),
))
