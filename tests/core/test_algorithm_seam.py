"""The algorithm seam: a second algorithm, registered from outside rl_core, runs through the same runtime.

"Zero-action bandit" is a deliberately small algorithm: its policy acts with a learned constant action, its score
averages rewards, its learner moves the constant. It is registered here (a config section and an `Algorithm`) and
nowhere else, then driven through the env worker, the score task, a trainer rank, the commits and the in-process
loop: none of them needed an edit to run it.
"""
from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from prefect.logging import disable_run_logger
from pydantic import Field

from rl_core.algos import base
from rl_core.algos.base import Algorithm, Spaces, Tensors, UpdateHooks, algorithm_of
from rl_core.algos.ppo.in_process import train_in_process
from rl_core.checkpoint import CheckpointStore
from rl_core.config import common as config
from rl_core.config.common import AlgorithmConfig, ConfigError
from rl_core.config.control import ControlRunConfig
from rl_core.config.presets import build_control_config
from rl_core.data import RunLayout
from rl_core.runtime.commits import commit_initial, commit_iteration
from rl_core.runtime.control.env_worker import EnvWorker
from rl_core.runtime.trainer import TrainerRank
from tasks.score import score


class BanditConfig(AlgorithmConfig):
    name: str = Field("bandit", pattern="^bandit$")
    step_size: float = Field(0.1, gt=0)


class BanditPolicy:
    def __init__(self, spaces: Spaces) -> None:
        self.action = np.zeros(spaces.action_dim, np.float32)

    def state(self) -> Tensors:
        return {"model.action": self.action.copy()}

    def load_state(self, state: Tensors) -> None:
        self.action = state["model.action"].copy()

    def deterministic_action(self, obs: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self.action.astype(np.float64), (obs.shape[0], self.action.size)).copy()


class BanditLearner:
    def __init__(self, run: ControlRunConfig, spaces: Spaces) -> None:
        self.run, self.policy = run, BanditPolicy(spaces)

    def update(self, batch: Tensors, iteration: int, hooks: UpdateHooks = UpdateHooks()) -> dict[str, float]:
        self.policy.action = self.policy.action + np.float32(self.run.algorithm.step_size * batch["mean_reward"])
        return {"mean_reward": float(batch["mean_reward"]), "approx_kl": 0.0}

    def policy_state(self) -> Tensors:
        return self.policy.state()

    def state(self) -> Tensors:
        return self.policy.state()

    def load_state(self, state: Tensors) -> None:
        self.policy.load_state(state)


def _collect(cfg: ControlRunConfig, policy: BanditPolicy, env: Any, carry: Tensors, iteration: int,
             first_env: int) -> tuple[Tensors, dict]:
    rewards = np.stack([env.step(policy.deterministic_action(env.observe())).reward
                        for _ in range(cfg.env.rollout_steps)])
    carry["steps"] += cfg.env.rollout_steps
    return {"rewards": rewards.astype(np.float32)}, {"env_steps": rewards.size, "finished_returns": []}


def _score(cfg: ControlRunConfig, parts: list[Tensors], metas: list[dict]) -> Tensors:
    return {"mean_reward": np.array(np.mean([p["rewards"].mean() for p in parts]), np.float32)}


BANDIT = Algorithm(name="bandit", learner=BanditLearner, policy=lambda cfg, spaces: BanditPolicy(spaces),
                   initial_carry=lambda n: {"steps": np.zeros(n)}, collect=_collect, score=_score,
                   hot_ops=lambda *_: {})


@pytest.fixture
def bandit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered for this test only (the registries are restored after)."""
    monkeypatch.setattr(config, "_ALGORITHM_CONFIGS", dict(config._ALGORITHM_CONFIGS))
    monkeypatch.setattr(base, "_ALGORITHMS", dict(base._ALGORITHMS))
    config.register_algorithm_config(BanditConfig)
    base.register_algorithm(BANDIT)


def _cfg(**options: Any) -> ControlRunConfig:
    return build_control_config("tiny", run_name="bandit", algorithm="bandit", num_ranks=1, num_workers=1,
                        store=f"memory://gymflow-seam-{uuid.uuid4().hex}", **options)


def test_a_registered_algorithm_runs_through_worker_score_rank_and_commits(bandit) -> None:
    cfg = _cfg(hyperparameters={"step_size": 0.5})
    assert algorithm_of(cfg) is BANDIT and cfg.algorithm.step_size == 0.5
    assert ControlRunConfig.model_validate_json(cfg.model_dump_json()) == cfg  # what actors receive round-trips
    rank = TrainerRank(cfg.model_dump_json(), 0, 1)
    commit_initial(cfg, rank.initial_state())
    for iteration in range(2):
        sim = EnvWorker(cfg.model_dump_json(), 0).simulate(iteration, iteration)
        with disable_run_logger():
            score.fn(cfg, "i", iteration, iteration, [sim["uri"]])
        rank.train(iteration, iteration)
        commit_iteration(cfg, iteration, iteration, RunLayout(cfg.run_url).staged_learner(iteration), [sim["uri"]])
    latest = CheckpointStore(RunLayout(cfg.run_url).checkpoints).load()
    assert latest.version == 2 and latest.tensors["env.steps"].tolist() == [32.0] * 4  # the carry, checkpointed
    assert not np.array_equal(latest.tensors["model.action"], np.zeros_like(latest.tensors["model.action"]))


def test_the_in_process_loop_runs_it_and_repeats_exactly(bandit) -> None:
    runs = [train_in_process(_cfg()) for _ in range(2)]
    assert runs[0].policy_sha256 == runs[1].policy_sha256 and len(runs[0].iterations) == 2


def test_unknown_algorithm_and_foreign_fields_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown algorithm 'bandit'; allowed: ppo"):
        build_control_config("tiny", run_name="r", algorithm="bandit")
    with pytest.raises(ConfigError, match="algorithm.step_size"):
        build_control_config("tiny", run_name="r", hyperparameters={"step_size": 0.5})  # not a PPO field
