"""Reasoning-gym's procedural datasets as one-turn agent envs: env name `rg:<dataset>`, or
`rg:<dataset>?key=value&key=value` to set fields of the dataset's config (`rg:chain_sum?max_terms=3&max_digits=2`).

Each dataset brings its own generator and its own `score_answer`, which is the reward (in [0, 1]; "correct" when it
is 1). Problem `seed` is drawn as `contract.draw_problem` draws (keyed by the question's text, so a held-out question
never appears in training) from a pool of `size` problems (option `size`, default `POOL_SIZE`): problem i of the pool
is the dataset's item i under the fixed `DATASET_SEED`. Reasoning-gym makes item i from its seed and i alone (most
datasets with `Random(seed + i)`), so the pool is built once per process and an item costs one generator call.

The prompt is the dataset's question and `ANSWER_FORMAT`: the bare answer on one line, short enough for a small model
that writes a few tokens (reasoning-gym's own `<answer>` tag format costs tokens such a model cannot spare). The
action ends at a newline; `step` scores the text before it, stripped.

`ALPHABET` is printable ASCII: the vocabulary of a model built for these tasks. Most datasets write only ASCII; the
others (× in prime_factorization, → in propositional_logic) need a model whose tokenizer writes them (a byte-level
BPE such as SmolLM2's), and GRPO's preflight refuses a run whose tokenizer cannot write an answer.

reasoning-gym is the `tasks` extra, imported on first use of an `rg:` name, never on import of this package.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import string
import types
import typing
from typing import Any

from rl_core.envs.agent.contract import Split, draw_problem, split_seeds

RG_PREFIX = "rg:"
STREAM = 0x52474D  # "RGM": leads the seed key of the draws
DATASET_SEED = 0x5247  # the pool's seed: item i is the dataset's problem Random(DATASET_SEED + i)
POOL_SIZE = 100_000  # distinct problems per pool: about 1 in 8 held out, few repeats in a run's held-out problems
ANSWER_FORMAT = "Reply with only the final answer, on one line."
ALPHABET = "".join(sorted(set(string.printable) - set("\r\x0b\x0c")))
# Reference answers of datasets whose `answer` is None (they verify any valid answer); the first key present is used.
EXAMPLE_ANSWER_KEYS = ("example_answer", "example_correct_answer")
# Datasets an rg: name cannot select, and why.
UNSUPPORTED = {
    "composite": "it mixes other datasets, configured by a list; name one of them instead",
    **dict.fromkeys(
        ("codeio", "intermediate_integration", "isomorphic_strings", "knight_swap", "list_functions",
         "polynomial_multiplication", "ransom_note", "word_ladder"),
        "in reasoning-gym 0.1.25 its problems depend on PYTHONHASHSEED, so a seed would be a different problem in "
        "every process"),
}
MISSING_EXTRA = "rg: envs need reasoning-gym: pip install -e '.[tasks]'"


def _reasoning_gym() -> types.ModuleType:
    """The reasoning_gym package, or an ImportError saying which extra installs it."""
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(MISSING_EXTRA) from None
    return reasoning_gym


def is_rg_name(name: str) -> bool:
    """Whether `name` names a reasoning-gym dataset (`rg:<dataset>...`) rather than a registered env."""
    return name.startswith(RG_PREFIX)


def parse_rg_name(name: str) -> tuple[str, dict[str, str]]:
    """`rg:chain_sum?max_terms=3` -> ("chain_sum", {"max_terms": "3"}): the syntax only, nothing imported."""
    if not is_rg_name(name):
        raise ValueError(f"{name!r} is not a reasoning-gym env name; those look like '{RG_PREFIX}chain_sum'")
    dataset, _, query = name[len(RG_PREFIX):].partition("?")
    if not dataset:
        raise ValueError(f"{name!r} names no dataset; write {RG_PREFIX}<dataset>, e.g. {RG_PREFIX}chain_sum")
    options: dict[str, str] = {}
    for item in query.split("&") if query else []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{name!r}: option {item!r} is not key=value; write {RG_PREFIX}{dataset}?key=value&...")
        if key in options:
            raise ValueError(f"{name!r}: option {key!r} is given twice")
        options[key] = value
    return dataset, options


def check_rg_name(name: str) -> None:
    """A ValueError saying what is allowed unless `name` selects a supported dataset with valid options; an
    ImportError without reasoning-gym."""
    _reasoning_gym()  # every time, not cached: an environment without the extra gets the extra's name
    _dataset_config(name)


@functools.cache
def _dataset_config(name: str) -> dict[str, Any]:
    """The keyword arguments of `create_dataset` for env `name`: its typed options, the pool's seed and size."""
    from reasoning_gym.factory import DATASETS

    dataset, options = parse_rg_name(name)
    if dataset not in DATASETS:
        close = difflib.get_close_matches(dataset, DATASETS, n=5, cutoff=0.5)
        known = close or sorted(DATASETS)[:12]
        raise ValueError(f"unknown reasoning-gym dataset {dataset!r} in {name!r}; "
                         f"{'close' if close else 'some'} names: {', '.join(known)} ({len(DATASETS)} datasets in "
                         "reasoning_gym.factory.DATASETS)")
    if dataset in UNSUPPORTED:
        raise ValueError(f"{name!r}: reasoning-gym dataset {dataset!r} is not supported: {UNSUPPORTED[dataset]}")
    config_class = DATASETS[dataset][1]
    hints = typing.get_type_hints(config_class)
    fields = [f.name for f in dataclasses.fields(config_class) if f.name != "seed"]
    if "seed" in options:
        raise ValueError(f"{name!r}: the env seeds every problem itself; drop the option 'seed'")
    kwargs: dict[str, Any] = {"seed": DATASET_SEED, "size": POOL_SIZE}
    for key, text in options.items():
        if key not in fields:
            raise ValueError(f"{name!r}: dataset {dataset!r} has no option {key!r}; its options: {', '.join(fields)}")
        kwargs[key] = _option_value(name, key, text, hints[key])
    try:
        config = config_class(**kwargs)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, TypeError, ValueError) as err:
        raise ValueError(f"{name!r}: reasoning-gym refuses these options: {err}") from None
    return kwargs


_SCALARS: dict[type, collections.abc.Callable[[str], Any]] = {int: int, float: float, str: str}
_BOOLEANS = {"true": True, "false": False}


def _option_value(name: str, key: str, text: str, hint: Any) -> Any:
    """`text` as a value of type `hint`: bool, int, float, str, a Literal of str, None-or-one-of-these, or a list or
    tuple of scalars written comma-separated (`operators=+,-`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    try:
        if origin in (typing.Union, types.UnionType) and type(None) in args:
            (inner,) = [a for a in args if a is not type(None)]
            return _option_value(name, key, text, inner)
        if hint is bool:
            return _BOOLEANS[text.lower()]
        if hint in _SCALARS:
            return _SCALARS[hint](text)
        if origin is typing.Literal and text in args:
            return text
        container = origin or hint
        item = args[0] if args else str
        if container in (list, tuple, collections.abc.Sequence) and item in _SCALARS:
            values = [_SCALARS[item](part) for part in text.split(",")]
            return tuple(values) if container is tuple else values
    except (KeyError, ValueError):
        pass
    raise ValueError(f"{name!r}: option {key!r} takes {_describe(hint)}, got {text!r}")


def _describe(hint: Any) -> str:
    """What an option of type `hint` takes, in words."""
    if hint is bool:
        return "true or false"
    if hint in _SCALARS:
        return {int: "an integer", float: "a number", str: "a string"}[hint]
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(hint)))
    return f"a value of type {hint} (rg: names write bool, int, float, str and comma-separated lists of these)"


@functools.cache
def _pool(name: str) -> Any:
    """The dataset of env `name`, built once per process; its item i is pool problem i."""
    return _reasoning_gym().create_dataset(parse_rg_name(name)[0], **_dataset_config(name))


@functools.lru_cache(maxsize=4096)  # the preflight, SFT and rollouts ask for the same problems again
def rg_problem(name: str, seed: int) -> dict[str, Any]:
    """Problem `seed` of env `name` (train seeds even, held-out odd): the dataset's entry (question, answer,
    metadata), the same on every machine. Read it, never change it: it is shared."""
    pool = _pool(name)
    return draw_problem(STREAM, seed, lambda rng: pool[int(rng.integers(len(pool)))], lambda e: e["question"])


def reference_answer(entry: dict[str, Any]) -> str | None:
    """The dataset's answer, or the example answer of a dataset that only verifies (None where it has neither)."""
    if isinstance(entry.get("answer"), str):
        return entry["answer"]
    metadata = entry.get("metadata", {})
    return next((metadata[key] for key in EXAMPLE_ANSWER_KEYS if isinstance(metadata.get(key), str)), None)


class ReasoningGymTask:
    """Single turn: the prompt is the question, the action the answer ended by a newline, the reward the dataset's
    `score_answer` of the stripped text before that newline."""

    alphabet = ALPHABET
    max_turns = 1
    stop = ("\n",)

    def __init__(self, name: str) -> None:
        check_rg_name(name)
        self.name = name
        self._entry: dict[str, Any] | None = None

    def reset(self, seed: int) -> str:
        """Start problem `seed`; returns its prompt."""
        self._entry = rg_problem(self.name, seed)
        return f"{self._entry['question'].rstrip()}\n{ANSWER_FORMAT}"

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Score the answer with the dataset's own `score_answer` (a score function that fails on the text scores 0,
        with the failure in info["error"])."""
        if self._entry is None:
            raise RuntimeError(f"{self.name}: no episode is running; call reset(seed) first")
        entry, self._entry = self._entry, None
        answer = action.split("\n", 1)[0].strip()
        info: dict = {"expected": reference_answer(entry)}
        try:
            reward = float(_pool(self.name).score_answer(answer, entry))
        except Exception as err:  # noqa: BLE001 - third-party scoring of any model text: a crash is a wrong answer
            reward, info["error"] = 0.0, f"score_answer failed on {answer!r}: {type(err).__name__}: {err}"
        info["correct"] = reward == 1.0
        return "", reward, True, info

    def demonstration(self, seed: int) -> list[str]:
        """The reference answer of problem `seed` and a newline; a ValueError where the dataset has no reference
        answer or it spans lines (an action ends at the first newline)."""
        answer = reference_answer(rg_problem(self.name, seed))
        if answer is None:
            raise ValueError(f"{self.name}: the dataset gives no reference answer (it only verifies answers), so "
                             f"problem {seed} has no demonstration; pick a dataset that gives one")
        if "\n" in answer:
            raise ValueError(f"{self.name}: the answer of problem {seed} spans lines ({answer!r}), but an rg: env's "
                             "action ends at the first newline; pick a dataset with one-line answers")
        return [f"{answer}\n"]

    def problem_seeds(self, split: Split, count: int, start: int = 0) -> list[int]:
        """Seeds of `split`; train and held-out share neither seeds nor questions."""
        return split_seeds(split, count, start)
