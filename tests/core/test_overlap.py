"""Overlap: collecting iteration i+1 during iteration i's update, with the policy from before that update."""
from __future__ import annotations

import pytest
import torch

from rl_core.algos.ppo.collect import acting_version
from rl_core.algos.ppo.in_process import train_in_process
from rl_core.config.presets import build_control_config
from tests.fingerprint import fingerprint_key
from tests.pinned_runs import SPLIT_BITS_RECORDED_ON


def test_acting_version_is_one_update_stale_with_overlap_only() -> None:
    sequential = build_control_config("tiny", run_name="seq")
    overlapped = build_control_config("tiny", run_name="ovl", overlap=True)
    assert [acting_version(sequential, v) for v in range(4)] == [0, 1, 2, 3]
    assert [acting_version(overlapped, v) for v in range(4)] == [0, 0, 1, 2]


def test_overlap_changes_the_math_but_stays_reproducible(monkeypatch) -> None:
    """The collector thread's timing never reaches the result: two overlapped runs agree bit for bit, and they
    differ from the sequential run (whose collections act with the fresh policy).

    Reference kernels: the first update is the same in both only if decoupled PPO's recomputed log-probs equal the
    rollout's bit for bit, i.e. the update's forward pass matches the rollout's. A tuned forward kernel agrees with
    torch's to ~1e-6, which changes a few log-probs in the last bit."""
    monkeypatch.setenv("GYMFLOW_KERNELS", "reference")
    torch.manual_seed(0)  # nothing may depend on the global generator; set it to show it does not matter
    runs = [train_in_process(build_control_config("tiny", run_name="r", seed=3, num_ranks=1, iterations=3, overlap=o))
            for o in (True, True, False)]
    assert runs[0].policy_sha256 == runs[1].policy_sha256
    assert runs[0].policy_sha256 != runs[2].policy_sha256
    # Iteration 0 collects with version 0 either way; the update of iteration 0 is the same in both.
    update_metrics = [{k: v for k, v in run.iterations[0].items() if k != "mean_return"} for run in runs]
    if fingerprint_key() in SPLIT_BITS_RECORDED_ON:  # rollouts' rows (4 a call) round as minibatches' (32) do
        assert update_metrics[0] == update_metrics[2]  # (mean_return is NaN: tiny episodes never finish)
    else:  # elsewhere the last bits may differ (MKL_CBWR=COMPATIBLE: policy_loss by 4.6e-7 relative; acting one
        # version apart, as iteration 1 does, moves it by 1.8)
        assert update_metrics[0] == pytest.approx(update_metrics[2], rel=1e-4)


def test_decoupled_batch_clips_against_the_current_policy_and_weights_by_behaviour() -> None:
    """Proximal log-probs replace the behaviour ones; weights are proximal/behaviour probability, at most 1."""
    from rl_core.algos.base import Spaces
    from rl_core.algos.ppo.learner import PPOPolicy
    from rl_core.algos.ppo.update import RolloutBatch, decoupled
    from rl_core.config.control import PPOConfig

    model = PPOPolicy(Spaces(5, 2), PPOConfig(), seed=0).model
    gen = torch.Generator().manual_seed(0)
    obs, actions = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
    with torch.no_grad():
        current = model.distribution(obs).log_prob(actions).sum(-1)
    shift = torch.tensor([0.0, 0.5, -0.5, 2.0, -2.0, 0.0])  # behaviour log-prob - current log-prob
    zeros = torch.zeros(6)
    batch = decoupled(model, RolloutBatch(obs, actions, current + shift, zeros, torch.ones(6), zeros))
    assert torch.allclose(batch.logprobs, current)
    expected = torch.exp(-shift).clamp(max=1.0)  # behaviour less likely than now: truncated at 1
    assert torch.allclose(batch.advantage_weights, expected)
    assert torch.equal(batch.advantages, torch.ones(6))  # weights are applied per minibatch, after normalization



def test_gae_runs_at_the_thread_count_it_was_tuned_at_whatever_the_process_runs(monkeypatch) -> None:
    """The score step runs in the flow's own process, whose torch thread count is its own (the machine's cores, or
    what a library left): GAE's tuned winner is looked up by the calling thread count, so the step keeps to
    SCORE_THREADS, the count `hot_ops` tunes it at, and every entry point picks the same implementation."""
    import numpy as np

    from rl_core.algos.hot_ops import hot_ops
    from rl_core.algos.ppo import advantages, learner
    from rl_core.algos.ppo.collect import collect_rollout
    from rl_core.config.threads import SCORE_THREADS
    from rl_core.envs import make_batch
    from rl_core.policies.mlp import ActorCritic
    from rl_core.policies.normalizer import ObservationNormalizer
    from rl_core.seeding import action_noise

    cfg = build_control_config("tiny", run_name="threads")
    env = make_batch("HalfCheetah-v5", 4, 0)
    noise = action_noise(0, 0, 0, env.num_envs, 8, env.action_dim)
    experience, _ = collect_rollout(env, ActorCritic(env.obs_dim, env.action_dim), ObservationNormalizer(env.obs_dim),
                                    8, 0.99, np.zeros(env.num_envs), noise)
    seen = []
    real = advantages._gae
    monkeypatch.setattr(advantages, "_gae", lambda *a: (seen.append(torch.get_num_threads()), real(*a))[1])
    previous = torch.get_num_threads()
    torch.set_num_threads(SCORE_THREADS + 1)
    try:
        learner.score(cfg, [experience.to_arrays()], [{"reward_scale": 1.0}])
        assert torch.get_num_threads() == SCORE_THREADS + 1  # the process's count, restored
    finally:
        torch.set_num_threads(previous)
    assert seen == [SCORE_THREADS] and hot_ops(cfg)["gae"][1] == SCORE_THREADS
