"""How `mat ... --help` looks: every option states its default, epilogs keep their line breaks, and the
top-level help lists every command path (`trace memory`, `overlap analyze`, ...) with its one-line help."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

_SAYS_DEFAULT = re.compile(r"\b(default|required)\b")


class MatHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (examples keep one command per line); each option's help ends with
    `(default: X)` when its help does not already say its default: X is the default value, or `none` for an
    optional value left unset. Flags that are off unless given (store_true), required options and positionals
    get no suffix."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            default is False
            or default is argparse.SUPPRESS
            or action.required
            or _SAYS_DEFAULT.search(text.lower())
            or action.nargs == 0
            or (not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            return text
        if default is None or default == []:
            return f"{text} (default: none)"
        shown = " ".join(str(v) for v in default) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    """The parser's subcommands action, if it has one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def iter_commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every command below `parser`, depth first: (path, one-line help, parser), e.g. (('trace', 'memory'), ...)."""
    sub = subcommands(parser)
    if sub is None:
        return
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    for name, child in sub.choices.items():
        path = (*prefix, name)
        yield path, helps.get(name, ""), child
        yield from iter_commands(child, path)


def command_list(parser: argparse.ArgumentParser) -> str:
    """The commands block of `mat --help`: one line per command path, nested ones indented under their parent."""
    rows = [("  " * (len(path) - 1) + " ".join(path), text) for path, text, _ in iter_commands(parser)]
    width = max(len(name) for name, _ in rows) + 2
    return "\n".join(f"  {name:<{width}}{text}" for name, text in rows)
