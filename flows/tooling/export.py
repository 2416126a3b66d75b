"""`gymflow export`: a stored version of a run as files that load without gymflow.

An agent run's policy becomes a Hugging Face model directory (`--hf DIR`), a control run's one safetensors file
(`--safetensors FILE`, PPO's actor-critic); the writers are `rl_core.policies.export`. The version is loaded as
evaluation loads it: the run's stored configuration builds the policy, and the policy takes the version's tensors
(`load_state` picks its own, leaving the optimizer's and the reference's), so the files hold what it computes with.
Every refusal is a ConfigError naming the flag, which the command line turns into exit status 2.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import fsspec
from pydantic import TypeAdapter, ValidationError

from rl_core.algos.base import algorithm_of, env_spaces
from rl_core.algos.ppo.learner import build_ppo_policy
from rl_core.algos.preflight import preflight
from rl_core.checkpoint import CheckpointStore, Snapshot, VersionNotFoundError
from rl_core.config.agent import AgentRunConfig, AnyRunConfig, parse_run_config
from rl_core.config.common import ConfigError, RunName, StorageConfig
from rl_core.config.control import migrate_flat_config
from rl_core.data.run_info import read_run_json
from rl_core.data.run_layout import RunLayout
from rl_core.policies.export import write_control_policy, write_hf_directory
from rl_core.policies.lm_policy import LMPolicy

Format = Literal["hf", "safetensors"]
"""Which output: a Hugging Face model directory (agent runs) or one safetensors file (control runs)."""
LISTED_VERSIONS = 20
"""A refusal lists up to this many committed versions; more are shown as a range."""


def _pydantic_message(err: ValidationError) -> str:
    return err.errors()[0]["msg"].removeprefix("Value error, ")


def stored_run_config(store: str, run: str) -> AnyRunConfig:
    """The configuration run `run` under `store` was started with (its run.json), of either kind, with `store` as
    given (the run may have been moved since)."""
    try:
        store_url = StorageConfig(url=store).url
    except ValidationError as err:
        raise ConfigError(f"--store: {_pydantic_message(err)}") from None
    try:
        TypeAdapter(RunName).validate_python(run)
    except ValidationError as err:
        raise ConfigError(f"RUN: {run!r} is not a run name: {_pydantic_message(err)}") from None
    url = RunLayout(f"{store_url.rstrip('/')}/{run}").run_info
    fs, path = fsspec.core.url_to_fs(url)
    try:
        stored = read_run_json(fs, path, url)
    except FileNotFoundError:
        raise ConfigError(f"RUN: no run {run!r} under {store_url} ({path} does not exist); `gymflow runs --store "
                          f"{store}` lists the runs there") from None
    config = migrate_flat_config(stored["config"])
    return parse_run_config({**config, "storage": {**config.get("storage", {}), "url": store_url}})


def _check_kind(cfg: AnyRunConfig, fmt: Format) -> None:
    """--hf is for agent runs, --safetensors for control runs."""
    if isinstance(cfg, AgentRunConfig) and fmt == "safetensors":
        raise ConfigError(f"--safetensors: run {cfg.run_name!r} is an agent run (a causal LM on {cfg.env.name}); "
                          "export it as a Hugging Face model directory with --hf DIR")
    if not isinstance(cfg, AgentRunConfig) and fmt == "hf":
        raise ConfigError(f"--hf: run {cfg.run_name!r} is a control run ({cfg.algorithm.name} on {cfg.env.name}): "
                          "its policy is an MLP, not a language model; export it with --safetensors FILE")


def _check_target(target: Path, fmt: Format, force: bool) -> None:
    """A directory for --hf, a file for --safetensors; what is there already only with --force."""
    if fmt == "hf":
        if target.exists() and not target.is_dir():
            raise ConfigError(f"--hf: {target} is a file; name a directory (it is created if missing)")
        if target.is_dir() and any(target.iterdir()) and not force:
            raise ConfigError(f"--hf: {target} is not empty; name a new or empty directory, or pass --force to write "
                              "over the files an export writes (other files there stay)")
        return
    if target.is_dir():
        raise ConfigError(f"--safetensors: {target} is a directory; name a file, e.g. {target / 'policy.safetensors'}")
    if target.exists() and not force:
        raise ConfigError(f"--safetensors: {target} exists; pass --force to replace it")


def _load_version(cfg: AnyRunConfig, version: int | None) -> Snapshot:
    """The version (None: the newest that loads), or a ConfigError listing the committed ones."""
    try:
        return CheckpointStore(RunLayout(cfg.run_url).checkpoints).load(version)
    except VersionNotFoundError as err:
        if not err.available:
            raise ConfigError(f"--version: run {cfg.run_name!r} has no committed version yet (a run commits version "
                              "0 when it starts training)") from None
        available = err.available
        listed = ", ".join(map(str, available)) if len(available) <= LISTED_VERSIONS else \
            f"{available[0]}..{available[-1]} ({len(available)} versions; gymflow ckpt ls {err.url} lists them)"
        raise ConfigError(f"--version {version}: run {cfg.run_name!r} has no version {version}; committed versions: "
                          f"{listed}") from None


def _check_rebuildable(cfg: AnyRunConfig) -> None:
    """The preflight of the run's configuration: its env module imports, its env and model files are there. An
    export generates nothing, so an agent run trained with vLLM is checked as a torch run (vLLM need not be
    installed where it is exported)."""
    checked = cfg.model_copy(update={"generator": "torch"}) if isinstance(cfg, AgentRunConfig) else cfg
    try:
        preflight(checked)
    except ConfigError as err:
        raise ConfigError(f"RUN: run {cfg.run_name!r} cannot be rebuilt here to load its version: {err}") from None


def _check_base(cfg: AgentRunConfig, snapshot: Snapshot) -> None:
    """A LoRA version merges into the base it was trained on: other files under the model's path are refused."""
    rests_on = algorithm_of(cfg).rests_on
    recorded, current = snapshot.meta.get("rests_on") or {}, rests_on(cfg) if rests_on is not None else {}
    if recorded and recorded != current:
        raise ConfigError(f"RUN: version {snapshot.version} of run {cfg.run_name!r} holds LoRA adapters trained on "
                          f"{recorded.get('model.path')}; that path now holds {current.get('model.path')}, so the "
                          "merged model would be wrong: put the base model it was trained on back")


def export_version(run: str, store: str, version: int | None, fmt: Format, target: str | Path,
                   force: bool = False) -> dict[str, Any]:
    """Write `version` (None: the newest that loads) of run `run` under `store` to `target` as `fmt`; what was
    written, as the command's JSON line."""
    target = Path(target).expanduser().resolve()
    cfg = stored_run_config(store, run)
    _check_kind(cfg, fmt)
    _check_target(target, fmt, force)
    _check_rebuildable(cfg)
    snapshot = _load_version(cfg, version)
    if isinstance(cfg, AgentRunConfig):
        _check_base(cfg, snapshot)
        agent = LMPolicy.build(cfg)
        agent.load_state(snapshot.tensors)  # its own tensors (`model.*`), not the optimizer's or the reference's
        write_hf_directory(agent.model, agent.tokenizer, target)
        written: dict[str, Any] = {"files": sorted(p.name for p in target.iterdir())}
    else:
        control = build_ppo_policy(cfg, env_spaces(cfg))
        control.load_state(snapshot.tensors)  # `model.*` and the normalizers, not the optimizer or the env states
        target.parent.mkdir(parents=True, exist_ok=True)
        about = {"env": cfg.env.name, "run": run, "version": str(snapshot.version)}
        written = {"header": write_control_policy(control.model, control.obs_norm, target, about)}
    return {"run": run, "version": snapshot.version, "kind": "agent" if fmt == "hf" else "control", fmt: str(target),
            **written}
