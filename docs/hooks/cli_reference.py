"""MkDocs hook: the command-line reference page (reference/cli.md), written at build time from the real parsers.

Why generated: every `gymflow train` / `train-agent` flag is derived from a configuration field
(`rl_core.config.launch_options`), so a hand-written table would drift the day a field is added. This hook asks the
same objects the command line asks: it builds `gymflow`'s argparse parser through `flows.tooling.cli.parse_args`
(and `gymflow ckpt`'s through `rl_core.checkpoint.cli.main`), stopping each at the moment it would parse, and renders
every subcommand's arguments; for the two training commands it adds the configuration field each flag sets, from
`launch_options()` and `agent_launch_options()`. A renamed entry point fails the (strict) build instead of leaving a
stale page.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/cli.md"


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@contextmanager
def _capturing() -> Iterator[None]:
    """While active, the first `ArgumentParser.parse_args` call raises `_Captured` with its parser."""
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def _parser_of(entry: Callable[[], Any]) -> argparse.ArgumentParser:
    with _capturing():
        try:
            entry()
        except _Captured as captured:
            return captured.parser
    raise RuntimeError(f"{entry} returned without parsing arguments: the CLI reference cannot find its parser")


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order the parser lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _cell(text: Any) -> str:
    """Text fit for a table cell: one line, pipes escaped, angle brackets shown (not read as HTML)."""
    text = str(text).replace("%%", "%").replace("\n", " ").strip()
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _help(action: argparse.Action, option: Any, default: str) -> str:
    """The flag's help, without the "(default: ...)" it ends with where the default column shows that value."""
    text = action.help or (option.description if option is not None else "")
    return re.sub(r"\s*\(default: [^()]*\)$", "", text) if default else text


def _type_name(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "flag / no-flag"
    if action.nargs == 0:
        return "flag"
    if action.choices:
        return " | ".join(str(c) for c in action.choices)
    return getattr(action.type, "__name__", "str") if action.type else "str"


def _default(action: argparse.Action, option: Any) -> str:
    """The model's default for a configuration flag (a preset may set another), else the parser's."""
    default = option.default if option is not None else action.default
    if default is None or default is argparse.SUPPRESS or (action.nargs == 0 and option is None and not default):
        return ""
    return f"`{str(default).lower() if isinstance(default, bool) else default}`"


def _arguments_table(parser: argparse.ArgumentParser, options: dict[str, Any] | None) -> list[str]:
    with_field = options is not None
    head = "| argument | type | default | config field | description |" if with_field else \
        "| argument | type | default | description |"
    lines = [head, "|---" * (5 if with_field else 4) + "|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) if action.option_strings else \
            f"`{action.metavar or action.dest.upper()}`"
        if action.required and action.option_strings:
            name += " (required)"
        if not action.option_strings and action.nargs == "?":
            name += " (optional)"
        option = options.get(action.dest) if options else None
        default = _default(action, option)
        row = [name, _cell(_type_name(action)), default]
        if with_field:
            row.append(f"`{'.'.join(option.path)}`" if option is not None and option.path else "")
        row.append(_cell(_help(action, option, default)))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def render() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from flows.tooling import cli
    from rl_core.checkpoint import cli as checkpoint_cli
    from rl_core.config.launch_options import agent_launch_options, launch_options

    main = _parser_of(lambda: cli.parse_args([]))
    options = {"train": launch_options(), "train-agent": agent_launch_options()}
    out = [
        "---",
        "hide:",
        "  - navigation  # the option tables need the width",
        "---",
        "",
        "# Command-line reference",
        "",
        "<!-- Generated at build time by docs/hooks/cli_reference.py from the parsers of `gymflow` and",
        "     `gymflow ckpt` and from rl_core.config.launch_options; do not edit. -->",
        "",
        "The console script `gymflow` (the same as `python -m flows.tooling.cli`). Every command has `--help`.",
        "This page is generated from the parsers themselves when the site is built, so it lists exactly what the",
        "installed command accepts.",
        "",
        "```text",
        (main.description or "").strip(),
        "```",
        "",
        "**Exit status**: " + _cell(main.epilog or "").removeprefix("exit status: "),
        "",
        "For `train` and `train-agent`, *config field* is where the flag's value goes in the run's configuration",
        "(`ControlRunConfig` in `rl_core/config/control.py`, `AgentRunConfig` in `rl_core/config/agent.py`); a flag",
        "left out takes the preset's value, else the model's default (the *default* column). The same names are the",
        "parameters of the flows and of the deployments in `prefect.yaml`.",
        "",
    ]
    for name, help_text, sub in _subcommands(main):
        if name == "ckpt":
            sub = _parser_of(lambda: checkpoint_cli.main([], prog="gymflow ckpt"))
        out += [f"## gymflow {name}", "", _cell(sub.description or help_text), ""]
        nested = _subcommands(sub)
        if nested:
            for child, child_help, child_parser in nested:
                out += [f"### gymflow {name} {child}", "", _cell(child_parser.description or child_help), ""]
                out += _arguments_table(child_parser, None) + [""]
        else:
            out += _arguments_table(sub, options.get(name)) + [""]
    return "\n".join(out) + "\n"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, PAGE, content=render()))
    return files
