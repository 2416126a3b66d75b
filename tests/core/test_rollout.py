"""A rollout's actions and log-probs are torch's Normal arithmetic, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_core.algos.ppo.collect import collect_rollout
from rl_core.envs import make_batch
from rl_core.policies.mlp import ActorCritic
from rl_core.policies.normalizer import ObservationNormalizer
from rl_core.seeding import action_noise


@pytest.mark.parametrize("env_name", ["HalfCheetah-v5", "Hopper-v5", "Ant-v5"])
def test_actions_and_logprobs_are_the_normal_distributions_bits(env_name: str, monkeypatch) -> None:
    """The rollout computes actions step by step in numpy and the log-probs once per rollout: both must equal what
    `Normal(mean, std)` gives from the policy's own forward pass on the stored observations (decoupled PPO
    recomputes them that way and relies on equality). Several action widths, so torch's summation order over the
    action dimension is exercised, not only a single element."""
    monkeypatch.setenv("GYMFLOW_KERNELS", "reference")  # the forward pass the update's recomputation uses
    env = make_batch(env_name, 8, 0, 0, None, 1)
    torch.manual_seed(0)
    model = ActorCritic(env.obs_dim, env.action_dim)
    with torch.no_grad():
        model.log_std.uniform_(-1.0, 0.5)  # distinct per-dimension spreads
    norm = ObservationNormalizer(env.obs_dim)
    steps = 24
    noise = action_noise(0, 0, 0, env.num_envs, steps, env.action_dim)
    experience, _ = collect_rollout(env, model, norm, steps, 0.99, np.zeros(env.num_envs), noise)

    for t in range(steps):  # step by step, as the rollout's forward pass ran (a GEMM's bits may depend on its rows)
        with torch.no_grad():
            distribution = model.distribution(torch.from_numpy(experience.obs[t]))
            expected_actions = distribution.mean + distribution.stddev * noise[t]
            expected_logprobs = distribution.log_prob(torch.from_numpy(experience.actions[t])).sum(-1)
        assert np.array_equal(experience.actions[t], expected_actions.numpy()), t
        assert np.array_equal(experience.logprobs[t], expected_logprobs.numpy()), t
