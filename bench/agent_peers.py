"""GRPO on an agent env against TRL's GRPOTrainer, side by side: seconds per step, episodes/s, start-up and held-out
accuracy after the same episodes, full fine-tune and LoRA.

One run on one machine, both sides on the same model (SmolLM2-135M-Instruct, its GGUF dequantized once to a float32
Hugging Face directory), the same env and problems (step i plays the train split's problems [i * P, (i + 1) * P), the
flow's order), the same rewards (the env's own `step`), group size, completion length, sampling (temperature, top-p
and top-k off), learning rate (constant), GRPO loss and LoRA settings:

- ``gymflow``: ``python -m flows.tooling.cli train-agent`` as a user runs it (Prefect, Ray, the generator actor, a
  trainer rank, a committed checkpoint version every iteration, the final held-out evaluation), no SFT, 2 torch threads
  (``--threads 2``: the generator and the trainer rank take turns, each on both cores). Figures from its JSON line and
  its per-iteration records.
- ``trl``: TRL's GRPOTrainer without vLLM, 2 torch threads, at its fastest configuration here: before the timed runs,
  each value of each of TRL's free choices (generation batching, gradient checkpointing, the KV cache, torch.compile)
  trains ``--probe-steps`` steps, one axis at a time on top of the values kept, and the fastest is used (printed, and
  in the JSON as ``trl_config``). How each setting maps onto TRL, and the checks that they match:
  `bench/_agent_peer_trl.py`.

Seconds per step: the steps after the first (the first pays one-off costs on both sides), split as each side allows
(gymflow: rollout, score, train, checkpoint commit; TRL: generation, reward, update). Episodes/s = P x G / seconds per
step. ``startup_s``: from the command's process start to its first step's start (gymflow's own figure; TRL's from its
process's launch). Held-out accuracy: gymflow's evaluation (`evaluate_heldout`) on ``--eval-problems`` held-out
problems, sampled at the training temperature with the flow's evaluation streams, for the flow's final version (the
flow's own final evaluation) and for TRL's trained model (saved, LoRA merged, read by gymflow's loader); TRL's model and
the base model also greedy. ``accuracy_vs_trl``: gymflow's minus TRL's, in points; ``heldout_vs_trl``: per mode, the
bootstrap 95% interval over seeds of that difference and of the held-out mean reward's, with the verdict each allows
(from 2 seeds a side). Ratios are per mode, means over seeds. A warm-up flow run per mode (one iteration, untimed)
tunes gymflow's kernels for the model's shapes first, a one-off per machine, as `bench/ppo.py` does. Last line: one
JSON object.

Run: ``python bench/agent_peers.py [--mode full|lora|both] [--steps 20] [--seeds 1] [--env rg:basic_arithmetic]``;
``--quick`` smoke-tests both sides in minutes (2 steps, 16 held-out problems, one probe axis, no warm-up).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead, as for
# `python -m`, so the benchmark imports what the command line imports.
sys.path[0] = str(Path(__file__).resolve().parents[1])
REPO = Path(__file__).resolve().parents[1]

from bench._agent_peer_task import (  # noqa: E402
    LORA_TARGETS,
    PeerSettings,
    dequantize_gguf,
    heldout_accuracy,
    smollm2_gguf,
)
from bench._agent_peer_trl import PROBE_AXES, TORCH_THREADS, probe_trl, run_trl  # noqa: E402
from rl_core.reporting.intervals import compared  # noqa: E402

QUICK_PROBE_AXES = {"batching": PROBE_AXES["batching"][:2]}
"""The probe of `--quick`: one generate call against two, nothing else."""


def gymflow_command(settings: PeerSettings, model_dir: Path, store: str, run_name: str) -> list[str]:
    """`gymflow train-agent` with `settings`: no SFT, the flow's default GRPO loss, as the TRL side is configured."""
    cmd = [sys.executable, "-m", "flows.tooling.cli", "train-agent", "--model-path", str(model_dir),
           "--env", settings.env, "--iterations", str(settings.steps), "--seed", str(settings.seed),
           "--prompts-per-iteration", str(settings.prompts), "--group-size", str(settings.group_size),
           "--max-tokens", str(settings.max_tokens), "--temperature", str(settings.temperature), "--top-p", "1.0",
           "--top-k", "0", "--learning-rate", str(settings.learning_rate), "--sft-steps", "0",
           "--update-epochs", "1", "--minibatches", "1", "--beta", "0", "--clip-eps", str(settings.clip_eps),
           "--max-grad-norm", str(settings.max_grad_norm), "--scale-std", "--no-token-level", "--max-staleness", "0",
           "--eval-problems", str(settings.eval_problems), "--threads", str(TORCH_THREADS), "--run-name", run_name,
           "--store", store]
    if settings.lora_rank is not None:
        cmd += ["--lora-rank", str(settings.lora_rank), "--lora-alpha", str(settings.lora_alpha),
                "--lora-targets", settings.lora_targets]
    return cmd


def missing_flags(cmd: list[str]) -> list[str]:
    """The flags of `cmd` that this checkout's `train-agent --help` does not list."""
    shown = subprocess.run([sys.executable, "-m", "flows.tooling.cli", "train-agent", "--help"], capture_output=True,
                           text=True, cwd=REPO, check=True).stdout
    return [flag for flag in cmd if flag.startswith("--") and flag not in shown]


def run_gymflow(settings: PeerSettings, model_dir: Path, store: str, run_name: str, timeout_s: float
                ) -> dict[str, Any]:
    """The flow command with `settings`: its start-up, steady seconds per iteration by step, episodes/s and the
    held-out accuracy of its final evaluation (and of version 0, the base model, evaluated alike)."""
    from rl_core.reporting.metric_sinks import read_metrics

    cmd = gymflow_command(settings, model_dir, store, run_name)
    lacking = missing_flags(cmd)
    if lacking:
        raise RuntimeError(f"gymflow's train-agent has no {', '.join(lacking)} in this checkout; the {settings.mode} "
                           "comparison needs them (rerun with --skip-gymflow for TRL's side alone)")
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO, timeout=timeout_s)
    if done.returncode:
        raise RuntimeError(f"gymflow train-agent failed with exit status {done.returncode}:\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-3000:]}")
    line = json.loads(done.stdout.strip().splitlines()[-1])
    records = read_metrics(line["run_dir"])
    steady = records[1:] or records  # the first iteration pays one-off costs (the actors' first calls)
    seconds = sum(r["iteration_s"] for r in steady)
    step_s = {key: sum(r.get(key, 0.0) for r in steady) / len(steady)
              for key in ("iteration_s", "rollout_s", "score_s", "train_s", "checkpoint_s")}
    return {"episodes_per_s": settings.episodes_per_step * len(steady) / seconds, "step_s": step_s,
            "startup_s": line["startup_s"], "command_s": line["command_s"], "accuracy": line["accuracy_final"],
            "accuracy_base": line["accuracy_sft"], "mean_reward": line["mean_reward_final"],
            "mean_reward_base": line["mean_reward_sft"], "iterations": len(records)}


def warm_up_gymflow(settings: PeerSettings, model_dir: Path, store: str, timeout_s: float) -> None:
    """One untimed iteration of the flow with the timed runs' shapes: gymflow's kernels get tuned for them (once per
    machine and library versions, then cached) before any timed run. What that took is printed."""
    started = time.perf_counter()
    run_gymflow(replace(settings, steps=1, eval_problems=1), model_dir, store, f"warm-up-{settings.mode}", timeout_s)
    print(f"{settings.mode:<5} gymflow warm-up (kernel tuning on a fresh machine, file caches): "
          f"{time.perf_counter() - started:.1f} s", flush=True)


def brief(err: BaseException) -> str:
    """An error's first line and its last lines (a subprocess's traceback ends with its cause)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return " | ".join(dict.fromkeys(lines[:1] + lines[-3:]))[:1000]


def mean_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.mean(values) if values else None


def side_summary(runs: list[dict[str, Any]], extra: tuple[str, ...]) -> dict[str, Any]:
    """Means over seeds of one side's figures in one mode."""
    if not runs:
        return {}
    step_keys = runs[0]["step_s"]
    return {"episodes_per_s": round(mean_of(runs, "episodes_per_s"), 3),
            "step_s": {k: round(statistics.mean(r["step_s"][k] for r in runs), 3) for k in step_keys},
            "startup_s": round(mean_of(runs, "startup_s"), 2), "accuracy": round(mean_of(runs, "accuracy"), 4),
            **{k: round(mean_of(runs, k), 4) for k in extra if mean_of(runs, k) is not None},
            "per_seed_episodes_per_s": [round(r["episodes_per_s"], 3) for r in runs]}


def heldout_comparison(gymflow_runs: list[dict[str, Any]], trl_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per held-out figure (accuracy in points, mean reward), gymflow's minus TRL's: the percentile bootstrap 95%
    interval of the difference of means over seeds and the verdict it allows ('not worse' within a margin of 2
    points of accuracy, 0.02 of mean reward); None and 'inconclusive' under 2 seeds a side."""
    out: dict[str, Any] = {"seeds": min(len(gymflow_runs), len(trl_runs))}
    for key, scale, margin in (("accuracy", 100.0, 2.0), ("mean_reward", 1.0, 0.02)):
        ours = [scale * r[key] for r in gymflow_runs]
        theirs = [scale * r[key] for r in trl_runs]
        interval, said = compared(ours, theirs, margin)
        out[key] = {"difference_ci95": [round(v, 4) for v in interval] if interval else None, "verdict": said}
    return out


def compare_mode(settings: PeerSettings, args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    """Probe TRL, then the timed runs of both sides for every seed, in one mode (full fine-tune or LoRA)."""
    mode, store = settings.mode, f"file://{work}/runs"
    gymflow_error = "skipped (--skip-gymflow)" if args.skip_gymflow else None
    if gymflow_error is None and not args.quick:
        try:
            warm_up_gymflow(settings, model_dir, store, args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            gymflow_error = brief(err)
    axes = QUICK_PROBE_AXES if args.quick else PROBE_AXES
    probe_settings = replace(settings, steps=args.probe_steps, eval_problems=1)
    config, probes = probe_trl(probe_settings, model_dir, work / f"trl-{mode}", axes, args.probe_timeout)
    print(f"{mode:<5} trl runs as: {config.describe()}, its fastest here", flush=True)
    if gymflow_error:
        print(f"{mode:<5} gymflow: {gymflow_error}", flush=True)
    gymflow_runs, trl_runs = [], []
    for seed in range(args.seeds):
        seeded = replace(settings, seed=seed)
        if gymflow_error is None:
            try:
                g = run_gymflow(seeded, model_dir, store, f"bench-{mode}-s{seed}", args.timeout)
                gymflow_runs.append(g)
                print(f"{mode:<5} seed {seed} gymflow {g['episodes_per_s']:.2f} episodes/s "
                      f"({g['step_s']['iteration_s']:.2f} s/step), start-up {g['startup_s']:.1f} s, held-out accuracy "
                      f"{g['accuracy']:.3f}, mean reward {g['mean_reward']:.4f}", flush=True)
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                gymflow_error = brief(err)
                print(f"{mode:<5} seed {seed} gymflow failed: {gymflow_error}", flush=True)
        t = run_trl(seeded, config, model_dir, work / f"trl-{mode}" / f"seed-{seed}", True, args.timeout)
        t.update(accuracy=t["heldout"]["accuracy"], accuracy_greedy=t["heldout_greedy"]["accuracy"],
                 mean_reward=t["heldout"]["mean_reward"])
        shutil.rmtree(work / f"trl-{mode}" / f"seed-{seed}" / "model", ignore_errors=True)  # 0.5 GB a run
        trl_runs.append(t)
        print(f"{mode:<5} seed {seed} trl     {t['episodes_per_s']:.2f} episodes/s "
              f"({t['step_s']['step_s']:.2f} s/step), start-up {t['startup_s']:.1f} s, held-out accuracy "
              f"{t['accuracy']:.3f} (greedy {t['accuracy_greedy']:.3f}), mean reward {t['mean_reward']:.4f}",
              flush=True)
    gymflow = side_summary(gymflow_runs, ("accuracy_base", "mean_reward", "mean_reward_base"))
    trl = side_summary(trl_runs, ("accuracy_greedy", "train_accuracy", "mean_reward"))
    return {"gymflow": gymflow, "trl": trl, "trl_config": config.describe(), "trl_probes": probes,
            "gymflow_error": gymflow_error,
            "episodes_per_s_vs_trl": round(gymflow["episodes_per_s"] / trl["episodes_per_s"], 3) if gymflow else None,
            "accuracy_vs_trl": round(100 * (gymflow["accuracy"] - trl["accuracy"]), 2) if gymflow else None,
            "heldout_vs_trl": heldout_comparison(gymflow_runs, trl_runs),
            "checks": {"same_problems": all(r["same_problems"] for r in trl_runs),
                       "same_prompt_ids": all(r["same_prompt_ids"] for r in trl_runs),
                       "trl_torch_threads": trl_runs[0]["torch_threads"],
                       "stop_token_ids": trl_runs[0]["stop_token_ids"]},
            "handicaps": trl_runs[0]["handicaps"], "runs": {"gymflow": gymflow_runs, "trl": trl_runs}}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("trl", "transformers", "peft", "torch", "accelerate")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("full", "lora", "both"), default="both")
    parser.add_argument("--env", default="rg:basic_arithmetic", help="a registered gymflow agent env")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps of each timed run (equal episodes)")
    parser.add_argument("--seeds", type=int, default=1, help="timed runs per side and mode, seeds 0..K-1")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (P)")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--lora-targets", default=LORA_TARGETS)
    parser.add_argument("--eval-problems", type=int, default=200)
    parser.add_argument("--probe-steps", type=int, default=3, help="steps of each TRL probe (the first is not timed)")
    parser.add_argument("--probe-timeout", type=float, default=600.0, help="seconds before a TRL probe counts failed")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a timed run counts failed")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 steps, 16 held-out problems, "
                                                             "one probe axis, no warm-up")
    parser.add_argument("--skip-gymflow", action="store_true", help="TRL's side alone")
    parser.add_argument("--results", type=Path, help="also write every run's figures here (JSON)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.eval_problems, args.probe_steps, args.seeds = 2, 16, 2, 1
    import torch

    torch.set_num_threads(TORCH_THREADS)  # the base model's evaluation here
    modes = ("full", "lora") if args.mode == "both" else (args.mode,)
    base = PeerSettings(env=args.env, steps=args.steps, prompts=args.prompts, group_size=args.group_size,
                        max_tokens=args.max_tokens, temperature=args.temperature, learning_rate=args.learning_rate,
                        lora_rank=None, lora_alpha=args.lora_alpha, lora_targets=args.lora_targets, seed=0,
                        eval_problems=args.eval_problems)
    work = Path(tempfile.mkdtemp(prefix="gymflow-agent-peers-"))
    try:
        started = time.perf_counter()
        model_dir = dequantize_gguf(smollm2_gguf(), work / "smollm2-135m-instruct")
        print(f"model dequantized to float32 in {time.perf_counter() - started:.1f} s", flush=True)
        base_accuracy = {"sampled": heldout_accuracy(model_dir, base, greedy=False)["accuracy"],
                         "greedy": heldout_accuracy(model_dir, base, greedy=True)["accuracy"]}
        print(f"base model held-out accuracy: sampled {base_accuracy['sampled']:.3f}, greedy "
              f"{base_accuracy['greedy']:.3f}", flush=True)
        results = {mode: compare_mode(base if mode == "full" else replace(base, lora_rank=args.lora_rank), args,
                                      model_dir, work) for mode in modes}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary: dict[str, Any] = {
        "episodes_per_s_vs_trl": {m: r["episodes_per_s_vs_trl"] for m, r in results.items()},
        "startup_s": max((r["gymflow"]["startup_s"] for r in results.values() if r["gymflow"]), default=None),
        "accuracy_vs_trl": {m: r["accuracy_vs_trl"] for m, r in results.items()},
        "heldout_vs_trl": {m: r["heldout_vs_trl"] for m, r in results.items()},
        "trl_config": {m: r["trl_config"] for m, r in results.items()},
        "trl_startup_s": max(r["trl"]["startup_s"] for r in results.values()),
        "gymflow": {m: r["gymflow"] for m, r in results.items()},
        "trl": {m: r["trl"] for m, r in results.items()},
        "base_accuracy": base_accuracy,
        "gymflow_error": {m: r["gymflow_error"] for m, r in results.items() if r["gymflow_error"]} or None,
        "checks": {m: r["checks"] for m, r in results.items()},
        "handicaps": sorted({h for r in results.values() for h in r["handicaps"]}),
        "trl_probes": {m: r["trl_probes"] for m, r in results.items()},
        "settings": {**base.to_json(), "lora_rank": args.lora_rank, "seeds": args.seeds, "quick": args.quick},
        "versions": versions(), "cpu_count": os.cpu_count(),
    }
    if args.results:
        args.results.write_text(json.dumps({"summary": summary, "runs": {m: r["runs"] for m, r in results.items()}},
                                           indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
