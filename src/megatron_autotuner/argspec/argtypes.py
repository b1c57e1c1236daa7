"""argparse `type=` validators shared by every `mat` command.

Each one turns a bad value into `argparse.ArgumentTypeError`, which the CLI's parser prints as one line and exit
code 2 (`mat estimate: error: argument --tp: must be a positive integer, got '0' (see mat estimate --help)`), before
any command body runs: a 0 never reaches code such as `args.tp or 1` that would silently replace it.
"""

from __future__ import annotations

import argparse
import math
import re

__all__ = [
    "fraction",
    "margin_fraction",
    "non_empty_path",
    "non_negative_float",
    "non_negative_int",
    "num_layers_or_edge",
    "positive_float",
    "positive_int",
    "positive_int_list",
    "rank_offset",
]


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def _checked(value: float, text: str, what: str, ok: bool) -> float:
    if not ok:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1: counts and sizes (GPUs, parallel sizes, tokens, batch sizes, layers, repeats)."""
    value = _int(text, "a positive integer")
    return _checked(value, text, "a positive integer", value >= 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0: counts where 0 means none (warm-up steps, extra passes) or an index (a CUDA device)."""
    value = _int(text, "a non-negative integer")
    return _checked(value, text, "a non-negative integer", value >= 0)


def positive_float(text: str) -> float:
    """A finite number > 0: durations such as time limits in seconds."""
    value = _float(text, "a positive number")
    return _checked(value, text, "a positive number", value > 0)


def non_negative_float(text: str) -> float:
    """A finite number >= 0: tolerances."""
    value = _float(text, "a non-negative number")
    return _checked(value, text, "a non-negative number", value >= 0)


def fraction(text: str) -> float:
    """A number in [0, 1]: ratios and thresholds."""
    value = _float(text, "a fraction in [0, 1]")
    return _checked(value, text, "a fraction in [0, 1]", 0.0 <= value <= 1.0)


def margin_fraction(text: str) -> float:
    """A number in [0, 1): a share of memory kept free (1 would leave nothing to fit in)."""
    value = _float(text, "a fraction in [0, 1)")
    return _checked(value, text, "a fraction in [0, 1)", 0.0 <= value < 1.0)


def non_empty_path(text: str) -> str:
    """A file or directory path that is not empty or blank (an empty one would be ignored or mean the cwd)."""
    if not text or not text.strip():
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    return text


def positive_int_list(text: str) -> list[int]:
    """Comma- or space-separated integers >= 1, e.g. `1,2,4`."""
    try:
        values = [int(x) for x in re.split(r"[,\s]+", text.strip()) if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def num_layers_or_edge(text: str) -> str:
    """`mat validate --num-layers`: a positive integer, or max-fit / min-oom (kept as the text the command reads)."""
    if text in ("max-fit", "min-oom"):
        return text
    value = _int(text, "a positive integer, max-fit or min-oom")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, max-fit or min-oom, got {text!r}")
    return text


def rank_offset(text: str) -> str:
    """`R=US`: a rank (integer >= 0) and a shift in microseconds (any finite number, negative moves it earlier).
    Returned unchanged: the command parses it."""
    rank, sep, value = text.partition("=")
    try:
        if not sep or int(rank) < 0 or not math.isfinite(float(value)):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected R=US (rank >= 0 = microseconds), got {text!r}") from None
    return text
