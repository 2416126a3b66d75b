"""Collect a rollout from a batched env with a frozen Gaussian policy; everything PPO's update needs, per step.

Randomness is counter-based: each env's action noise in an iteration comes from its own generator
(`rl_core.seeding.action_noise`), so a rollout is reproducible from the checkpointed state without saving
generator states, whichever worker steps the env.
"""
from __future__ import annotations

import numpy as np
import torch

from rl_core.algos.ppo.batches import Experience
from rl_core.config.control import ControlRunConfig
from rl_core.envs import BatchedMujocoEnv, GymnasiumBatch
from rl_core.policies.mlp import ActorCritic
from rl_core.policies.normalizer import Moments, ObservationNormalizer


def collect_rollout(
    env: BatchedMujocoEnv | GymnasiumBatch,
    model: ActorCritic,
    norm: ObservationNormalizer,
    steps: int,
    gamma: float,
    discounted_return: np.ndarray,
    noise: torch.Tensor,
) -> tuple[Experience, dict]:
    """Step `env` for `steps` steps; `discounted_return` (N,) is the per-env running return, updated in place;
    `noise` (steps, N, action_dim) is the standard-normal action noise of each step.

    Returns the experience (T, N, ...) and a small summary (finished episode returns, env steps).
    """
    n = env.num_envs
    obs_buf = np.zeros((steps, n, env.obs_dim), np.float32)
    act_buf = np.zeros((steps, n, env.action_dim), np.float32)
    mean_buf = np.zeros((steps, n, env.action_dim), np.float32)
    value_buf = np.zeros((steps, n), np.float32)
    reward_buf = np.zeros((steps, n), np.float32)
    done_buf = np.zeros((steps, n), np.float32)
    trunc_value_buf = np.zeros((steps, n), np.float32)
    raw_obs = np.zeros((steps, n, env.obs_dim), np.float64)
    ret_buf = np.zeros((steps, n), np.float64)
    finished: list[float] = []
    obs = env.observe()
    noise_per_step = noise.numpy()
    with torch.no_grad():
        std = model.log_std.exp()
        std_per_dim = std.numpy()
        mean_and_value = model.mean_and_value_fn(torch.empty(n, env.obs_dim))
        for t in range(steps):
            raw_obs[t] = obs
            x = norm.normalize(obs)
            mean_out, value = mean_and_value(torch.from_numpy(x))
            mean = mean_out.numpy()
            # numpy, not torch, between the policy's forward pass and the env step: the same float32 multiply and
            # add (so the same bits), but a numpy op on a small array keeps the GIL where each torch op releases it
            # and takes it back. With the in-process run's env batches on two threads, each handover lets the other
            # thread in, and those handovers made collecting a rollout markedly slower.
            action = mean + std_per_dim * noise_per_step[t]
            obs_buf[t] = x
            act_buf[t] = action
            mean_buf[t] = mean
            value_buf[t] = value.numpy()
            result = env.step(action.astype(np.float64))
            reward_buf[t] = result.reward
            discounted_return[:] = discounted_return * gamma + result.reward
            ret_buf[t] = discounted_return
            done = result.terminated | result.truncated
            done_buf[t] = done
            if result.truncated.any():  # bootstrap the cut-off tail from the critic (time limit, not failure)
                idx = np.flatnonzero(result.truncated)
                final = torch.from_numpy(norm.normalize(result.final_obs[idx]))
                trunc_value_buf[t, idx] = model.value(final).numpy()
            discounted_return[done] = 0.0
            finished.extend(result.finished_returns.tolist())
            obs = result.obs
        next_value = model.value(torch.from_numpy(norm.normalize(obs))).numpy()
        # Once for the whole rollout, through torch's own Normal: decoupled PPO recomputes these log-probs that way
        # and finds them equal when its forward pass gives the rollout's bits. torch sums each row of the action
        # dimension in the same order whatever rows surround it (not numpy's order: the sum stays in torch).
        behaviour = torch.distributions.Normal(torch.from_numpy(mean_buf), std, validate_args=False)
        logp_buf = behaviour.log_prob(torch.from_numpy(act_buf)).sum(-1).numpy()
    experience = Experience(
        obs=obs_buf, actions=act_buf, logprobs=logp_buf, values=value_buf, rewards=reward_buf, dones=done_buf,
        trunc_values=trunc_value_buf, next_value=next_value.astype(np.float32), obs_moments=Moments.of(raw_obs),
        ret_moments=Moments.of(ret_buf[..., None]),
    )
    return experience, {"finished_returns": finished, "env_steps": steps * n}


def acting_version(cfg: ControlRunConfig, version: int) -> int:
    """The policy version that collects from env version `version`: the same one, or with `cfg.overlap` the one
    before (one update stale), which lets the next collection run while `version` is still being trained."""
    return max(version - 1, 0) if cfg.overlap else version
