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
import math
import re
import typing
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


class PbtSpec(BaseModel):
    """Population-based training: when members exploit and what they explore."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    interval: int = Field(ge=1, description="Iterations per generation: every member trains this many, is evaluated, "
                          "then the bottom quantile forks from the top.")
    quantile: float = Field(0.25, gt=0, le=0.5, description="The fraction of the population at the bottom that "
                            "exploits, and at the top that is exploited.")
    mutable: dict[str, tuple[float, float]] = Field(
        min_length=1, description="Field -> [low, high]: the numeric fields a member perturbs when it exploits "
        "(times one of `factors`, kept in bounds).")
    factors: tuple[float, float] = Field((0.8, 1.2), description="The perturbation factors, one drawn per field.")

    @field_validator("mutable")
    @classmethod
    def _bounds(cls, value: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for key, (low, high) in value.items():
            if not 0 < low < high:
                raise ValueError(f"{key}: bounds [low, high] with 0 < low < high (got [{low:g}, {high:g}])")
        return value

    @field_validator("factors")
    @classmethod
    def _factors(cls, value: tuple[float, float]) -> tuple[float, float]:
        if any(f <= 0 for f in value):
            raise ValueError(f"positive factors (got {list(value)})")
        return value


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
    strategy: Literal["grid", "pbt"] = Field("grid", description="grid: every member trains to the end on its own; "
                                             "pbt: population-based training (`pbt`).")
    pbt: PbtSpec | None = Field(None, description="Population-based training's settings (strategy pbt).")

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
        if (self.strategy == "pbt") != (self.pbt is not None):
            raise ValueError("strategy pbt takes pbt's settings (interval, mutable...), and only it does")
        if self.pbt is not None:
            unknown = sorted(k for k in self.pbt.mutable if k not in table and k not in self.algorithm_fields())
            if unknown:
                raise ValueError(f"pbt.mutable: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
            reserved = sorted(k for k in self.pbt.mutable if k in RESERVED or k == "iterations")
            if reserved:
                raise ValueError(f"pbt.mutable: {', '.join(reserved)} set by the sweep itself")
            other = sorted(k for k in self.pbt.mutable if not self.numeric(k))
            if other:
                raise ValueError(f"pbt.mutable: {', '.join(other)} not a number (a perturbation multiplies it)")
            population = len(self.seeds) * math.prod(len(v) for v in self.grid.values())
            if int(population * self.pbt.quantile) < 1:
                raise ValueError(f"pbt: a population of {population} has no member in its {self.pbt.quantile:g} "
                                 "quantile; add seeds or grid values, or raise quantile")
        return self

    @property
    def page(self) -> str:
        """The sweep's page: sweep.json (its identity), its members' results, report.md/.json and its figures."""
        return f"{self.store.rstrip('/')}/{self.name}"

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

    def numeric(self, key: str) -> bool:
        """Whether a launch option's or an algorithm field's values are numbers (int or float, or None as well)."""
        option = self.option_table().get(key)
        if option is not None:
            kind = option.kind
        else:
            kind = algorithm_config_class(str(self.options.get("algorithm", "ppo"))).model_fields[key].annotation
        return any(k in (int, float) for k in typing.get_args(kind) or (kind,))

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
        if self.pbt is not None:
            for member in out:
                if member.config.iterations <= self.pbt.interval:
                    raise ConfigError(f"sweep {self.name}: pbt.interval {self.pbt.interval} leaves no decision in "
                                      f"{member.config.iterations} iterations; set iterations above it")
                if len(member.name) > 100 - len(f"-g{member.config.iterations}"):
                    raise ConfigError(f"sweep {self.name}: member {member.name} leaves no room for its forks' "
                                      "generation suffix in a run name; shorten the sweep's name")
        return out

    def mutable_values(self, cfg: ControlRunConfig | AgentRunConfig) -> dict[str, Any]:
        """The `pbt.mutable` fields' values in a member's configuration (given, or its presets'), by name (the order
        decisions draw them in, whatever the spec's order)."""
        values = cfg.model_dump()
        out: dict[str, Any] = {}
        for key in sorted(self.pbt.mutable if self.pbt else ()):
            option = self.option_table().get(key)
            path = option.path if option is not None and option.path else ("algorithm", key)
            value: Any = values
            for part in path:
                value = value[part]
            out[key] = value
        return out

    def with_values(self, options: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
        """A member's launch options with the mutable fields' `values` set where they belong."""
        out = {**options, "hyperparameters": {**options.get("hyperparameters", {})}}
        for key, value in values.items():
            (out["hyperparameters"] if key in self.algorithm_fields() else out)[key] = value
        if not out["hyperparameters"]:
            del out["hyperparameters"]
        return out

    def identity(self) -> dict[str, Any]:
        """What makes the members what they are (not how many run at once, nor the verdicts' margin): a sweep run
        again under its name must match it."""
        kept = {"flow", "seeds", "grid", "options", "store"} | ({"strategy", "pbt"} if self.pbt else set())
        return self.model_dump(mode="json", include=kept)


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
