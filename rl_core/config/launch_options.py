"""The flat launch options of a run (flow parameters, `--flags`), derived from the configuration models.

A person starting a run names a handful of values (`env`, `seed`, `store`, `num_workers`...), not the nested
sections of `ControlRunConfig`. Each scalar field of the run and of its `env` and `storage` sections, and the
fields every algorithm has (`name`, `nonfinite_limit`), is one option, named after the field unless the field says
otherwise (`json_schema_extra={"option": ...}`); two more are not fields: `preset` (a named set of overrides) and `randomize_dynamics` (a symmetric range).
So a field added to a model is an option of every entry point at once, with its description as help.
"""
from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel

from rl_core.config.common import AlgorithmConfig, StorageConfig
from rl_core.config.control import ControlRunConfig, EnvConfig

SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class LaunchOption:
    """One option: where its value goes in ControlRunConfig (`path`; None for options that are not fields), its type."""

    name: str
    path: tuple[str, ...] | None
    kind: type  # bool, int, float or str
    description: str
    default: Any = None  # what an unset option means, for help texts (None: the preset's value or none)

    @property
    def entry_default(self) -> Any:
        """The default a flow parameter or flag takes: a field's is None ("the preset's value, else the model's"),
        an option that is no field (`preset`, `randomize_dynamics`) has its own."""
        return None if self.path else self.default

    @property
    def annotation(self) -> Any:
        """The type a flow parameter takes: Optional where None means "not given"."""
        return Optional[self.kind] if self.entry_default is None else self.kind


def _scalar_kind(annotation: Any) -> type | None:
    """bool/int/float/str for a field of that type or an Optional of it; None for anything else."""
    if annotation in SCALARS:
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    is_optional = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return args[0] if is_optional and len(args) == 1 and args[0] in SCALARS else None


def _field_options(model: type[BaseModel], prefix: tuple[str, ...]) -> list[LaunchOption]:
    options = []
    for field, info in model.model_fields.items():
        kind = _scalar_kind(info.annotation)
        if kind is None:
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        default = None if info.is_required() else info.default
        options.append(LaunchOption(str(extra.get("option", field)), (*prefix, field), kind,
                                    info.description or "", default))
    return options


def _table(options: list[LaunchOption]) -> dict[str, LaunchOption]:
    table = {o.name: o for o in options}
    if len(table) != len(options):
        raise RuntimeError("two configuration fields claim the same launch option name")
    return table


def launch_options() -> dict[str, LaunchOption]:
    """Every launch option of a control run by name, in a stable order: preset, the run's fields, env, storage,
    algorithm, then the fields every algorithm has (its hyper-parameters come from presets or `hyperparameters`)."""
    preset = LaunchOption("preset", None, str, "Named run size: quick, full or tiny (rl_core/config/presets.py).",
                          "quick")
    randomize = LaunchOption("randomize_dynamics", None, float, "Scale each env's masses, friction and damping by "
                             "U(1-F, 1+F), per env and seeded (default: off).")
    algorithm = LaunchOption("algorithm", ("algorithm", "name"), str,
                             AlgorithmConfig.model_fields["name"].description or "", "ppo")
    shared = [o for o in _field_options(AlgorithmConfig, ("algorithm",)) if o.path != ("algorithm", "name")]
    return _table([preset, *_field_options(ControlRunConfig, ()), *_field_options(EnvConfig, ("env",)), randomize,
                   *_field_options(StorageConfig, ("storage",)), algorithm, *shared])


def agent_launch_options() -> dict[str, LaunchOption]:
    """Every launch option of an agent run (`AgentRunConfig`): preset, the run's fields, then each section's, GRPO's
    hyper-parameters included (an agent run has one algorithm)."""
    from rl_core.config.agent import AgentRunConfig

    preset = LaunchOption("preset", None, str, "Named run size: quick, full or tiny (rl_core/config/presets.py).",
                          "quick")
    sections = [*_field_options(AgentRunConfig, ())]
    for name in AgentRunConfig.SECTIONS:
        model = AgentRunConfig.model_fields[name].annotation
        sections += [o for o in _field_options(model, (name,)) if o.path != ("algorithm", "name")]
    return _table([preset, *sections])


def nest_options(values: dict[str, Any], table: dict[str, LaunchOption] | None = None) -> dict[str, Any]:
    """The given (not None) field options as a nested config dict; options that are not fields are left out.
    `table`: the options of the run's kind (default: a control run's)."""
    table = table or launch_options()
    unknown = sorted(set(values) - set(table))
    if unknown:
        raise TypeError(f"unknown launch option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                        f"known: {', '.join(table)}")
    nested: dict[str, Any] = {}
    for name, value in values.items():
        path = table[name].path
        if value is None or path is None:
            continue
        target = nested
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return nested
