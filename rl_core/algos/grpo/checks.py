"""GRPO's preflight (`Algorithm.check`): what an agent run needs of the world before anything is written. The model's
files hold a Llama causal LM whose tokenizer writes every character of the env; the first iteration's and the
held-out problems' prompts (and the SFT demonstrations) fit its context; vLLM imports where it generates."""
from __future__ import annotations

from rl_core.algos.grpo.phases import check_demonstrations_fit, check_prompts_fit
from rl_core.config.agent import AgentRunConfig
from rl_core.config.common import FieldProblem
from rl_core.envs.agent import AgentEnv, make_agent_env
from rl_core.envs.agent.openenv_task import is_openenv_name
from rl_core.envs.agent.programs import load_agent_program
from rl_core.policies.hf_model import Tokenizer, inspect_causal_lm
from rl_core.policies.lm_policy import model_spec, tokenizer_of
from rl_core.policies.lora import check_lora_rank, check_lora_targets


def check_agent_run(cfg: AgentRunConfig) -> None:
    """A FieldProblem naming the first thing the run's model, env or generator cannot do."""
    if cfg.model.path is not None:
        try:  # a Llama causal LM whose tokenizer matches it; its weights are read later, by the actors
            inspect_causal_lm(cfg.model.path)
        except (OSError, ValueError, ImportError) as err:
            raise FieldProblem("model.path", str(err).removeprefix("load_pretrained: "), cfg.model.path) from None
    if cfg.model.lora_rank is not None:
        _check_lora(cfg)
    if is_openenv_name(cfg.env.name):
        _check_openenv(cfg)
    if cfg.agent is not None:
        try:
            load_agent_program(cfg.agent)
        except ValueError as err:
            raise FieldProblem("agent", str(err), cfg.agent) from None
    try:
        _check_prompts_fit(cfg)
        if cfg.generator == "vllm":
            from rl_core.generation.vllm_generator import check_vllm_model  # vLLM's import, only for its runs

            check_vllm_model(model_spec(cfg))
    except FieldProblem:
        raise
    except ValueError as err:
        raise FieldProblem("", str(err)) from None


def _check_openenv(cfg: AgentRunConfig) -> None:
    """A remote env gives no demonstrations to warm-start on, and no alphabet unless it is one of gymflow's tasks."""
    if cfg.sft.steps:
        raise FieldProblem("sft.steps", f"{cfg.env.name} is an OpenEnv server, which offers no demonstrations to "
                           "warm-start on; run with --sft-steps 0", cfg.sft.steps)
    if cfg.model.path is None and not make_agent_env(cfg.env.name).alphabet:
        raise FieldProblem("env.name", "a model built here writes its env's alphabet, and this OpenEnv server's is "
                           "unknown (its task is not one of gymflow's agent envs); pass --model-path (a model with "
                           "its own tokenizer) or ?task=<a gymflow agent env>", cfg.env.name)


def _check_lora(cfg: AgentRunConfig) -> None:
    """The targets are projections of the model and the rank fits each: a bad name or rank names its flag."""
    m = cfg.model
    if cfg.generator == "vllm":
        raise FieldProblem("model.lora_rank", "LoRA runs generate with the torch backend (--generator torch): "
                           "serving the adapters to vLLM as LoRA requests is not built yet", m.lora_rank)
    spec = model_spec(cfg)
    try:
        check_lora_targets(spec, m.lora_target_names)
    except ValueError as err:
        raise FieldProblem("model.lora_targets", str(err), m.lora_targets) from None
    try:
        check_lora_rank(spec, m.lora_rank, m.lora_target_names)
    except ValueError as err:
        raise FieldProblem("model.lora_rank", str(err), m.lora_rank) from None


def _check_prompts_fit(cfg: AgentRunConfig) -> None:
    tokenizer, env = tokenizer_of(cfg), make_agent_env(cfg.env.name)
    missing = sorted(char for char in set(env.alphabet) if not tokenizer.can_write(char))
    if missing:
        raise ValueError(f"model.path: the model's tokenizer cannot write {missing} of {cfg.env.name}'s "
                         "alphabet; train a model on that alphabet or pick an env it covers")
    if not is_openenv_name(cfg.env.name):  # a remote env has no demonstrations to check
        _check_answers_writable(cfg, env, tokenizer)
    context = model_spec(cfg).max_position_embeddings
    make = lambda: make_agent_env(cfg.env.name)
    count = cfg.algorithm.prompts_per_iteration
    check_prompts_fit(cfg, make, tokenizer, context, env.problem_seeds("train", count), "train")
    check_prompts_fit(cfg, make, tokenizer, context, env.problem_seeds("heldout", cfg.eval_problems), "held-out")
    if cfg.sft.steps:
        check_demonstrations_fit(cfg, env, tokenizer, context, env.problem_seeds("train", count))


def _check_answers_writable(cfg: AgentRunConfig, env: AgentEnv, tokenizer: Tokenizer) -> None:
    """A FieldProblem on env.name when the tokenizer cannot write a demonstration's action of the first iteration's
    or the held-out problems: the policy could never answer them right, nor SFT imitate them. Writing each character
    (the alphabet check) is not enough: an env's alphabet may be a vocabulary its answers go beyond (rg: envs), and a
    tokenizer may not round-trip a whole string."""
    count = cfg.algorithm.prompts_per_iteration
    for split, seeds in (("train", env.problem_seeds("train", count)),
                         ("held-out", env.problem_seeds("heldout", cfg.eval_problems))):
        for seed in seeds:
            try:
                actions = env.demonstration(seed)
            except ValueError as err:  # an env that has no demonstration of this problem says why
                raise FieldProblem("env.name", str(err), cfg.env.name) from None
            for action in actions:
                if not tokenizer.can_write(action):
                    raise FieldProblem("env.name", f"the run's tokenizer cannot write {action!r}, the answer of "
                                       f"{cfg.env.name} {split} problem {seed}; pick an env whose answers it writes, "
                                       "or a model whose tokenizer does (a built model writes the env's alphabet)",
                                       cfg.env.name)
