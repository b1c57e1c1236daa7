"""`mat` command line: a thin layer over the Python API.

Each subcommand lives in its own module with `register(subparsers)`; bad input raises an
`AutotunerError` subclass, which `main` prints as one line (`mat: error: ...`) with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import AutotunerError
from . import (
    estimate_cmd,
    hardware_cmd,
    models_cmd,
    overlap_cmd,
    plan_cmd,
    profile_cmd,
    theory_cmd,
    trace_cmd,
    validate_cmd,
)

COMMAND_MODULES = [
    models_cmd,
    hardware_cmd,
    theory_cmd,
    estimate_cmd,
    plan_cmd,
    profile_cmd,
    trace_cmd,
    validate_cmd,
    overlap_cmd,
]


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse's own errors (unknown option, bad int, missing value) as one line and exit code 2, like
    `AutotunerError`s: `mat estimate: error: argument --tp: invalid int value: 'x' (see mat estimate --help)`.
    Subcommand parsers inherit the class."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="mat",
        description="megatron-autotuner: parallel layouts, operator testbench and TP-overlap tuning for Megatron-Core.",
    )
    parser.add_argument("--version", action="version", version=f"megatron-autotuner {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AutotunerError as exc:
        print(f"mat: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
