"""Configuration, fuzzed (issue 20, "Bad input, fuzzed"): every numeric field's bounds are read from the models
themselves, every value outside them (or of the wrong type) is refused at start with a ConfigError naming the dotted
field, and every valid configuration survives the JSON round trip actors and run.json put it through, unchanged."""
from __future__ import annotations

import math
import re
import string
import types
import typing
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from rl_core.config.agent import AgentRunConfig, parse_run_config
from rl_core.config.common import MAX_SEED, ConfigError
from rl_core.config.control import ControlRunConfig, PPOConfig
from rl_core.config.launch_options import agent_launch_options, launch_options
from rl_core.config.presets import build_agent_config, build_control_config
from rl_core.envs.registry import task_names

RUN_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"


@dataclass(frozen=True)
class NumericField:
    """One int or float field: its dotted name (as errors spell it), its bounds, and how a launch sets it."""

    dotted: str
    kind: type  # int or float
    bounds: dict[str, float]  # of ge, gt, le, lt
    optional: bool
    option: str | None  # the launch option that sets it; None: an algorithm hyper-parameter
    element: bool = False  # an element of a tuple field (PPO's hidden widths)

    def kwargs(self, value: Any) -> dict[str, Any]:
        """build_control_config / build_agent_config keyword arguments giving the field `value`."""
        if self.element:  # algorithm.hidden.<i>: a valid layer before it, so the index is not always 0
            index = int(self.dotted.rsplit(".", 1)[1])
            return {"hyperparameters": {"hidden": (64,) * index + (value,)}}
        if self.option is None:
            return {"hyperparameters": {self.dotted.split(".", 1)[1]: value}}
        return {self.option: value}


def _bounds(metadata: list[Any]) -> dict[str, float]:
    return {key: getattr(m, key) for m in metadata for key in ("ge", "gt", "le", "lt") if hasattr(m, key)}


def _numeric(annotation: Any) -> tuple[type, bool] | None:
    """(int or float, optional) for a numeric field or an Optional of one; None for anything else (bool included)."""
    if annotation in (int, float):
        return annotation, False
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return (args[0], True) if union and len(args) == 1 and args[0] in (int, float) else None


def _model_at(root: type[BaseModel], path: tuple[str, ...]) -> type[BaseModel]:
    model = root
    for key in path:
        model = model.model_fields[key].annotation
    return model


def _fields_of(root: type[BaseModel], options: dict, algorithm: type[BaseModel] | None) -> list[NumericField]:
    """Every numeric field a launch sets: by its launch option, or (`algorithm`) as a hyper-parameter."""
    found = []
    for option in options.values():
        if option.path is None:
            continue
        info = _model_at(root, option.path[:-1]).model_fields[option.path[-1]]
        numeric = _numeric(info.annotation)
        if numeric:
            found.append(NumericField(".".join(option.path), numeric[0], _bounds(info.metadata), numeric[1],
                                      option.name))
    by_option = {f.dotted for f in found}
    for name, info in (algorithm.model_fields.items() if algorithm else ()):
        if f"algorithm.{name}" in by_option:  # a field every algorithm has is a launch option (nonfinite_limit)
            continue
        numeric = _numeric(info.annotation)
        if numeric:
            found.append(NumericField(f"algorithm.{name}", numeric[0], _bounds(info.metadata), numeric[1], None))
        elif typing.get_origin(info.annotation) is tuple:  # tuple[Annotated[int, Field(ge=1)], ...]
            element, *_ = typing.get_args(info.annotation)
            kind, *extra = typing.get_args(element)
            bounds = _bounds([m for e in extra for m in getattr(e, "metadata", [])])
            found += [NumericField(f"algorithm.{name}.{i}", kind, bounds, False, None, element=True) for i in (0, 2)]
    return found


CONTROL_FIELDS = _fields_of(ControlRunConfig, launch_options(), PPOConfig)
AGENT_FIELDS = _fields_of(AgentRunConfig, agent_launch_options(), None)  # GRPO's fields are agent options


def test_the_fields_are_found_with_their_bounds() -> None:
    """The fuzzing below covers what the models declare, not a list kept by hand."""
    control = {f.dotted: f for f in CONTROL_FIELDS}
    assert control["seed"].bounds == {"ge": 0, "le": MAX_SEED} and control["seed"].option == "seed"
    assert control["storage.full_every"].option == "full_every"
    assert control["algorithm.gamma"].bounds == {"gt": 0, "le": 1} and control["algorithm.gamma"].kind is float
    assert control["algorithm.target_kl"].optional and control["algorithm.hidden.2"].bounds == {"ge": 1}
    agent = {f.dotted: f for f in AGENT_FIELDS}
    assert agent["sampling.top_p"].bounds == {"gt": 0, "le": 1} and agent["algorithm.group_size"].bounds == {"ge": 2}
    assert agent["sft.learning_rate"].option == "sft_learning_rate"
    assert len(CONTROL_FIELDS) >= 20 and len(AGENT_FIELDS) >= 20


# ------------------------------------------------------------------------------------------------ invalid values

_NUMBER_WORDS = {"inf", "infinity", "nan"}  # strings pydantic reads as floats


def _out_of_range(field: NumericField) -> st.SearchStrategy[Any]:
    """Values beyond one of the field's bounds (for a float, the infinity on that side, and NaN, which no
    bound admits)."""
    b, parts = field.bounds, []
    if field.kind is int:
        if "ge" in b:
            parts.append(st.integers(max_value=int(b["ge"]) - 1))
        if "gt" in b:
            parts.append(st.integers(max_value=int(b["gt"])))
        if "le" in b:
            parts.append(st.integers(min_value=int(b["le"]) + 1))
        if "lt" in b:
            parts.append(st.integers(min_value=int(b["lt"])))
    else:
        if "ge" in b:
            parts.append(st.floats(max_value=b["ge"], exclude_max=True, allow_nan=False))
        if "gt" in b:
            parts.append(st.floats(max_value=b["gt"], allow_nan=False))
        if "le" in b:
            parts.append(st.floats(min_value=b["le"], exclude_min=True, allow_nan=False))
        if "lt" in b:
            parts.append(st.floats(min_value=b["lt"], allow_nan=False))
        if parts:
            parts.append(st.just(math.nan))
    return st.one_of(parts)


def _wrong_type(field: NumericField) -> st.SearchStrategy[Any]:
    """Values no int/float field takes: words, lists, mappings (as hyper-parameters: a mapping given to a launch
    option is test_a_mapping_for_a_number_option_is_refused's case); for an int also fractions and non-finite floats.
    (Digit strings and, for an int, whole floats and booleans are read as numbers by pydantic's lax mode.)"""
    words = st.text(string.ascii_letters, min_size=1, max_size=12).filter(lambda s: s.lower() not in _NUMBER_WORDS)
    wrong = [words, st.lists(st.integers(), max_size=3)]
    if field.option is None:
        wrong.append(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
    if field.kind is int:
        wrong += [st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()),
                  st.sampled_from([math.inf, -math.inf, math.nan])]
    return st.one_of(wrong)


def _refused_naming(err: ConfigError, field: NumericField) -> None:
    # one line per bad field: "  algorithm.gamma: ..." or "  storage.full_every (--full-every): ..."
    line = re.compile(rf"^  {re.escape(field.dotted)}(?: \(--[a-z-]+\))?: ", re.MULTILINE)
    assert line.search(str(err)), f"{field.dotted} not named in:\n{err}"


def _invalid(fields: list[NumericField]) -> st.SearchStrategy[tuple[NumericField, Any]]:
    bounded = [f for f in fields if f.bounds]
    return st.one_of(
        st.sampled_from(bounded).flatmap(lambda f: st.tuples(st.just(f), _out_of_range(f))),
        st.sampled_from(fields).flatmap(lambda f: st.tuples(st.just(f), _wrong_type(f))),
    )


@given(_invalid(CONTROL_FIELDS))
def test_an_invalid_number_is_refused_naming_its_field(case: tuple[NumericField, Any]) -> None:
    field, value = case
    with pytest.raises(ConfigError) as err:
        build_control_config("tiny", run_name="fuzz", store="memory://fuzz", **field.kwargs(value))
    _refused_naming(err.value, field)


@given(_invalid(AGENT_FIELDS))
def test_an_invalid_number_of_an_agent_run_is_refused_naming_its_field(case: tuple[NumericField, Any]) -> None:
    field, value = case
    with pytest.raises(ConfigError) as err:
        build_agent_config("tiny", run_name="fuzz", store="memory://fuzz", **field.kwargs(value))
    _refused_naming(err.value, field)


@given(st.text(max_size=120).filter(lambda s: not re.fullmatch(RUN_NAME, s)))
def test_a_run_name_that_cannot_name_a_folder_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"(?m)^  run_name: "):
        build_control_config("tiny", run_name=name, store="memory://fuzz")


_UNBOUNDED_ABOVE = [pytest.param(f, build, id=f"{kind}-{f.dotted}")
                    for kind, build, fields in (("control", build_control_config, CONTROL_FIELDS),
                                                ("agent", build_agent_config, AGENT_FIELDS))
                    for f in fields if f.kind is float and not {"le", "lt"} & f.bounds.keys()]


@pytest.mark.parametrize(("field", "build"), _UNBOUNDED_ABOVE)
def test_a_non_finite_float_is_refused(field: NumericField, build: Any) -> None:
    for value in (math.inf, math.nan, -math.inf):
        with pytest.raises(ConfigError) as err:
            build("tiny", run_name="fuzz", store="memory://fuzz", **field.kwargs(value))
        _refused_naming(err.value, field)


@pytest.mark.parametrize("build", [build_control_config, build_agent_config], ids=["control", "agent"])
def test_a_mapping_for_a_number_option_is_refused(build: Any) -> None:
    with pytest.raises(ConfigError, match=r"(?m)^  iterations: "):
        build("tiny", run_name="fuzz", store="memory://fuzz", iterations={"a": 1})


# -------------------------------------------------------------------------------------------------- valid values

# Fields the model validators tie to others (the batch must split into minibatches, minibatches over ranks), or
# whose size a config check walks (held-out problems): drawn together, or small, below.
_TIED = {"num_ranks", "env.num_workers", "env.envs_per_worker", "env.rollout_steps", "algorithm.minibatch_size"}
_SMALL = {"eval_problems": 32, "eval_episodes": 1000}


def _within(field: NumericField, cap: int = 10**6) -> st.SearchStrategy[Any]:
    """A value inside the field's bounds (finite; None too for an optional field)."""
    b = field.bounds
    if field.kind is int:
        low = b.get("ge", b["gt"] + 1 if "gt" in b else -cap)
        high = b.get("le", b["lt"] - 1 if "lt" in b else low + cap)
        value = st.integers(int(low), int(high))
    else:
        value = st.floats(b.get("ge", b.get("gt")), b.get("le", b.get("lt")), allow_nan=False, allow_infinity=False,
                          exclude_min="gt" in b, exclude_max="lt" in b)
    return st.none() | value if field.optional else value


def _store() -> st.SearchStrategy[str]:
    return st.sampled_from(["memory://fuzz-runs", "s3://bucket/runs", "file:///srv/gymflow/runs", "runs/fuzz"])


@st.composite
def _control_launch(draw: st.DrawFn) -> dict[str, Any]:
    """build_control_config keyword arguments of a valid control run, every numeric field drawn inside its bounds."""
    kwargs: dict[str, Any] = {"run_name": draw(st.from_regex(RUN_NAME, fullmatch=True)),
                              "env": draw(st.sampled_from(task_names())), "store": draw(_store()),
                              "overlap": draw(st.booleans()), "eval_video": draw(st.booleans()),
                              "randomize_dynamics": draw(st.none() | st.floats(0.01, 0.9))}
    hyper: dict[str, Any] = {"hidden": tuple(draw(st.lists(st.integers(1, 512), min_size=1, max_size=4))),
                             "anneal_lr": draw(st.booleans()), "norm_adv": draw(st.booleans())}
    for field in CONTROL_FIELDS:
        if field.dotted in _TIED or field.element:
            continue
        value = draw(_within(field, _SMALL.get(field.dotted, 10**6)))
        if field.option is None:
            hyper[field.dotted.split(".", 1)[1]] = value
        elif value is not None:
            kwargs[field.option] = value
    # the batch (workers x envs x steps) splits into minibatches, and each minibatch over the ranks
    workers, envs, steps = draw(st.integers(1, 8)), draw(st.integers(1, 64)), draw(st.integers(1, 256))
    batch = workers * envs * steps
    minibatch = draw(st.sampled_from([d for d in range(1, min(batch, 4096) + 1) if batch % d == 0]))
    ranks = draw(st.sampled_from([r for r in range(1, 9) if minibatch % r == 0]))
    kwargs.update(num_workers=workers, envs_per_worker=envs, rollout_steps=steps, num_ranks=ranks)
    hyper["minibatch_size"] = minibatch
    return {**kwargs, "hyperparameters": hyper}


@given(_control_launch())
def test_a_valid_control_config_keeps_every_value_and_round_trips_through_json(launch: dict[str, Any]) -> None:
    cfg = build_control_config("quick", **launch)
    for name, value in launch["hyperparameters"].items():
        assert getattr(cfg.algorithm, name) == value, name
    for field in CONTROL_FIELDS:
        if field.option in launch:
            assert _value_at(cfg, field.dotted) == launch[field.option], field.dotted
    assert ControlRunConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    assert ControlRunConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert parse_run_config(cfg.model_dump_json()) == cfg  # as actors receive it and run.json stores it


def _value_at(cfg: BaseModel, dotted: str) -> Any:
    value: Any = cfg
    for key in dotted.split("."):
        value = getattr(value, key)
    return value


# The agent fields drawn: those that do not change the built model's shape or what must fit in its context
# (those are checked against each other by the config's own validators: test_agent_config.py).
_AGENT_DRAWN = {"seed", "iterations", "eval_problems", "weight_sync_timeout_s", "rollout_groups_per_write",
                "collective_timeout_s", "sampling.temperature", "sampling.top_p", "sampling.top_k",
                "sft.learning_rate", "storage.full_every", "storage.epoch_checkpoint_every",
                "storage.epoch_checkpoint_min_s", "algorithm.learning_rate", "algorithm.update_epochs",
                "algorithm.clip_eps", "algorithm.beta", "algorithm.max_grad_norm", "algorithm.max_staleness",
                "algorithm.tis_cap"}


@st.composite
def _agent_launch(draw: st.DrawFn) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"run_name": draw(st.from_regex(RUN_NAME, fullmatch=True)), "store": draw(_store()),
                              "scale_std": draw(st.booleans()), "token_level": draw(st.booleans()),
                              "minibatches": draw(st.sampled_from([1, 2, 4]))}  # the tiny preset's 4 prompts
    for field in AGENT_FIELDS:
        if field.dotted in _AGENT_DRAWN:
            kwargs[field.option] = draw(_within(field, _SMALL.get(field.dotted, 10**6)))
    return kwargs


@given(_agent_launch())
def test_a_valid_agent_config_keeps_every_value_and_round_trips_through_json(launch: dict[str, Any]) -> None:
    cfg = build_agent_config("tiny", **launch)
    for field in AGENT_FIELDS:
        if field.option in launch:
            assert _value_at(cfg, field.dotted) == launch[field.option], field.dotted
    assert AgentRunConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    assert AgentRunConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert parse_run_config(cfg.model_dump_json()) == cfg
