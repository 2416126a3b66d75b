"""What both run configurations share: the storage section, the algorithm section's registry, the run-name and
seed rules, the error type and its formatting, and `RunSpec`, what the shared runtime (trainer group, checkpoint
store, kernel tuner) reads of either config. Data only: nothing here imports an env, a model or a backend."""
from __future__ import annotations

import os
import re
from typing import Annotated, Any, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

STORE_SCHEMES = ("file", "memory", "s3")
MAX_SEED = 2**63 - 1  # torch.manual_seed takes 64 bits; a larger seed would fail inside an actor, after run.json


class ConfigError(ValueError):
    """Invalid run configuration; the message names each bad field and what it allows."""


def require_shared_store(url: str) -> None:
    """A flow's steps run in other processes (Ray actors), which see only stores outside this process."""
    if url.startswith("memory://"):
        raise ConfigError(f"store: {url} lives in this process's memory, and the flow's steps run in Ray actors "
                          "that cannot see it; use file:// (the default, ./runs) or s3://bucket/prefix (memory:// "
                          "serves in-process use: train_in_process, CheckpointStore)")


def option(name: str) -> dict[str, str]:
    """`json_schema_extra` of a field whose launch option (flow parameter, `--flag`) has another name."""
    return {"option": name}


class AlgorithmConfig(BaseModel):
    """The algorithm section: `name` picks the registered algorithm whose subclass holds the section's fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="Registered algorithm.", json_schema_extra=option("algorithm"))
    nonfinite_limit: int = Field(
        3, ge=1, description="Minibatch updates in a row with a NaN/inf loss or gradient (each one skipped) after "
        "which the iteration's update is discarded and the learner rolls back to the last committed version.")


_ALGORITHM_CONFIGS: dict[str, type[AlgorithmConfig]] = {}


def register_algorithm_config(config: type[AlgorithmConfig]) -> type[AlgorithmConfig]:
    """Make `config` (a subclass with a `name` default) selectable as `algorithm.name`; usable as a decorator."""
    name = config.model_fields["name"].default
    if not isinstance(name, str) or _ALGORITHM_CONFIGS.get(name, config) is not config:
        raise ValueError(f"algorithm config {config.__name__}: needs a unique string default for `name`, got {name!r}")
    _ALGORITHM_CONFIGS[name] = config
    return config


def algorithm_config_class(name: str) -> type[AlgorithmConfig]:
    """The section model of algorithm `name`, or a ValueError listing the registered ones."""
    try:
        return _ALGORITHM_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; allowed: {', '.join(sorted(_ALGORITHM_CONFIGS))}") from None


def _run_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value):
        raise ValueError("use letters, digits, '.', '_' or '-' (starting with a letter or digit), at most 100")
    return value


RunName = Annotated[str, AfterValidator(_run_name)]
"""A run's name, which names its folder in the store."""


class StorageConfig(BaseModel):
    """Where the run's folder lives and how often state is checkpointed."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    url: str = Field("file://./runs", description="fsspec URL under which the run's folder lives: file://, "
                     "memory:// or s3://bucket/prefix.", json_schema_extra=option("store"), validate_default=True)
    full_every: int = Field(8, ge=1, description="A full checkpoint every N versions, deltas in between.")
    epoch_checkpoint_every: int = Field(
        1, ge=0, description="Save training progress every N update epochs inside an iteration, so a retried "
        "train_shard resumes mid-update (0: only the per-iteration versions).")
    epoch_checkpoint_min_s: float = Field(
        10.0, ge=0, description="...but no sooner than this many seconds into the update or after the last such "
        "save: an update shorter than a save is worth is simply redone on retry (0: save at every "
        "`epoch_checkpoint_every` epochs).")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        scheme, _, path = value.rpartition("://")
        scheme = scheme or "file"
        if scheme not in STORE_SCHEMES:
            raise ValueError(f"unknown store scheme {scheme!r} in {value!r}; allowed: {', '.join(STORE_SCHEMES)}")
        if scheme == "file":  # absolute, so Ray workers (other working directories) see the same folder
            return "file://" + os.path.abspath(os.path.expanduser(path))
        return value


class RunSpec(Protocol):
    """What the shared runtime reads of a run's configuration, whichever flow it belongs to."""

    run_name: str
    seed: int
    iterations: int
    num_ranks: int
    collective_timeout_s: float
    storage: StorageConfig
    algorithm: AlgorithmConfig

    @property
    def run_url(self) -> str: ...

    def model_dump_json(self) -> str: ...


class FieldProblem(ValueError):
    """A value the world refuses (found by the preflight, not by a validator): `field` is the dotted field, or ""
    for a check of the whole config, which names its fields itself."""

    def __init__(self, field: str, message: str, value: Any = None) -> None:
        super().__init__(message)
        self.field, self.value = field, value


def format_validation_error(err: Any, title: str = "invalid run configuration:",
                            flags: dict[str, str] | None = None) -> str:
    """One line per bad field of a pydantic ValidationError or a `FieldProblem`: `field (--flag): message (got
    value)`, the flag (from `flags`, dotted field -> option name) where the field is set by a launch option of
    another name. A FieldProblem reads as pydantic words a validator's ValueError, so both say the same."""
    errors = err.errors() if not isinstance(err, FieldProblem) else [
        {"loc": tuple(err.field.split(".")) if err.field else (), "msg": f"Value error, {err}", "input": err.value}]
    lines = [title]
    for e in errors:
        field = ".".join(str(p) for p in e["loc"]) or "config"
        flag = (flags or {}).get(field)
        shown = f"{field} (--{flag.replace('_', '-')})" if flag and flag != field else field
        got = f" (got {e.get('input')!r})" if e["loc"] else ""  # a whole-config check names its fields itself
        lines.append(f"  {shown}: {e['msg']}{got}")
    return "\n".join(lines)
