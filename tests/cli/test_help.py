"""`mat ... --help` for every command: each option described with its default, an examples epilog whose commands
run, and a top-level help that names every command path (nested ones included).

Which epilog examples are run: those of the commands that need neither a GPU nor torchrun (plan, estimate, theory,
models, hardware, trace ..., overlap analyze) and any example with --dry-run; the others (profile, validate, overlap
tune without --dry-run) measure on GPUs and are skipped. Each runs in a temporary directory where the repository
paths it names are available (files linked, folders copied, so `overlap analyze` rewrites a copy), outputs land
there too.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
from pathlib import Path

import pytest

from megatron_autotuner.argspec.help_format import MatHelpFormatter, iter_commands
from megatron_autotuner.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
RUNNABLE = ("plan", "estimate", "theory", "models", "hardware", "trace", "overlap analyze", "rlhf")


def all_parsers() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    root = build_parser()
    return [((), root)] + [(path, parser) for path, _, parser in iter_commands(root)]


PARSERS = all_parsers()
IDS = [" ".join(path) or "mat" for path, _ in PARSERS]


def examples(parser: argparse.ArgumentParser) -> list[str]:
    epilog = parser.epilog or ""
    block = epilog.split("examples:", 1)[1] if "examples:" in epilog else ""
    return [line.strip() for line in block.splitlines() if line.strip().startswith("mat ")]


def test_the_tree_has_the_nested_commands():
    paths = {" ".join(path) for path, _ in PARSERS}
    assert {"trace summary", "trace overlap", "trace merge", "trace memory", "overlap tune", "overlap analyze"} <= paths
    assert {"plan", "estimate", "theory", "models", "hardware", "profile", "validate"} <= paths


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=IDS)
def test_every_option_has_help_that_states_its_default(path, parser):
    formatter = MatHelpFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help is not argparse.SUPPRESS and action.help.strip(), f"{parser.prog} {name}"
        if action.nargs == 0 or action.required or isinstance(action, argparse._VersionAction):
            continue  # flags are off unless given; a required option has no default
        shown = formatter._get_help_string(action)
        assert re.search(r"\b(default|required)\b", shown), f"{parser.prog} {name}: {shown!r} states no default"


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=IDS)
def test_every_command_ends_with_examples(path, parser):
    assert parser.epilog and "examples:" in parser.epilog, parser.prog
    found = examples(parser)
    assert 2 <= len(found) <= 3, (parser.prog, found)
    for example in found:
        assert example.startswith(" ".join(("mat", *path))), (parser.prog, example)
    assert parser.formatter_class is MatHelpFormatter, parser.prog  # keeps the examples one per line


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=IDS)
def test_help_exits_zero(path, parser, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*path, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {parser.prog}") and "examples:\n  mat" in out


def test_top_level_help_lists_every_command_path_with_its_line():
    root = build_parser()
    text = root.format_help()
    for path, line, _ in iter_commands(root):
        name = " ".join(path)
        assert line, f"{name} has no one-line help"
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(line)}$", text, re.M), f"{name} missing from mat --help"


def test_overlap_analyze_help_shows_only_its_own_options():
    parsers = dict(PARSERS)
    analyze = parsers[("overlap", "analyze")].format_help()
    for tuning in ("--max-tp-size", "--tp-sizes", "--num-splits", "--cga-sizes", "--model", "--fake", "--backend"):
        assert tuning not in analyze
    assert "--json" in analyze and "directory" in analyze
    tune = parsers[("overlap", "tune")].format_help()
    assert "--num-splits" in tune and "(default 2 4 8)" in tune


def test_plan_required_inputs_are_described():
    plan = dict(PARSERS)[("plan",)]
    helps = {a.option_strings[0]: a.help for a in plan._actions if a.option_strings}
    for option in ("--num-gpus", "--seq-len", "--global-batch-size"):
        assert helps[option] and "required without --megatron-args" in helps[option]


def test_formatter_appends_defaults_once():
    parser = argparse.ArgumentParser(prog="x", formatter_class=MatHelpFormatter)
    parser.add_argument("--a", type=int, default=3, help="a count")
    parser.add_argument("--b", type=int, default=3, help="b count (default 3)")
    parser.add_argument("--c", nargs="+", type=int, default=[2, 4], help="c sizes")
    parser.add_argument("--d", help="d path")
    parser.add_argument("--e", action="store_true", help="e flag")
    text = " ".join(parser.format_help().split())
    assert "a count (default: 3)" in text and "b count (default 3)" in text and "(default 3) (default" not in text
    assert "c sizes (default: 2 4)" in text and "d path (default: none)" in text and "e flag" in text
    assert "e flag (default" not in text


def _runnable(example: str) -> bool:
    command = example[len("mat ") :]
    return command.startswith(RUNNABLE) or "--dry-run" in example.split()


EXAMPLES = sorted({example for _, parser in PARSERS for example in examples(parser)})


def test_examples_are_collected():
    assert len(EXAMPLES) >= 20 and sum(_runnable(e) for e in EXAMPLES) >= 15


def _stage(argv: list[str], where: Path) -> None:
    """Make the repository paths an example names available under `where` (files linked, folders copied)."""
    for arg in argv:
        source = REPO / arg
        if arg.startswith("-") or not arg or not source.exists() or Path(arg).is_absolute():
            continue
        target = where / arg
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            target.symlink_to(source)


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs(example, tmp_path, monkeypatch, capsys):
    if not _runnable(example):
        pytest.skip("measures on GPUs / launches torchrun (see the module docstring)")
    argv = shlex.split(example, comments=True)[1:]
    _stage(argv, tmp_path)
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refused it
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 0, f"{example}\n{err[-2000:]}"
    assert out.strip()
