"""TRL's side of `bench/agent_peers.py`: TRL's GRPOTrainer (transformers' generate, no vLLM, as a CPU user runs it)
on the same model, problems, rewards and settings as gymflow's flow, timed per step; and the probe that picks TRL's
fastest configuration here.

Each run is a process of its own (`python bench/_agent_peer_trl.py '<json>'`, started by `run_trl`), so its start-up
(the launch to its first step) counts TRL's imports and model load as the flow's `startup_s` counts gymflow's, and a
probe's torch.compile or threads cannot leak into the next run. It prints one JSON object as its last line.

How the flow's settings map onto GRPOConfig (TRL 1.16's names):
- a step is P prompts x G completions and one optimizer step (`per_device_train_batch_size` x
  `gradient_accumulation_steps` = P x G); the dataset holds the train problems in the flow's order and is not shuffled
  (`shuffle_dataset=False`), so step i plays the flow's iteration i (checked: `same_problems`);
- a prompt is the env's text as one user message; TRL renders it with the model's chat template as gymflow's tokenizer
  does (checked: `same_prompt_ids`);
- the reward is the env's own `step` on the completion's text, on a fresh env reset to the problem;
- the stop: gymflow ends a completion at a token sequence of the env's stop strings, or eos; a stop string that is one
  token joins the model's eos ids, at which TRL both stops generating and cuts the completion, which is the same rule
  (a longer stop string cannot: `handicaps` names it);
- the loss is the flow's default GRPO: advantages over the group's std (`scale_rewards="group"`), each sequence's
  token mean, then the batch's mean (`loss_type="grpo"`), clip 0.2, no KL (`beta=0`), one pass (`num_iterations=1`),
  gradient norm clipped at 1, a constant learning rate; float32 (`bf16`/`fp16` off); 2 torch threads.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path (where bench/kernels.py would shadow the `kernels`
# package transformers imports); the repository root goes there instead.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from bench._agent_peer_task import PeerSettings, heldout_accuracy  # noqa: E402

TORCH_THREADS = 2
"""TRL's torch threads: the machine's two cores, as a CPU user runs it."""


@dataclass(frozen=True)
class TRLConfig:
    """What TRL leaves to its user at equal settings, and so what the probe tries; the defaults are TRL's own."""

    batching: str = "one"
    """"one": one generate call for all P x G completions, one backward; "generate_2": two generate calls of P/2
    prompts (`steps_per_generation=1`, 2 accumulation steps); "update_2": one generate call, the backward in two
    halves (`steps_per_generation=2`)."""
    gradient_checkpointing: bool = True
    """TRL's default: activations recomputed in the backward (less memory, more compute)."""
    cache_implementation: str | None = None
    """transformers' KV cache for generation: None is its dynamic cache; "static" preallocates it."""
    torch_compile: bool = False
    """The Trainer's `torch_compile` (inductor) of the policy's forward."""

    def describe(self) -> str:
        return (f"batching {self.batching}, gradient checkpointing {'on' if self.gradient_checkpointing else 'off'}, "
                f"KV cache {self.cache_implementation or 'dynamic'}, torch.compile "
                f"{'on' if self.torch_compile else 'off'}")


PROBE_AXES: dict[str, tuple[Any, ...]] = {
    "batching": ("one", "generate_2", "update_2"),
    "gradient_checkpointing": (True, False),
    "cache_implementation": (None, "static"),
    "torch_compile": (False, True),
}
"""Each axis's values, TRL's default first: the probe walks the axes in this order, keeping the fastest value of each
on top of the ones already kept."""


def batch_arguments(config: TRLConfig, settings: PeerSettings) -> dict[str, int]:
    """GRPOConfig's batch fields that make one optimizer step of P x G completions in `config.batching`'s way."""
    episodes = settings.episodes_per_step
    if config.batching == "one":
        return {"per_device_train_batch_size": episodes, "gradient_accumulation_steps": 1, "steps_per_generation": 1}
    if settings.prompts % 2:
        raise ValueError(f"batching {config.batching!r} splits the {settings.prompts} prompts of a step in two halves; "
                         "use an even number of prompts")
    return {"per_device_train_batch_size": episodes // 2, "gradient_accumulation_steps": 2,
            "steps_per_generation": {"generate_2": 1, "update_2": 2}[config.batching]}


class EnvReward:
    """TRL's reward function: the gymflow env's own reward for each completion's text (a fresh env reset to the
    completion's problem), recording which problems it saw and which completions the env calls correct."""

    __name__ = "env_reward"

    def __init__(self, env: str) -> None:
        self.env = env
        self.seeds: list[int] = []
        self.correct: list[bool] = []

    def __call__(self, completions: list[list[dict[str, str]]], seed: list[int], **_: Any) -> list[float]:
        from rl_core.envs.agent import make_agent_env

        rewards = []
        for completion, problem in zip(completions, seed, strict=True):
            env = make_agent_env(self.env)
            env.reset(problem)
            _, reward, _, info = env.step(completion[0]["content"])
            rewards.append(float(reward))
            self.seeds.append(problem)
            self.correct.append(bool(info.get("correct", False)))
        return rewards


class StepClock(TrainerCallback):
    """Wall-clock times of each optimizer step and of the phases inside it (`phase`), and TRL's own log of each
    step (its `step_time` among it), as a TrainerCallback."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[dict[str, float]] = []
        self.logs: list[dict[str, float]] = []
        self.first_step_at: float | None = None  # time.time(): the end of the run's start-up

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.time()
        self.steps.append({"begin": time.perf_counter(), "generate_s": 0.0, "reward_s": 0.0})

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = self.steps[-1]
        step["step_s"] = time.perf_counter() - step.pop("begin")
        step["update_s"] = step["step_s"] - step["generate_s"] - step["reward_s"]

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.logs.append({key: value for key, value in logs.items() if isinstance(value, (int, float))})

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.steps[-1][f"{name}_s"] += time.perf_counter() - started


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generation (the prompts' tokenization, generate, decoding) and reward phases go into
    `clock`, which also takes the step boundaries."""

    def __init__(self, *args: Any, clock: StepClock, **kwargs: Any) -> None:
        self.clock = clock
        super().__init__(*args, callbacks=[clock], **kwargs)

    def _generate(self, prompts: list) -> Any:
        with self.clock.phase("generate"):
            return super()._generate(prompts)

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
        with self.clock.phase("reward"):
            return super()._calculate_rewards(*args, **kwargs)


def stop_token_ids(env_stop: tuple[str, ...], tokenizer: Any) -> tuple[list[int], list[str]]:
    """The token ids of the env's one-token stop strings, and a handicap line for each longer one."""
    ids, handicaps = [], []
    for text in env_stop:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) == 1:
            ids.append(tokens[0])
        else:
            handicaps.append(f"stop string {text!r} is {len(tokens)} tokens: TRL generates past it, to eos or "
                             "max_completion_length (the reward reads the text as gymflow's does)")
    return ids, handicaps


def train(settings: PeerSettings, config: TRLConfig, model_dir: Path, work: Path, save: bool) -> dict[str, Any]:
    """One GRPOTrainer run of `settings` in `config`, timed per step; with `save`, the trained model (merged, for
    LoRA) is saved to `work / "model"`."""
    torch.set_num_threads(TORCH_THREADS)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    from trl import GRPOConfig

    from rl_core.envs.agent import make_agent_env
    from rl_core.policies.hf_tokenizer import HFTokenizer

    logging.disable_progress_bar()
    env = make_agent_env(settings.env)
    seeds = [seed for step in range(settings.steps) for seed in settings.step_problems(step)]
    messages = {seed: [{"role": "user", "content": env.reset(seed)}] for seed in seeds}
    dataset = Dataset.from_list([{"prompt": messages[seed], "seed": seed} for seed in seeds])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, use_kernels=False)
    stops, handicaps = stop_token_ids(env.stop, tokenizer)
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [*([eos] if isinstance(eos, int) else eos), *stops]
    peft_config = None
    if settings.lora_rank is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(r=settings.lora_rank, lora_alpha=settings.lora_alpha, lora_dropout=0.0, bias="none",
                                 target_modules=settings.lora_targets.split(","), task_type="CAUSAL_LM")
    args = GRPOConfig(
        output_dir=str(work / "trainer"), max_steps=settings.steps, seed=settings.seed, use_cpu=True,
        num_generations=settings.group_size, **batch_arguments(config, settings),
        max_completion_length=settings.max_tokens, temperature=settings.temperature, top_p=1.0, top_k=0,
        learning_rate=settings.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        num_iterations=1, beta=0.0, epsilon=settings.clip_eps, loss_type="grpo", scale_rewards="group",
        max_grad_norm=settings.max_grad_norm, shuffle_dataset=False, use_vllm=False, bf16=False, fp16=False,
        gradient_checkpointing=config.gradient_checkpointing, cache_implementation=config.cache_implementation,
        torch_compile=config.torch_compile, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True)
    reward, clock = EnvReward(settings.env), StepClock()
    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                               processing_class=tokenizer, peft_config=peft_config, clock=clock)
    trl_ids = tokenizer.apply_chat_template(messages[seeds[0]], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
    gymflow_ids = HFTokenizer(tokenizer).conversation_ids([("user", messages[seeds[0]][0]["content"])])
    trainer.train()
    threads = torch.get_num_threads()
    if save:
        trained = trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False)
        if settings.lora_rank is not None:
            trained = trained.merge_and_unload()
        trained.generation_config.eos_token_id = eos
        trained.save_pretrained(work / "model")
        tokenizer.save_pretrained(work / "model")
    expected = [seed for seed in seeds for _ in range(settings.group_size)]
    return {"steps": clock.steps, "first_step_at": clock.first_step_at, "trl_logs": clock.logs,
            "train_accuracy": sum(reward.correct) / max(len(reward.correct), 1),
            "same_problems": sorted(reward.seeds) == sorted(expected) and _in_step_order(reward.seeds, settings),
            "same_prompt_ids": list(trl_ids) == list(gymflow_ids), "torch_threads": threads,
            "stop_token_ids": stops, "handicaps": handicaps}


def _in_step_order(seen: list[int], settings: PeerSettings) -> bool:
    """Whether each step's completions were of that step's problems (TRL shuffles rows within a step only)."""
    per_step = settings.episodes_per_step
    return all(set(seen[i * per_step:(i + 1) * per_step]) == set(settings.step_problems(i))
               for i in range(settings.steps))


def run_trl(settings: PeerSettings, config: TRLConfig, model_dir: Path, work: Path, evaluate: bool,
            timeout_s: float) -> dict[str, Any]:
    """One TRL run in a fresh process (this file as a script): its step timings, start-up and, with `evaluate`,
    gymflow's held-out evaluation of its trained model (sampled as the flow evaluates, and greedy)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = {"settings": settings.to_json(), "config": asdict(config), "model_dir": str(model_dir), "work": str(work),
            "evaluate": evaluate}
    launched_at = time.time()
    done = subprocess.run([sys.executable, __file__, json.dumps(spec)], check=False, capture_output=True, text=True,
                          timeout=timeout_s, cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        raise RuntimeError(f"TRL run ({config.describe()}) failed with exit status {done.returncode}:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["startup_s"] = result.pop("first_step_at") - launched_at
    steady = result["steps"][1:] or result["steps"]  # the first step pays one-off costs, as the flow's first
    seconds = sum(step["step_s"] for step in steady)
    result["episodes_per_s"] = settings.episodes_per_step * len(steady) / seconds
    result["step_s"] = {key: sum(step[key] for step in steady) / len(steady)
                        for key in ("step_s", "generate_s", "reward_s", "update_s")}
    result["config"] = config.describe()
    return result


def probe_trl(settings: PeerSettings, model_dir: Path, work: Path, axes: dict[str, tuple[Any, ...]],
              timeout_s: float) -> tuple[TRLConfig, list[dict[str, Any]]]:
    """TRL's fastest configuration in episodes/s: from TRL's defaults, each axis's values in turn on top of the
    values already kept (a short run of `settings.steps` steps each); a configuration that fails or runs past
    `timeout_s` is recorded and not kept. Returns the configuration and every probe's figures."""
    best, best_speed, probes = TRLConfig(), 0.0, []
    for axis, values in axes.items():
        for value in values:
            candidate = replace(best, **{axis: value})
            if probes and candidate == best:
                continue
            try:
                result = run_trl(settings, candidate, model_dir, work / f"probe-{len(probes)}", False, timeout_s)
                speed, error = result["episodes_per_s"], None
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
                speed, error = 0.0, str(err).strip().splitlines()[-1][:300]
            probes.append({"config": candidate.describe(), "episodes_per_s": round(speed, 3), "error": error})
            print(f"{settings.mode:<5} trl probe {candidate.describe()}: "
                  + (f"{speed:.2f} episodes/s" if error is None else f"failed ({error})"), flush=True)
            if speed > best_speed:
                best, best_speed = candidate, speed
    if not best_speed:
        raise RuntimeError(f"every TRL probe failed; the first: {probes[0]['error']}")
    return best, probes


def main() -> None:
    spec = json.loads(sys.argv[1])
    settings, config = PeerSettings(**spec["settings"]), TRLConfig(**spec["config"])
    work = Path(spec["work"])
    result = train(settings, config, Path(spec["model_dir"]), work, save=spec["evaluate"])
    if spec["evaluate"]:
        result["heldout"] = heldout_accuracy(work / "model", settings, greedy=False)
        result["heldout_greedy"] = heldout_accuracy(work / "model", settings, greedy=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
