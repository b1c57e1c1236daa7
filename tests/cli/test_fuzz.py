"""Fuzz of every `mat` subcommand with bad inputs: no traceback, ever (issue #25).

The bad inputs (files, odd values, output paths) and one regression argv per traceback class the first fuzz
found are listed in fuzz_inputs.json, which this test reads. Every subcommand path and its options come from
`build_parser()`, so a new option is fuzzed without editing this file. Commands run in-process through
`megatron_autotuner.cli.main` in a scratch working directory; nothing starts a GPU job: profile and validate get
--dry-run, plan never gets --validate, and `mat overlap` tune sees no GPU (so it launches no job).

Numbers (issue #39): an option that takes a number, a number inside a value (`--prompt-len MEAN:MAX`, a layout
string, `--var`) and the numbers of valid files of each kind (`number_files`: a config.json, a launch, verl overrides,
a length histogram, a hardware yaml, layouts, cases, a calibration, a trace) are drawn from small ones and large and
extreme ones (0, -1, 2^31, 2^63, 10^18, 1e308, nan, inf, a 5,000-digit integer), and about half of the command lines
start from a valid command (`seed_args`), so those numbers reach the model, the search and the packing.

Contract checked: main returns or raises SystemExit (nothing else escapes), the exit code is 0, 1 or 2, and a
failure ends with one line starting with "mat" on stderr, with no "Traceback". Examples are derandomized (the
same inputs every run); MAT_FUZZ_EXPLORE=1 draws new ones, MAT_FUZZ_SCALE=N runs N times as many, and
MAT_FUZZ_TIMEOUT_S=S fails a command that runs longer than S seconds (default 60). MAT_FUZZ_LOG=FILE appends
each command run, its exit code (or "timeout", or the exception that escaped) and seconds, as one JSON line (how many
inputs a scale run made, and the slowest).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import pickle
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_autotuner.cli import build_parser, main

DATA = json.loads((Path(__file__).with_name("fuzz_inputs.json")).read_text(encoding="utf-8"))
# one command; a hang (a FIFO, /dev/zero, a runaway search) fails instead of blocking the suite. MAT_FUZZ_TIMEOUT_S
# tightens it for a scale run (issue #39: every command under 30 s)
CALL_TIMEOUT_S = float(os.environ.get("MAT_FUZZ_TIMEOUT_S", "60"))

# options whose value is a file or folder the command reads
INPUT_DESTS = {
    "model",
    "hardware_file",
    "calibration",
    "layouts",
    "megatron_args",
    "case_file",
    "rules",
    "tp_comm_overlap_cfg",
    "traces",
    "trace",
    "snapshot",
    "directory",
    "verl_args",
}
# options whose value is a path the command writes
OUTPUT_DESTS = {"output_dir", "output", "calibration_out", "write_calibration", "emit_slurm"}
# never given: they start real GPU runs or long work (validate_plan, host-floor timing)
SKIPPED_OPTIONS = {
    ("plan",): {"--validate", "--measure-host-floor", "--stand-in"},
    ("validate",): {"--measure-host-floor", "--report-only"},
}
# always given, so nothing is launched
FORCED = {("profile",): ["--dry-run"], ("validate",): ["--dry-run"]}
# what the cross product of bad files x input options adds, so the command gets past its required options
BASE_ARGS = {
    ("estimate",): ["--gpu", "H100-SXM"],
    ("plan",): ["--gpu", "H100-SXM", "--num-gpus", "1", "--seq-len", "1024", "--global-batch-size", "1", "--no-chart"],
    ("trace", "merge"): ["-o", "out/merged.json"],
    ("validate",): ["--gpu", "H100-SXM", "--seq-len", "1024"],
}
# drawn numbers (issue #39): small, large and extreme, as text; a {int:D} / {float:D} slot of a template is D or one
INT_NUMBERS = DATA["numbers"]["int"] + ["9" * n for n in DATA["numbers"]["digits"]]
NUMBERS = {"int": INT_NUMBERS, "float": DATA["numbers"]["float"] + INT_NUMBERS}
SLOT = re.compile(r"\{(int|float):([^{}]*)\}")
# the argparse types of options that take a number (argspec/argtypes.py)
NUMBER_TYPES = {
    "positive_int",
    "non_negative_int",
    "positive_float",
    "non_negative_float",
    "fraction",
    "margin_fraction",
    "num_layers_or_edge",
}
SEED_ARGS = {tuple(name.split()): args for name, args in DATA["seed_args"].items() if name != "about"}
EXAMPLES = {("plan",): 25, ("validate",): 40, ("overlap",): 40, ("overlap", "tune"): 40}
DEFAULT_EXAMPLES = 60


# ---- the bad files ---------------------------------------------------------------------------------------------


def _make(path: Path, spec: dict) -> str:
    """Create the file an entry of fuzz_inputs.json describes at `path`; return the path to pass."""
    if "system" in spec:
        return spec["system"]
    if spec.get("dir"):
        path.mkdir(parents=True, exist_ok=True)
    elif spec.get("fifo"):
        os.mkfifo(path)
    elif "tree" in spec:
        for rel, sub in spec["tree"].items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            _make(path / rel, sub)
    elif "text" in spec:
        path.write_text(spec["text"].replace("{DIGITS}", "9" * spec.get("digits", 0)), encoding="utf-8")
    elif "hex" in spec:
        path.write_bytes(bytes.fromhex(spec["hex"]))
    elif "gzip_truncated" in spec:
        packed = gzip.compress(spec["gzip_truncated"].encode())
        path.write_bytes(packed[: len(packed) // 2])
    elif "pickle_gz_truncated" in spec:
        packed = gzip.compress(pickle.dumps(spec["pickle_gz_truncated"]))
        path.write_bytes(packed[: len(packed) // 2])
    elif "pickle" in spec:
        path.write_bytes(pickle.dumps(spec["pickle"]))
    elif "spaces_mib" in spec:
        path.write_bytes(b" " * (spec["spaces_mib"] << 20) + b"{}")
    elif "nested" in spec:
        path.write_text("[" * spec["nested"] + "]" * spec["nested"])
    else:
        raise AssertionError(f"fuzz_inputs.json: no kind for {spec}")
    return str(path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A scratch working directory holding the bad files (default outputs/ land here too); the working
    directory and the GPU count of `mat overlap` are restored afterwards."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs POSIX FIFOs")
    root = tmp_path_factory.mktemp("fuzz")
    files = {spec["name"]: _make(root / spec["name"], spec) for spec in DATA["files"]}
    (root / "exists_file.txt").write_text("a file in the way\n")
    from megatron_autotuner.overlap.tuner import OverlapTuner

    old_cwd = os.getcwd()
    mp = pytest.MonkeyPatch()
    mp.setattr(OverlapTuner, "_gpus", lambda self: 0)  # no GPU: every job is recorded as skipped, none launched
    os.chdir(root)
    try:
        yield root, files
    finally:
        os.chdir(old_cwd)
        mp.undo()


# ---- running mat in-process ------------------------------------------------------------------------------------


class _Hung(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Hung()


def run_mat(argv: list[str]) -> tuple[int, str, str]:
    """main(argv) with stdout/stderr captured, stdin empty and a time limit: (code, out, err). Anything that
    escapes main other than SystemExit fails the test with the argv."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CALL_TIMEOUT_S)
    old_stdin = sys.stdin
    sys.stdin = io.StringIO("")
    failure = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except _Hung:
        code, failure = "timeout", f"mat {argv!r} ran longer than {CALL_TIMEOUT_S} s"
    except BaseException as exc:  # noqa: BLE001 - the point of the test
        code = type(exc).__name__
        failure = f"mat {argv!r} raised {code}: {exc}\nstderr: {err.getvalue()[-2000:]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        sys.stdin = old_stdin
    if os.environ.get("MAT_FUZZ_LOG"):  # a command that escaped or hung is logged too, its code that name
        with open(os.environ["MAT_FUZZ_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps({"argv": argv, "code": code, "s": round(time.perf_counter() - started, 3)}) + "\n")
    if failure:
        pytest.fail(failure)
    return code, out.getvalue(), err.getvalue()


def check_contract(argv: list[str], code: int, err: str) -> None:
    assert code in (0, 1, 2), f"mat {argv!r}: exit code {code}\n{err[-2000:]}"
    assert "Traceback" not in err, f"mat {argv!r} printed a traceback:\n{err[-3000:]}"
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines, f"mat {argv!r}: exit {code} with nothing on stderr"
        assert lines[-1].startswith("mat"), f"mat {argv!r}: last stderr line {lines[-1]!r}"
        assert len(lines) == 1, f"mat {argv!r}: the error is {len(lines)} lines:\n{err[-2000:]}"


# ---- the commands, from the parser -----------------------------------------------------------------------------


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*path, name))


COMMANDS = dict(_leaves(build_parser()))


def test_every_subcommand_is_fuzzed():
    """The parser walk finds every command of the CLI (a broken walk would fuzz nothing)."""
    names = {" ".join(path) for path in COMMANDS}
    assert {"plan", "estimate", "theory", "trace summary", "trace merge", "trace memory"} <= names
    assert {"validate", "profile", "models", "hardware"} <= names
    assert any(name.startswith("overlap") for name in names)


def _filled(template: str):
    """`template` with each {int:D} / {float:D} slot at D, and up to two of them at a drawn number instead."""
    slots = SLOT.findall(template)

    @st.composite
    def fill(draw):
        values = [default for _, default in slots]
        for _ in range(draw(st.integers(0, min(2, len(slots))))):
            i = draw(st.integers(0, len(slots) - 1))
            values[i] = draw(st.sampled_from(NUMBERS[slots[i][0]]))
        drawn = iter(values)
        return SLOT.sub(lambda _: next(drawn), template)

    return fill() if slots else st.just(template)


def _number_file(root: Path, spec: dict):
    """A file of the kind `spec` describes, its numbers drawn, written under root/drawn (one file per content)."""

    def write(text: str) -> str:
        path = root / "drawn" / f"{hashlib.sha1(text.encode()).hexdigest()[:12]}-{spec['name']}"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return str(path)

    return _filled(spec["text"]).map(write)


def _values(action: argparse.Action, files: dict[str, str], root: Path, plausible: bool):
    """The values an option or positional is drawn from. Not `plausible`: bad files and odd values beside the values
    of its kind. `plausible` (after seed_args): only values of its kind, a choice, a number (small or extreme), a
    template or a file of the kind it reads, so that a drawn number gets past the parser to the code that uses it;
    None where there is no such value (free text)."""
    odd = DATA["odd_values"]
    type_name = getattr(action.type, "__name__", "")
    templates = DATA["value_templates"].get(action.dest) or DATA["value_templates"].get(type_name)
    if action.dest in OUTPUT_DESTS:
        return st.sampled_from(DATA["outputs"][:2] if plausible else DATA["outputs"])
    drawn = [_number_file(root, f) for f in DATA["number_files"]["files"] if action.dest in f["for"]]
    if action.dest in INPUT_DESTS or drawn:
        if plausible:
            return st.one_of(*drawn) if drawn else None
        return st.one_of(st.sampled_from(list(files.values()) + odd), *drawn)
    if action.choices:
        return st.sampled_from([str(c) for c in action.choices] + ([] if plausible else odd))
    if templates:
        return st.one_of(*map(_filled, templates), *([] if plausible else [st.sampled_from(odd)]))
    if type_name in NUMBER_TYPES:
        numbers = [st.sampled_from(INT_NUMBERS), st.sampled_from(NUMBERS["float"])]
        return st.one_of(*numbers, *([] if plausible else [st.sampled_from(odd)]))
    return None if plausible else st.sampled_from(odd + list(files.values())[:4])


def _argv_strategy(path: tuple[str, ...], parser: argparse.ArgumentParser, files: dict[str, str], root: Path):
    skipped = SKIPPED_OPTIONS.get(path, set())
    positionals, optionals = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest == "version":
            continue
        if action.option_strings:
            if not skipped.intersection(action.option_strings):
                optionals.append(action)
        else:
            positionals.append(action)

    # each option's strategies, built once (building them for every example cost more than running mat): its flag
    # and values, and, after seed_args, only for the flags and the options that have values of their kind
    def one_option(action: argparse.Action, plausible: bool):
        flag = st.sampled_from(action.option_strings)
        if action.nargs == 0:
            return flag.map(lambda f: [f])
        values = _values(action, files, root, plausible)
        if values is None:
            return None
        if action.nargs in ("+", "*"):
            return st.tuples(flag, st.lists(values, min_size=1, max_size=3)).map(lambda t: [t[0], *t[1]])
        return st.tuples(flag, values).map(lambda t: list(t))

    def positional(action: argparse.Action):
        values = _values(action, files, root, False)
        if action.nargs in ("+", "*"):
            return st.lists(values, min_size=1, max_size=3)
        if action.nargs == "?":
            return st.one_of(st.just([]), values.map(lambda v: [v]))
        return values.map(lambda v: [v])

    any_value = [one_option(a, False) for a in optionals]
    of_its_kind = [o for o in (one_option(a, True) for a in optionals) if o is not None]
    positional_values = [positional(a) for a in positionals]

    @st.composite
    def argv(draw):
        args = list(path)
        for values in positional_values:
            args += draw(values)
        seeded = path in SEED_ARGS and draw(st.booleans())
        if seeded:
            args += [_expand(a, files) for a in SEED_ARGS[path]]
        pool = of_its_kind if seeded else any_value
        chosen = draw(st.lists(st.sampled_from(pool), max_size=6, unique_by=id)) if pool else []
        for option in chosen:
            args += draw(option)
        return args + FORCED.get(path, [])

    return argv()


FUZZ_SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=not os.environ.get("MAT_FUZZ_EXPLORE"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: "-".join(p))
def test_fuzz_subcommand(path, workdir):
    root, files = workdir
    strategy = _argv_strategy(path, COMMANDS[path], files, root)

    scale = float(os.environ.get("MAT_FUZZ_SCALE", "1"))
    examples = max(1, int(EXAMPLES.get(path, DEFAULT_EXAMPLES) * scale))

    @settings(max_examples=examples, **FUZZ_SETTINGS)
    @given(strategy)
    def fuzz(argv):
        code, _, err = run_mat(argv)
        check_contract(argv, code, err)

    fuzz()


@pytest.mark.parametrize("spec", DATA["files"], ids=lambda s: s["name"])
def test_every_bad_file_to_every_input_option(spec, workdir):
    """Each bad file, given to each option that reads a file, of each command (no random choice)."""
    _, files = workdir
    value = files[spec["name"]]
    for path, parser in COMMANDS.items():
        for action in parser._actions:
            if action.dest not in INPUT_DESTS:
                continue
            argv = [*path, action.option_strings[0], value] if action.option_strings else [*path, value]
            if path == ("overlap",) and action.dest == "directory":
                argv = ["overlap", "analyze", value]
            argv += BASE_ARGS.get(path, []) + FORCED.get(path, [])
            code, _, err = run_mat(argv)
            check_contract(argv, code, err)


def _expand(item: str, files: dict[str, str]) -> str:
    for name, value in files.items():
        item = item.replace("{" + name + "}", value)
    assert "{" not in item or "}" not in item, f"fuzz_inputs.json: unknown file in {item!r}"
    return item


@pytest.mark.parametrize("case", DATA["regressions"], ids=lambda c: c["class"])
def test_regression(case, workdir):
    """Each traceback class the first fuzz found: the exit code, one line, and what it names."""
    _, files = workdir
    argv = [_expand(a, files) for a in case["argv"]]
    code, _, err = run_mat(argv)
    check_contract(argv, code, err)
    assert code in case.get("codes", [2]), f"mat {argv!r}: exit {code}\n{err}"
    if code != 0:
        assert case["expect"] in err, f"mat {argv!r}: {case['expect']!r} not in {err!r}"


def test_regression_list_covers_the_issue_classes():
    """The classes issue #25 lists are all in fuzz_inputs.json."""
    classes = " | ".join(c["class"] for c in DATA["regressions"])
    for needle in (
        "--model not UTF-8",
        "--hardware-file not UTF-8",
        "--calibration not UTF-8",
        "--layouts not UTF-8",
        "overlap records not UTF-8",
        "trace file not UTF-8",
        "--megatron-args not UTF-8",
        "output dir is a file",
        "output dir not writable",
        "output dir /dev/null",
        "num_attention_heads: 0",
        "truncated .pickle.gz",
        "overlap record without case_id",
        "--model /dev/zero",
        "FIFO",
        "over the size limit",
        "trace merge -o X X",
    ):
        assert needle in classes, needle
