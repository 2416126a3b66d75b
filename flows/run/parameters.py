"""A flow's parameters from the run's launch options (`rl_core.config.launch_options`), instead of a hand-written list.

`with_launch_options(extra)` gives a flow function written as `def f(**options)` the signature Prefect reads:
one keyword-only parameter per launch option (Optional, default None: "the preset's value"), plus the flow's own
`extra` ones, with an `Args:` section in its docstring so the UI shows each option's help. Prefect builds the
deployment's parameter schema, validates `prefect deployment run --param k=v` and calls the function from it.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, TypeVar

from rl_core.config.common import ConfigError
from rl_core.config.launch_options import LaunchOption, launch_options

F = TypeVar("F", bound=Callable[..., Any])
STOP_AFTER = {"stop_after": (
    Optional[int], None, "Stop this flow run once the run has this many iterations, and evaluate that version; the "
    "run's schedules (the learning rate's decay) still span `iterations`, so the next flow run continues it as if it "
    "had never stopped (how a population-based sweep trains its members in generations)")}
"""The flows' parameter (beside their launch options) that ends a flow run early without shortening the run."""


def with_launch_options(extra: dict[str, tuple[Any, Any, str]] | None = None,
                        table: dict[str, LaunchOption] | None = None) -> Callable[[F], F]:
    """Decorate a `**options` flow function; `extra` maps a parameter name to (annotation, default, help); `table`:
    the launch options of the flow's kind of run (default: a control run's)."""
    table = table or launch_options()

    def decorate(fn: F) -> F:
        params, docs = [], []
        for opt in table.values():
            params.append(inspect.Parameter(opt.name, inspect.Parameter.KEYWORD_ONLY, default=opt.entry_default,
                                            annotation=opt.annotation))
            shown = "" if opt.default is None or opt.entry_default is not None else f" (default: {opt.default!r})"
            docs.append(f"    {opt.name}: {opt.description}{shown}")
        for name, (annotation, default, text) in (extra or {}).items():
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotation))
            docs.append(f"    {name}: {text}")
        fn.__signature__ = inspect.Signature(params, return_annotation=dict)  # type: ignore[attr-defined]
        fn.__doc__ = f"{inspect.cleandoc(fn.__doc__ or '')}\n\nArgs:\n" + "\n".join(docs)
        return fn

    return decorate


def last_iteration(cfg: Any, stop_after: int | None) -> int:
    """Where this flow run stops: the run's `iterations`, or `stop_after` before them (ConfigError past them, naming
    both: the run's length is `iterations`)."""
    if stop_after is None:
        return cfg.iterations
    if not 1 <= stop_after <= cfg.iterations:
        raise ConfigError(f"stop_after: {stop_after} is not within the run's 1..{cfg.iterations} iterations "
                          "(iterations sets the run's length)")
    return stop_after
