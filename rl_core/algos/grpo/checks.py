"""GRPO's preflight (`Algorithm.check`): what an agent run needs of the world before anything is written. The model's
files hold a Llama causal LM whose tokenizer writes every character of the env; the first iteration's and the
held-out problems' prompts (and the SFT demonstrations) fit its context; vLLM imports where it generates."""
from __future__ import annotations

from rl_core.algos.grpo.phases import check_demonstrations_fit, check_prompts_fit
from rl_core.config.agent import AgentRunConfig
from rl_core.config.common import FieldProblem
from rl_core.envs.agent import make_agent_env
from rl_core.policies.hf_model import inspect_causal_lm
from rl_core.policies.lm_policy import model_spec, tokenizer_of


def check_agent_run(cfg: AgentRunConfig) -> None:
    """A FieldProblem naming the first thing the run's model, env or generator cannot do."""
    if cfg.model.path is not None:
        try:  # a Llama causal LM whose tokenizer matches it; its weights are read later, by the actors
            inspect_causal_lm(cfg.model.path)
        except (OSError, ValueError, ImportError) as err:
            raise FieldProblem("model.path", str(err).removeprefix("load_pretrained: "), cfg.model.path) from None
    try:
        _check_prompts_fit(cfg)
        if cfg.generator == "vllm":
            from rl_core.generation.vllm_generator import check_vllm_model  # vLLM's import, only for its runs

            check_vllm_model(model_spec(cfg))
    except ValueError as err:
        raise FieldProblem("", str(err)) from None


def _check_prompts_fit(cfg: AgentRunConfig) -> None:
    tokenizer, env = tokenizer_of(cfg), make_agent_env(cfg.env.name)
    missing = sorted(char for char in set(env.alphabet) if not tokenizer.can_write(char))
    if missing:
        raise ValueError(f"model.path: the model's tokenizer cannot write {missing} of {cfg.env.name}'s "
                         "alphabet; train a model on that alphabet or pick an env it covers")
    context = model_spec(cfg).max_position_embeddings
    make = lambda: make_agent_env(cfg.env.name)  # noqa: E731
    count = cfg.algorithm.prompts_per_iteration
    check_prompts_fit(cfg, make, tokenizer, context, env.problem_seeds("train", count), "train")
    check_prompts_fit(cfg, make, tokenizer, context, env.problem_seeds("heldout", cfg.eval_problems), "held-out")
    if cfg.sft.steps:
        check_demonstrations_fit(cfg, env, tokenizer, context, env.problem_seeds("train", count))
