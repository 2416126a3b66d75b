"""stable-baselines3's PPO on `GymflowVecEnv` against SB3's PPO on its fastest stock VecEnv: what the drop-in buys.

Both systems train stable-baselines3's PPO, one after the other, with the same hyper-parameters (the task's gymflow
preset, mapped onto SB3's PPO as bench/ppo.py's ``sb3`` system maps it: 128 steps per env, minibatch 512, 10 epochs,
lr 3e-4 annealed to 0, gamma 0.99, GAE 0.95, clip 0.2, value coef 0.5, max grad norm 0.5, 64x64 tanh actor and
critic, log-std 0), the same number of envs (``--n-envs``, default the preset's 64) and the same seed, with
VecNormalize (observations and rewards) over VecMonitor, and ``--torch-threads`` torch threads (default 1: SB3's
faster setting here at this size; and 2 torch threads beside gymflow's 2 stepping threads oversubscribe 2 cores):

- ``stock``: gymnasium's own env (``gymnasium.make(task)``) in SB3's ``DummyVecEnv`` (every env in the learner's
  process) or ``SubprocVecEnv`` (one process per env, started by fork, the quickest of SB3's start methods to start
  64 processes); before the timed run each trains ``--probe-steps`` steps and the faster is used (printed, and in the
  JSON as ``stock_vec_env``);
- ``gymflow``: ``GymflowVecEnv`` (rl_core/envs/sb3.py), every env in one ``BatchedMujocoEnv`` in the learner's
  process, stepped on ``--nthread`` native threads (default 2, one per core here; DummyVecEnv steps its envs on one
  core and SubprocVecEnv, which could use both, is slower here).

Env steps/s = the env steps PPO took (whole rollouts, so at least ``--steps``) / the wall time from making the envs to
the end of ``learn`` (SubprocVecEnv's processes starting included); collection steps/s = the same steps / the time
PPO spent collecting rollouts (policy forward passes and env steps, not the updates), where the VecEnv matters most.
Final return = the mean undiscounted return of ``EVAL_EPISODES`` deterministic episodes of the final policy on
gymnasium's own env (the run's observation normalization, raw rewards), for both systems: an evaluation, not the
training episodes (a short run ends none: 64 envs with 1000-step episodes). Speed-up = gymflow's env steps/s /
stock's (and the same ratio for collection).

Run: ``python bench/sb3_dropin.py [--steps 300000] [--task HalfCheetah-v5] [--seed 0]``. Last line: one JSON object
(``sps_stock``, ``sps_gymflow``, ``speedup``, ``return_stock``, ``return_gymflow``, ``stock_vec_env``, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium
import torch

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead, as for
# `python -m`, so the benchmark imports what the command line imports.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.logger import Logger  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecMonitor, VecNormalize  # noqa: E402

from rl_core.config.control import PPOConfig  # noqa: E402
from rl_core.config.presets import build_control_config  # noqa: E402
from rl_core.envs.sb3 import GymflowVecEnv  # noqa: E402
from rl_core.private_temp import use_private_temp_dir  # noqa: E402

EVAL_EPISODES = 10
STOCK_VEC_ENVS = {"DummyVecEnv": DummyVecEnv, "SubprocVecEnv": partial(SubprocVecEnv, start_method="fork")}


class CollectionClock(BaseCallback):
    """Seconds PPO spends collecting rollouts (from each rollout's start to its end), apart from its updates."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self._started = 0.0

    def _on_rollout_start(self) -> None:
        self._started = time.perf_counter()

    def _on_rollout_end(self) -> None:
        self.seconds += time.perf_counter() - self._started

    def _on_step(self) -> bool:
        return True


def stock_envs(vec_env_cls: Callable[[list], VecEnv], task: str, n_envs: int) -> VecEnv:
    """`n_envs` of gymnasium's own `task` in SB3's `vec_env_cls`."""
    return vec_env_cls([partial(gymnasium.make, task) for _ in range(n_envs)])


def train(make_envs: Callable[[], VecEnv], ppo: PPOConfig, n_steps: int, seed: int, steps: int) -> dict[str, Any]:
    """SB3's PPO with `ppo`'s hyper-parameters on the envs `make_envs` makes, for at least `steps` env steps: its env
    steps/s (the envs' start included), its collection steps/s, the trained model and its observation statistics."""
    start = time.perf_counter()
    venv = VecNormalize(VecMonitor(make_envs()), gamma=ppo.gamma)
    model = PPO(
        "MlpPolicy", venv, n_steps=n_steps, batch_size=ppo.minibatch_size, n_epochs=ppo.update_epochs,
        learning_rate=lambda remaining: ppo.learning_rate * remaining, gamma=ppo.gamma, gae_lambda=ppo.gae_lambda,
        clip_range=ppo.clip_coef, ent_coef=ppo.ent_coef, vf_coef=ppo.vf_coef, max_grad_norm=ppo.max_grad_norm,
        policy_kwargs={"net_arch": {"pi": list(ppo.hidden), "vf": list(ppo.hidden)}, "activation_fn": torch.nn.Tanh,
                       "log_std_init": ppo.log_std_init},
        seed=seed, device="cpu", verbose=0,
    )
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's own would leave an empty /tmp/SB3-<time> a run
    clock = CollectionClock()
    model.learn(total_timesteps=steps, callback=clock)
    wall_s = time.perf_counter() - start
    venv.close()
    return {"env_steps": model.num_timesteps, "wall_s": wall_s, "sps": model.num_timesteps / wall_s,
            "collect_sps": model.num_timesteps / clock.seconds, "model": model, "obs_rms": venv.obs_rms}


def evaluate(run: dict[str, Any], task: str, seed: int) -> float:
    """Mean return of `EVAL_EPISODES` deterministic episodes of `run`'s final policy on gymnasium's own `task`."""
    eval_env = VecNormalize(make_vec_env(task, n_envs=1, seed=seed + 10_000, vec_env_cls=DummyVecEnv),
                            training=False, norm_reward=False)
    eval_env.obs_rms = run["obs_rms"]
    mean, _ = evaluate_policy(run["model"], eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
    eval_env.close()
    return float(mean)


def fastest_stock_vec_env(task: str, n_envs: int, ppo: PPOConfig, n_steps: int, seed: int, steps: int) -> str:
    """Each stock VecEnv trains `steps` steps; the name of the faster, which the timed run uses."""
    sps = {}
    for name, cls in STOCK_VEC_ENVS.items():
        sps[name] = train(partial(stock_envs, cls, task, n_envs), ppo, n_steps, seed, steps)["sps"]
        print(f"probe  stock {name:<14} {sps[name]:7.0f} steps/s", flush=True)
    best = max(sps, key=sps.get)
    print(f"stock runs as {best}, the faster here", flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300_000, help="env steps per run (default 300k)")
    parser.add_argument("--task", default="HalfCheetah-v5", help="a gymflow task that gymnasium also has")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-envs", type=int, help="envs of both systems (default: the preset's)")
    parser.add_argument("--nthread", type=int, default=2, help="GymflowVecEnv's native threads (default 2)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads of both learners (default 1)")
    parser.add_argument("--probe-steps", type=int,
                        help="env steps each stock VecEnv trains to pick the faster (default 3 PPO iterations)")
    args = parser.parse_args()
    use_private_temp_dir("gymflow-bench-sb3-dropin-")  # removed at exit, after a failure or SIGTERM too
    torch.set_num_threads(args.torch_threads)
    cfg = build_control_config("quick", run_name="sb3-dropin", env=args.task, seed=args.seed)
    ppo, n_steps, n_envs = cfg.algorithm, cfg.env.rollout_steps, args.n_envs or cfg.env.num_envs
    probe_steps = args.probe_steps or 3 * n_envs * n_steps
    stock_name = fastest_stock_vec_env(args.task, n_envs, ppo, n_steps, args.seed, probe_steps)
    systems = {
        "stock": partial(stock_envs, STOCK_VEC_ENVS[stock_name], args.task, n_envs),
        "gymflow": partial(GymflowVecEnv, args.task, n_envs, nthread=args.nthread),
    }
    results = {}
    for name, make_envs in systems.items():
        run = train(make_envs, ppo, n_steps, args.seed, args.steps)
        run["final_return"] = evaluate(run, args.task, args.seed)
        results[name] = run
        label = f"{name} ({stock_name})" if name == "stock" else f"{name} (GymflowVecEnv, nthread {args.nthread})"
        print(f"{label:<34} {run['env_steps']:>8} steps in {run['wall_s']:6.1f} s = {run['sps']:6.0f} steps/s "
              f"(collection {run['collect_sps']:6.0f} steps/s), final return {run['final_return']:7.1f} "
              f"(mean of {EVAL_EPISODES} evaluation episodes)", flush=True)
    speedup = results["gymflow"]["sps"] / results["stock"]["sps"]
    collect_speedup = results["gymflow"]["collect_sps"] / results["stock"]["collect_sps"]
    print(f"speed-up: GymflowVecEnv {speedup:.2f}x the env steps/s of SB3's {stock_name} "
          f"({collect_speedup:.2f}x in collection)")
    print(json.dumps({
        "task": args.task, "steps": args.steps, "n_envs": n_envs, "seed": args.seed, "stock_vec_env": stock_name,
        "nthread": args.nthread, "sps_stock": round(results["stock"]["sps"], 1),
        "sps_gymflow": round(results["gymflow"]["sps"], 1), "speedup": round(speedup, 3),
        "collect_sps_stock": round(results["stock"]["collect_sps"], 1),
        "collect_sps_gymflow": round(results["gymflow"]["collect_sps"], 1),
        "collect_speedup": round(collect_speedup, 3),
        "return_stock": round(results["stock"]["final_return"], 1),
        "return_gymflow": round(results["gymflow"]["final_return"], 1), "cpu_count": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
