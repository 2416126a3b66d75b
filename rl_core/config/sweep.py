"""A sweep's specification: N member runs, one per seed and point of a grid of overrides, of one flow (control or
agent), checked once at the edge (the command line, or the sweep flow's start for a deployment run).

A member is an ordinary run: its launch options are the sweep's fixed `options`, one value per `grid` key and a
seed, in the store of the sweep, under a name derived from the sweep's name, its overrides and its seed (the same
spec gives the same names, so a sweep run again continues its members). Keys are the flow's launch options
(`rl_core.config.launch_options`); a control run's algorithm fields (`learning_rate`...), which have no launch
option, go to the run's `hyperparameters`. Each member's configuration is built with the flows' own builders
(`build_control_config`, `build_agent_config`), so a bad value is refused here, naming its field, before anything
runs.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from rl_core.config.agent import AgentRunConfig
from rl_core.config.common import MAX_SEED, ConfigError, RunName, algorithm_config_class
from rl_core.config.control import ControlRunConfig
from rl_core.config.launch_options import agent_launch_options, launch_options
from rl_core.config.presets import build_agent_config, build_control_config

Scalar = bool | int | float | str
RESERVED = ("run_name", "seed", "store")
"""Launch options the sweep sets for each member itself."""


@dataclass(frozen=True)
class Member:
    """One member run: its name, seed, overrides (grid key -> value) and the arguments of its flow."""

    name: str
    seed: int
    overrides: dict[str, Any]
    options: dict[str, Any] = field(repr=False)
    config: ControlRunConfig | AgentRunConfig = field(repr=False)

    @property
    def group(self) -> str:
        """The members that differ only by seed share a group: `key=value, ...` ('all' for a grid of none)."""
        return ", ".join(f"{k}={_text(v)}" for k, v in self.overrides.items()) or "all"


class SweepSpec(BaseModel):
    """What a sweep runs; `gymflow sweep run` flags or a YAML file (`--spec`) of these fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: RunName = Field(description="Names the sweep's page under the store and prefixes its members' names.")
    flow: Literal["control", "agent"] = Field("control", description="Which flow's runs are swept.")
    seeds: tuple[int, ...] = Field((0,), min_length=1, description="Each point of the grid runs once per seed.")
    grid: dict[str, tuple[Scalar, ...]] = Field(
        default_factory=dict, description="Launch option (or a control run's algorithm field) -> the values tried.")
    options: dict[str, Scalar] = Field(
        default_factory=dict, description="Launch options every member shares (preset, iterations, env...).")
    store: str = Field("file://./runs", description="fsspec URL under which members' folders and the sweep's page "
                       "live.")
    max_concurrent: int = Field(2, ge=1, description="Members training at the same time.")
    margin: float = Field(0.05, ge=0, description="Non-inferiority margin of the verdicts, a fraction of the "
                          "compared group's |mean| score: 'not worse' claims any loss is smaller.")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) != len(value) or any(s < 0 or s > MAX_SEED for s in value):
            raise ValueError(f"distinct seeds in 0..{MAX_SEED}")
        return value

    @field_validator("grid")
    @classmethod
    def _grid(cls, value: dict[str, tuple[Scalar, ...]]) -> dict[str, tuple[Scalar, ...]]:
        for key, values in value.items():
            if not values or len(set(values)) != len(values):
                raise ValueError(f"{key}: one or more distinct values (got {list(values)})")
        return value

    @model_validator(mode="after")
    def _keys_are_options(self) -> SweepSpec:
        table = self.option_table()
        for section in ("grid", "options"):
            given = getattr(self, section)
            reserved = sorted(k for k in given if k in RESERVED)
            if reserved:
                raise ValueError(f"{section}: {', '.join(reserved)} set by the sweep itself (name, seeds, store)")
            unknown = sorted(k for k in given if k not in table and k not in self.algorithm_fields())
            if unknown:
                raise ValueError(f"{section}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                                 f"known: {', '.join(k for k in table if k not in RESERVED)}"
                                 + (f", and the algorithm's fields {', '.join(self.algorithm_fields())}"
                                    if self.algorithm_fields() else ""))
        both = sorted(set(self.grid) & set(self.options))
        if both:
            raise ValueError(f"grid and options both set {', '.join(both)}")
        return self

    def option_table(self) -> dict:
        return agent_launch_options() if self.flow == "agent" else launch_options()

    def algorithm_fields(self) -> tuple[str, ...]:
        """A control run's algorithm fields that no launch option sets (they go to `hyperparameters`); none for agent
        runs, whose launch options hold GRPO's fields."""
        if self.flow == "agent":
            return ()
        algorithm = str(self.options.get("algorithm", "ppo"))
        try:
            model = algorithm_config_class(algorithm)
        except ValueError:
            return ()  # the member configs' build names the unknown algorithm
        table = {o.path for o in launch_options().values() if o.path}
        return tuple(f for f in model.model_fields if ("algorithm", f) not in table)

    def typed(self, key: str, value: Any) -> Any:
        """`value` as key's field takes it (a flag's text "1e-3" as 0.001), so equal values give equal names."""
        option = self.option_table().get(key)
        if option is not None:
            return TypeAdapter(option.kind).validate_python(value)
        algorithm = algorithm_config_class(str(self.options.get("algorithm", "ppo")))
        return TypeAdapter(algorithm.model_fields[key].annotation).validate_python(value)

    def members(self) -> list[Member]:
        """Every member, grid points in order of the grid's keys, seeds innermost; each one's configuration built
        (a ConfigError names the member and the bad field)."""
        try:
            fixed = {k: self.typed(k, v) for k, v in self.options.items()}
            axes = {k: [self.typed(k, v) for v in vs] for k, vs in self.grid.items()}
        except ValidationError as err:
            raise ConfigError(f"invalid sweep {self.name}: {err.errors()[0]['msg']} "
                              f"({err.errors()[0].get('input')!r})") from None
        out = []
        for point in itertools.product(*axes.values()):
            overrides = dict(zip(axes, point))
            for seed in self.seeds:
                name = member_name(self.name, overrides, seed)
                given = {**fixed, **overrides}
                hyper = {k: v for k, v in given.items() if k in self.algorithm_fields()}
                options = {k: v for k, v in given.items() if k not in hyper}
                options.update(run_name=name, seed=seed, store=self.store)
                if hyper:
                    options["hyperparameters"] = hyper
                try:
                    cfg = (build_agent_config if self.flow == "agent" else build_control_config)(**options)
                except ConfigError as err:
                    raise ConfigError(f"sweep {self.name}, member {name}: {err}") from None
                out.append(Member(name, seed, overrides, options, cfg))
        return out

    def identity(self) -> dict[str, Any]:
        """What makes the members what they are (not how many run at once, nor the verdicts' margin): a sweep run
        again under its name must match it."""
        return self.model_dump(mode="json", include={"flow", "seeds", "grid", "options", "store"})


def member_name(sweep: str, overrides: dict[str, Any], seed: int) -> str:
    """`<sweep>-<key>-<value>-...-s<seed>` (characters a run name refuses become '-'); past 100 characters, a digest
    of the overrides stands for them."""
    parts = [f"{k}-{_text(v)}" for k, v in overrides.items()]
    name = re.sub(r"[^A-Za-z0-9._-]", "-", "-".join([sweep, *parts, f"s{seed}"]))
    if len(name) <= 100:
        return name
    digest = hashlib.blake2b(repr(sorted(overrides.items())).encode(), digest_size=4).hexdigest()
    return f"{sweep[:100 - len(digest) - len(str(seed)) - 3]}-{digest}-s{seed}"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return format(value, "g") if isinstance(value, float) else str(value)


def parse_values(text: str) -> list[Scalar]:
    """A flag's comma-separated values, each as YAML would read it where that is a number or a boolean
    ("1e-3" included, which YAML 1.1 leaves a string), else the text."""
    return [_scalar(v.strip()) for v in text.split(",") if v.strip()]


def _scalar(text: str) -> Scalar:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def load_spec(values: dict[str, Any]) -> SweepSpec:
    """A SweepSpec from a dict (a YAML file's, flags'), or a ConfigError naming each bad field."""
    from rl_core.config.common import format_validation_error

    try:
        return SweepSpec.model_validate(values)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, "invalid sweep:")) from None
