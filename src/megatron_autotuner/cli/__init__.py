"""`mat` command line: a thin layer over the Python API.

Each subcommand lives in its own module with `register(subparsers)`; bad input raises an
`AutotunerError` subclass, which `main` prints as one line (`mat: error: ...`) with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from ..argspec.help_format import MatHelpFormatter, command_list
from ..errors import AutotunerError
from . import (
    estimate_cmd,
    hardware_cmd,
    models_cmd,
    overlap_cmd,
    plan_cmd,
    profile_cmd,
    rlhf_cmd,
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
    rlhf_cmd,
    profile_cmd,
    trace_cmd,
    validate_cmd,
    overlap_cmd,
]


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse's own errors (unknown option, bad number, missing value) as one line and exit code 2, like
    `AutotunerError`s: `mat estimate: error: argument --tp: must be a positive integer, got 'x' (see mat estimate
    --help)`.
    Subcommand parsers inherit the class, and with it `MatHelpFormatter` (defaults stated, epilogs as written)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", MatHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


DESCRIPTION = "megatron-autotuner: parallel layouts, operator testbench and TP-overlap tuning for Megatron-Core."

EXAMPLES = """examples:
  mat models
  mat plan --model Llama-3.1-8B --gpu H100-SXM --num-gpus 8 --seq-len 8192 --global-batch-size 64
  mat trace summary tests/fixtures/traces/h200_te_layer_tp2_nccl_rank0.json.gz"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="mat", usage="mat [-h] [--version] COMMAND ...", epilog=EXAMPLES)
    parser.add_argument("--version", action="version", version=f"megatron-autotuner {__version__}")
    # the command list is written into the description (nested commands included), not argparse's own listing
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", prog="mat", help=argparse.SUPPRESS)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    parser.description = (
        f"{DESCRIPTION}\n\ncommands (mat COMMAND [SUBCOMMAND] --help for options and examples):\n"
        + command_list(parser)
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AutotunerError as exc:  # bad input: 2; a measuring command that measured nothing: 1
        print(f"mat: {exc.prefix}{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("mat: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # the machine, not the input: a full disk, a file that vanished, no permission
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"mat: error: system: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
