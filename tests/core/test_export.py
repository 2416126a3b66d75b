"""`gymflow export`: a stored version of an agent run as a Hugging Face model directory that transformers loads and
computes with as gymflow does, SmolLM2 with its tokenizer and chat template, a control run as a safetensors file the
docs' plain-torch loader acts with as gymflow does, and clear refusals (exit status 2, the flag named)."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from flows.tooling.cli import main
from rl_core.algos.base import build_learner, env_spaces
from rl_core.algos.grpo.learner import GRPOLearner
from rl_core.algos.ppo.learner import build_ppo_policy
from rl_core.checkpoint import CheckpointStore
from rl_core.config.presets import build_agent_config, build_control_config
from rl_core.data import RunLayout
from rl_core.data.run_info import open_run
from rl_core.policies.export import write_hf_directory
from rl_core.policies.lm_policy import LMPolicy
from rl_core.policies.normalizer import Moments
from rl_core.policies.pretrained import load_pretrained
from rl_core.runtime.commits import commit_initial
from tests.smollm2 import smollm2_gguf

DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "export.md"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store with an agent run (versions 0 and 1), a control run (version 0, with observation statistics) and a
    run without versions, written with the learners' states and the checkpoint store: no Ray, no flow."""
    url = f"file://{tmp_path_factory.mktemp('export')}/runs"
    agent = build_agent_config("tiny", run_name="agent", store=url, env="Arithmetic-v0", beta=0.1)
    open_run(agent)
    learner = GRPOLearner(agent)
    commit_initial(agent, learner.state())
    with torch.no_grad():  # version 1: moved away from the frozen reference, which the export must leave out
        generator = torch.Generator().manual_seed(1)
        for param in learner.policy.model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    CheckpointStore(RunLayout(agent.run_url).checkpoints).commit(learner.state(), {"iteration": 1})
    control = build_control_config("tiny", run_name="control", store=url, env="Hopper-v5")
    open_run(control)
    ppo = build_learner(control)
    rng = np.random.default_rng(0)
    obs = rng.normal(3.0, 2.0, (256, env_spaces(control).obs_dim))
    ppo.policy.update_statistics(Moments.of(obs), Moments.of(rng.normal(size=(256, 1))))
    commit_initial(control, ppo.state())
    open_run(build_control_config("tiny", run_name="empty", store=url, env="Hopper-v5"))
    return url


def _policy(store: str, run: str, version: int) -> LMPolicy:
    cfg = build_agent_config("tiny", run_name=run, store=store, env="Arithmetic-v0", beta=0.1)
    policy = LMPolicy.build(cfg)
    policy.load_state(CheckpointStore(RunLayout(cfg.run_url).checkpoints).load(version).tensors)
    return policy


def test_an_agent_version_exports_as_a_model_transformers_computes_as_gymflow_does(store, tmp_path, capsys) -> None:
    transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    out = tmp_path / "hf"
    assert main(["export", "agent", "--store", store, "--version", "1", "--hf", str(out)]) == 0
    assert "version 1 of agent" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["char_tokenizer.json", "config.json", "model.safetensors"]
    ours = _policy(store, "agent", 1)
    ids = torch.tensor([ours.tokenizer.conversation_ids([("user", "12+34=")])])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, use_kernels=False).eval()
    with torch.no_grad():
        expected, _ = ours.model(ids)
        assert (hf(ids).logits - expected).abs().max().item() <= 1e-5
    exported, tokenizer = load_pretrained(out)  # and gymflow reads it back: the version's weights, bit for bit
    assert tokenizer == ours.tokenizer
    assert all(torch.equal(exported.hf_state_dict()[k], v) for k, v in ours.model.hf_state_dict().items())
    reference = _policy(store, "agent", 0).model.hf_state_dict()  # what `reference.*` holds: not exported
    assert not torch.equal(exported.hf_state_dict()["lm_head.weight"], reference["lm_head.weight"])


def test_the_newest_version_is_the_default(store, tmp_path, capsys) -> None:
    assert main(["export", "agent", "--store", store, "--hf", str(tmp_path / "newest")]) == 0
    assert "version 1 of agent" in capsys.readouterr().out


@pytest.mark.slow
def test_smollm2_exports_with_its_tokenizer_and_chat_template(tmp_path) -> None:
    """Its initial weights (SFT off) through the writer the command uses: transformers computes the same logits from
    the exported directory as from the GGUF file, and the tokenizer keeps its chat template."""
    gguf = Path(smollm2_gguf())
    import transformers

    cfg = build_agent_config("tiny", run_name="smol", store=f"file://{tmp_path}/runs", model_path=str(gguf),
                             sft_steps=0)
    policy = LMPolicy.build(cfg)
    out = write_hf_directory(policy.model, policy.tokenizer, tmp_path / "smollm2")
    source_tokenizer = policy.tokenizer.tokenizer
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert source_tokenizer.chat_template and tokenizer.chat_template == source_tokenizer.chat_template
    messages = [{"role": "user", "content": "What is 37*41?"}]
    ids = policy.tokenizer.conversation_ids([("user", "What is 37*41?")])
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        source_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
    load = {"dtype": torch.float32, "use_kernels": False}
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, **load).eval()
    source = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **load).eval()
    with torch.no_grad():
        logits = exported(torch.tensor([ids])).logits
        assert (logits - source(torch.tensor([ids])).logits).abs().max().item() <= 1e-5
        ours, _ = policy.model(torch.tensor([ids]))
    # gymflow's LlamaLM and transformers' Llama sum 30 layers in different orders: tests/core/test_hf_model.py
    # measures their gap on SmolLM2 (up to ~1e-4 on logits up to ~39)
    torch.testing.assert_close(ours, logits, atol=1e-3, rtol=1e-4)


def _docs_loader() -> str:
    """The loader's code block in docs/guides/export.md, as a reader copies it."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS_PAGE.read_text(), re.DOTALL)
    [loader] = [block for block in blocks if "def load_policy" in block]
    return loader


def test_a_control_version_exports_as_a_file_the_docs_loader_acts_with_as_gymflow_does(store, tmp_path) -> None:
    out = tmp_path / "hopper.safetensors"
    assert main(["export", "control", "--store", store, "--safetensors", str(out)]) == 0
    cfg = build_control_config("tiny", run_name="control", store=store, env="Hopper-v5")
    spaces = env_spaces(cfg)
    with safe_open(str(out), framework="pt") as file:
        header = file.metadata()
    assert {k: header[k] for k in ("env", "obs_dim", "action_dim", "hidden_sizes", "activation", "version")} == {
        "env": "Hopper-v5", "obs_dim": str(spaces.obs_dim), "action_dim": str(spaces.action_dim),
        "hidden_sizes": "[64, 64]", "activation": "tanh", "version": "0"}
    loader = tmp_path / "loader.py"  # as a reader copies it into a file of their own
    loader.write_text(_docs_loader())
    act = runpy.run_path(str(loader))["load_policy"](str(out))
    ours = build_ppo_policy(cfg, spaces)
    ours.load_state(CheckpointStore(RunLayout(cfg.run_url).checkpoints).load(0).tensors)
    assert ours.obs_norm.moments.count == 256  # the stored statistics, not the identity scale
    obs = np.random.default_rng(1).normal(3.0, 2.0, (6, spaces.obs_dim))
    obs[0] *= 1e3  # far outside the statistics: clipped by the normalizer
    np.testing.assert_allclose(act(torch.from_numpy(obs)).numpy(), ours.deterministic_action(obs), rtol=0, atol=1e-6)


@pytest.mark.parametrize("args, flag, says", [
    (["nope", "--hf", "{out}"], "RUN", "no run 'nope' under"),
    (["../agent", "--hf", "{out}"], "RUN", "is not a run name"),
    (["agent", "--store", "nope://x", "--hf", "{out}"], "--store", "unknown store scheme"),
    (["agent", "--version", "7", "--hf", "{out}"], "--version 7", "no version 7; committed versions: 0, 1"),
    (["empty", "--safetensors", "{out}"], "--version", "no committed version yet"),
    (["control", "--hf", "{out}"], "--hf", "is a control run"),
    (["agent", "--safetensors", "{out}"], "--safetensors", "is an agent run"),
])
def test_bad_input_is_refused_naming_the_flag(store, tmp_path, capsys, args, flag, says) -> None:
    args = [a.format(out=tmp_path / "out") for a in args]
    assert main(["export", *args, *(["--store", store] if "--store" not in args else [])]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}" in err and says in err, err
    assert not (tmp_path / "out").exists()


def test_an_existing_output_is_refused_unless_forced(store, tmp_path, capsys) -> None:
    directory, file = tmp_path / "model", tmp_path / "policy.safetensors"
    directory.mkdir()
    (directory / "notes.txt").write_text("mine")
    file.write_bytes(b"old")
    assert main(["export", "agent", "--store", store, "--hf", str(directory)]) == 2
    assert main(["export", "control", "--store", store, "--safetensors", str(file)]) == 2
    assert main(["export", "control", "--store", store, "--safetensors", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--hf" in err and "is not empty" in err and "--force" in err and "exists; pass --force" in err
    assert "is a directory; name a file" in err and file.read_bytes() == b"old"
    assert main(["export", "agent", "--store", store, "--hf", str(directory), "--force"]) == 0
    assert main(["export", "control", "--store", store, "--safetensors", str(file), "--force"]) == 0
    assert (directory / "model.safetensors").is_file() and (directory / "notes.txt").read_text() == "mine"
    assert file.read_bytes() != b"old"


def test_one_output_flag_is_required(store, tmp_path) -> None:
    for args in (["agent"], ["agent", "--hf", str(tmp_path / "a"), "--safetensors", str(tmp_path / "b")]):
        with pytest.raises(SystemExit) as done:
            main(["export", *args, "--store", store])
        assert done.value.code == 2


def test_a_lora_run_exports_merged_weights_and_refuses_another_base(tmp_path) -> None:
    """A LoRA version (adapters only) exports as the merged model; with other files under the base's path the
    merged model would be wrong, and the export is refused naming both."""
    import transformers

    from rl_core.algos.grpo.learner import rests_on
    from rl_core.envs.agent import make_agent_env
    from rl_core.policies.char_tokenizer import CharTokenizer
    from rl_core.policies.llama import LlamaLM
    from rl_core.policies.llama_spec import LlamaSpec
    from rl_core.policies.pretrained import save_pretrained

    tokenizer = CharTokenizer(make_agent_env("Arithmetic-v0").alphabet)
    spec = LlamaSpec(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64)
    base = save_pretrained(LlamaLM(spec, seed=1), tokenizer, tmp_path / "base")
    cfg = build_agent_config("tiny", run_name="lora", store=f"file://{tmp_path}/runs", model_path=str(base),
                             env="Arithmetic-v0", lora_rank=4)
    learner = GRPOLearner(cfg)
    with torch.no_grad():
        for name, param in learner.policy.model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    open_run(cfg, rests_on(cfg))
    CheckpointStore(RunLayout(cfg.run_url).checkpoints).commit(learner.state(), {"rests_on": rests_on(cfg)})
    out = tmp_path / "hf"
    assert main(["export", "lora", "--store", f"file://{tmp_path}/runs", "--hf", str(out)]) == 0
    ids = torch.tensor([[1, 4, 6, 8, 3]])
    with torch.no_grad():
        ours = learner.policy.model(ids)[0]
        theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
    assert (ours - theirs).abs().max() < 1e-5 and not torch.equal(ours, LlamaLM(spec, seed=1)(ids)[0])
    save_pretrained(LlamaLM(spec, seed=2), tokenizer, base)
    assert main(["export", "lora", "--store", f"file://{tmp_path}/runs", "--hf", str(tmp_path / "hf2")]) == 2
