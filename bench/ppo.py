"""PPO against stable-baselines3 at the same env-step budget: speed, final return, orchestration overhead.

Systems, per task and seed, run one after another (so they get the machine alike):

- ``direct``: gymflow's PPO through ``rl_core`` in one process (``rl_core.algos.ppo.in_process``);
- ``direct_overlap``: the same with ``overlap`` (iteration i+1 collects on a thread while iteration i trains,
  one update stale);
- ``flow``: the same configuration as ``direct`` through the Prefect flow (``python -m flows.tooling.cli train`` in a
  subprocess: Prefect, Ray env workers, a torch.distributed train shard, a delta checkpoint every iteration),
  with one trainer rank: it computes ``direct``'s weights bit for bit, so their wall times compare the same work
  (two ranks on two cores are slower here: per-step framework overhead does not shrink with the minibatch, and
  every step adds an all-reduce);
- ``flow_overlap``: the flow with ``--overlap`` (simulate(i+1) on the env workers while train_shard(i) runs);
- ``sb3``: stable-baselines3 PPO on gymnasium's v5 env with the same hyper-parameters where SB3 has them, at its
  best configuration here: before the timed runs each of DummyVecEnv and SubprocVecEnv with 1 and 2 torch threads
  trains ``--sb3-probe-steps`` steps and the fastest is used (printed, and in the JSON as ``sb3_setup_<task>``)
  (64 envs, 128 steps each, minibatch 512, 10 epochs, lr 3e-4 annealed to 0, gamma 0.99,
  GAE 0.95, clip 0.2, value coef 0.5, max grad norm 0.5, 64x64 tanh actor and critic, log-std 0, orthogonal
  init, VecNormalize for observations and rewards).

Env steps/s = env steps / wall time of training (collection + updates; for the flow, the whole command's wall time:
the interpreter and its imports, Prefect's temporary API, Ray and the actors starting, the flow run with its
checkpoints and final evaluation, the exit; the direct run's imports are not counted, a handicap for the flow; SB3's
time includes its envs' start). ``checkpoint_wait_fraction``: the share of the flow's iterations the loop waited for
checkpoint_diff (the task's bookkeeping included), from the run's own records. ``startup_s``: the flow command's
start-up, from its process's start (the interpreter and every import included) to its first iteration's start
(the command's own figure; the slowest task's mean in the JSON). ``flow_run_overhead`` counts the flow
run alone (the API already up, Ray started before it or inside it). Before the timed runs of a task, one untimed
iteration of each gymflow system tunes the kernels it dispatches (a one-off per machine, cached: without it the
first timed run would pay it and later ones not). Orchestration overhead = the flow's wall time / the direct run's
(training + final evaluation), sequential and overlapped alike. It has two parts: ``flow_fixed_s``, the seconds the
flow command spends outside its iterations after the first (Prefect's temporary API, Ray and the actors starting,
checkpoint_init, the first iteration with the actors' warm-up, the final evaluation) beyond those the direct run
spends outside its own (envs, tuning lookup, first iteration, evaluation); and ``flow_iteration_overhead``, the wall
time of the flow's iterations after the first / the direct run's (Prefect's task runs, the store round trips, a
committed version per iteration). Final return = mean of ``EVAL_EPISODES`` deterministic episodes. gymflow's
processes use one torch thread each. Last line: one JSON object; its un-suffixed keys are the default (sequential)
configuration, ``*_overlap`` keys the overlapped.

Run: ``python bench/ppo.py [--budget 300000] [--seeds 0,1,2] [--tasks HalfCheetah-v5,Hopper-v5] [--systems ...]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead, as for
# `python -m`, so the benchmark imports what the command line imports (examples/ included).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.intervals import compare  # noqa: E402
from rl_core.algos.ppo.in_process import train_in_process  # noqa: E402
from rl_core.config.control import ControlRunConfig  # noqa: E402
from rl_core.config.presets import build_control_config  # noqa: E402
from rl_core.private_temp import use_private_temp_dir  # noqa: E402
from rl_core.reporting.metric_sinks import read_metrics  # noqa: E402

EVAL_EPISODES = 10


def config(task: str, seed: int, budget: int, store: str, overlap: bool) -> ControlRunConfig:
    """The quick preset's shapes with as many iterations as the budget allows, one trainer rank."""
    batch = build_control_config("quick", run_name="probe", env=task).batch_size
    return build_control_config("quick", run_name=f"bench-{task}-s{seed}{'-overlap' * overlap}", env=task, seed=seed,
                        num_ranks=1, overlap=overlap,
                        iterations=max(1, budget // batch), eval_episodes=EVAL_EPISODES, store=store)


def run_direct(cfg: ControlRunConfig) -> dict[str, Any]:
    result = train_in_process(cfg)
    return {"env_steps": result.env_steps, "train_s": result.train_s, "wall_s": result.wall_s,
            "loop_s": result.loop_s, "first_iteration_s": result.first_iteration_s,
            "final_return": result.evaluation["final_return"]}


def checkpoint_wait_fraction(run_url: str) -> float:
    """The share of the flow's iterations the loop spent waiting for checkpoint_diff (the task's bookkeeping
    included), from the run's own per-iteration records."""
    records = read_metrics(run_url)
    return sum(r.get("checkpoint_s", 0.0) for r in records) / sum(r["iteration_s"] for r in records)


def run_flow(cfg: ControlRunConfig) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "quick", "--env", cfg.env.name, "--seed",
           str(cfg.seed), "--iterations", str(cfg.iterations), "--eval-episodes", str(cfg.eval_episodes),
           "--run-name", cfg.run_name, "--store", cfg.storage.url, "--num-ranks", str(cfg.num_ranks)]
    if cfg.overlap:
        cmd.append("--overlap")
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    cmd_s = time.perf_counter() - start  # the whole command: interpreter, imports, Prefect, Ray, the run, exit
    line = json.loads(done.stdout.strip().splitlines()[-1])
    return {"env_steps": line["env_steps"], "train_s": cmd_s, "wall_s": cmd_s, "command_s": line["command_s"],
            "flow_run_s": line["wall_s"], "loop_s": line["loop_s"], "first_iteration_s": line["first_iteration_s"],
            "cmd_s": cmd_s, "startup_s": line["startup_s"], "final_return": line["final_return"],
            "checkpoint_wait_fraction": checkpoint_wait_fraction(line["run_dir"])}


SB3_SETUPS = [(vec, threads) for vec in ("DummyVecEnv", "SubprocVecEnv") for threads in (1, 2)]
"""SB3's configurations on this machine: physics in the learner's process (DummyVecEnv) or one process per env
(SubprocVecEnv, as SB3 runs it), with one or two torch threads."""


def run_sb3(cfg: ControlRunConfig, setup: tuple[str, int] = ("DummyVecEnv", 1)) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    vec, threads = setup
    p = cfg.algorithm
    n_envs = cfg.env.num_envs
    torch.set_num_threads(threads)
    start = time.perf_counter()
    vec_env_cls = {"DummyVecEnv": DummyVecEnv, "SubprocVecEnv": SubprocVecEnv}[vec]
    venv = VecNormalize(make_vec_env(cfg.env.name, n_envs=n_envs, seed=cfg.seed, vec_env_cls=vec_env_cls),
                        gamma=p.gamma)
    model = PPO(
        "MlpPolicy", venv, n_steps=cfg.env.rollout_steps, batch_size=p.minibatch_size, n_epochs=p.update_epochs,
        learning_rate=lambda remaining: p.learning_rate * remaining, gamma=p.gamma, gae_lambda=p.gae_lambda,
        clip_range=p.clip_coef, ent_coef=p.ent_coef, vf_coef=p.vf_coef, max_grad_norm=p.max_grad_norm,
        policy_kwargs={"net_arch": {"pi": list(p.hidden), "vf": list(p.hidden)}, "activation_fn": torch.nn.Tanh,
                       "log_std_init": p.log_std_init},
        seed=cfg.seed, device="cpu", verbose=0,
    )
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's own would leave an empty /tmp/SB3-<time> a run
    steps = cfg.iterations * cfg.batch_size
    model.learn(total_timesteps=steps)
    train_s = time.perf_counter() - start  # the envs' start (SubprocVecEnv's processes) included
    eval_env = VecNormalize(make_vec_env(cfg.env.name, n_envs=1, seed=cfg.seed + 10_000, vec_env_cls=DummyVecEnv),
                            training=False, norm_reward=False)
    eval_env.obs_rms = venv.obs_rms
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=cfg.eval_episodes, deterministic=True)
    venv.close()
    torch.set_num_threads(1)
    return {"env_steps": steps, "train_s": train_s, "wall_s": time.perf_counter() - start,
            "final_return": float(mean), "setup": f"{vec}, {threads} torch thread{'s' * (threads > 1)}"}


def fastest_sb3_setup(task: str, budget: int) -> tuple[str, int]:
    """Each SB3 setup trains `budget` steps of `task` (seed 0); the fastest is the one every timed run uses."""
    timings = {}
    for setup in SB3_SETUPS:
        cfg = config(task, 0, budget, "memory://unused", overlap=False)
        timings[setup] = run_sb3(cfg.model_copy(update={"eval_episodes": 1}), setup)["train_s"]
        print(f"{task:<16} sb3 probe {setup[0]}, {setup[1]} torch thread(s): {budget / timings[setup]:7.0f} steps/s",
              flush=True)
    best = min(timings, key=timings.get)
    print(f"{task:<16} sb3 runs as {best[0]} with {best[1]} torch thread(s), its fastest here", flush=True)
    return best


SYSTEMS = {"direct": run_direct, "direct_overlap": run_direct, "flow": run_flow, "flow_overlap": run_flow,
           "sb3": run_sb3}


def warm_up(task: str, systems: list[str], store: str) -> None:
    """One untimed iteration of each gymflow system on `task`: the kernels get tuned (once per machine and library
    versions, then cached) and files get cached before any timed run, so seed 0 does not pay for what later
    seeds find done. What that took is printed."""
    start = time.perf_counter()
    for name in {s.removesuffix("_overlap") for s in systems} - {"sb3"}:
        cfg = config(task, 0, 1, store, overlap=False)
        SYSTEMS[name](cfg.model_copy(update={"eval_episodes": 1, "run_name": f"{cfg.run_name}-{name}-warm-up"}))
    print(f"{task:<16} warm-up (kernel tuning on a fresh machine, file caches): {time.perf_counter() - start:.1f} s",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=300_000, help="env steps per run (default 300k; try 1M)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tasks", default="HalfCheetah-v5,Hopper-v5")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--results", type=Path, help="also write every run's figures here (JSON), for later analysis")
    parser.add_argument("--sb3-probe-steps", type=int, default=3 * 8192,
                        help="env steps each SB3 setup trains to pick the fastest (default 3 iterations)")
    args = parser.parse_args()
    use_private_temp_dir("gymflow-bench-ppo-")  # removed at exit, after a failure or SIGTERM too
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    systems = args.systems.split(",")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks.split(","):
            warm_up(task, systems, f"file://{tmp}/warm-up")
            sb3_setup = fastest_sb3_setup(task, args.sb3_probe_steps) if "sb3" in systems else None
            for seed in seeds:
                for name in systems:
                    cfg = config(task, seed, args.budget, f"file://{tmp}/runs", name.endswith("_overlap"))
                    r = run_sb3(cfg, sb3_setup) if name == "sb3" else SYSTEMS[name](cfg)
                    r["sps"] = r["env_steps"] / r["train_s"]
                    results.setdefault(task, {}).setdefault(name, []).append(r)
                    print(f"{task:<16} seed {seed} {name:<14} {r['env_steps']:>8} steps in {r['train_s']:7.1f} s = "
                          f"{r['sps']:7.0f} steps/s, final return {r['final_return']:8.1f}"
                          + (f" (whole command {r['cmd_s']:.1f} s)" if "cmd_s" in r else ""), flush=True)
    summary: dict[str, Any] = {"budget": args.budget, "seeds": seeds}
    for task, by_system in results.items():
        key = task.split("-")[0].lower()
        figures = ("sps", "final_return", "wall_s", "flow_run_s", "loop_s", "first_iteration_s",
                   "checkpoint_wait_fraction", "startup_s")
        mean = {n: {k: statistics.mean(r[k] for r in rs) for k in figures if k in rs[0]} for n, rs in by_system.items()}
        for n, m in mean.items():
            print(f"{task:<16} {n:<14} mean {m['sps']:7.0f} steps/s, final return {m['final_return']:8.1f} "
                  f"(std {np.std([r['final_return'] for r in by_system[n]]):.1f})")
        for suffix in ("", "_overlap"):
            direct, flow = mean.get("direct" + suffix), mean.get("flow" + suffix)
            if "sb3" in mean:
                if direct:
                    summary[f"sps_vs_sb3_{key}{suffix}"] = round(direct["sps"] / mean["sb3"]["sps"], 3)
                if flow:
                    summary[f"flow_sps_vs_sb3_{key}{suffix}"] = round(flow["sps"] / mean["sb3"]["sps"], 3)
            if direct or flow:
                summary[f"return_gymflow_{key}{suffix}"] = round((direct or flow)["final_return"], 1)
            if direct and flow:
                summary[f"flow_overhead_{key}{suffix}"] = round(flow["wall_s"] / direct["wall_s"], 3)
                summary[f"flow_run_overhead_{key}{suffix}"] = round(flow["flow_run_s"] / direct["wall_s"], 3)
                # The first iteration pays one-off costs (the actors' first collection and update, a fresh process's
                # optimizer); it counts as start-up, the iterations after it as the steady state.
                steady = {n: m["loop_s"] - m["first_iteration_s"] for n, m in (("flow", flow), ("direct", direct))}
                fixed = (flow["wall_s"] - steady["flow"]) - (direct["wall_s"] - steady["direct"])
                summary[f"flow_fixed_s_{key}{suffix}"] = round(fixed, 2)
                ratio = steady["flow"] / steady["direct"] if steady["direct"] > 0 else None
                summary[f"flow_iteration_overhead_{key}{suffix}"] = round(ratio, 3) if ratio else None
                print(f"{task:<16} flow{suffix} over direct{suffix}: {fixed:.1f} s more outside the iterations after "
                      f"the first (5% of the direct run is {0.05 * direct['wall_s']:.1f} s); those iterations "
                      + (f"{ratio:.2f}x as long" if ratio else "(none: one iteration)"))
        if "sb3" in mean:
            summary[f"return_sb3_{key}"] = round(mean["sb3"]["final_return"], 1)
            summary[f"sb3_setup_{key}"] = by_system["sb3"][0]["setup"]
        for suffix in ("", "_overlap"):
            if "flow" + suffix in mean:
                summary[f"checkpoint_wait_fraction_{key}{suffix}"] = round(
                    mean["flow" + suffix]["checkpoint_wait_fraction"], 4)
                summary[f"startup_s_{key}{suffix}"] = round(mean["flow" + suffix]["startup_s"], 2)
    for suffix in ("", "_overlap"):
        overheads = [v for k, v in summary.items() if k.startswith("flow_overhead_") and k.endswith(suffix)
                     and (suffix or not k.endswith("_overlap"))]
        summary[f"flow_overhead{suffix}"] = round(max(overheads), 3) if overheads else None
    startups = [v for k, v in summary.items() if k.startswith("startup_s_")]
    summary["startup_s"] = max(startups) if startups else None  # the slowest task's, against the 10 s target
    # final returns over the seeds: mean and IQM with bootstrap 95% intervals, and what they allow one to claim
    for name, value in compare(results).items():
        summary[name] = value
        print(f"{name}: {value}")
    summary["cpu_count"] = os.cpu_count()
    if args.results:
        args.results.write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
