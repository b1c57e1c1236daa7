"""Bad numbers and empty paths are refused while the command line is parsed: exit code 2 and one stderr line naming
the option, before any command runs (so `--global-batch-size 0` can no longer fall back to a default)."""

from __future__ import annotations

import argparse

import pytest

from megatron_autotuner.argspec import argtypes
from megatron_autotuner.cli import build_parser, main

TRACE = "tests/fixtures/traces/h200_te_layer_tp1_rank0.json.gz"
POS = "must be a positive integer, got"
NONNEG = "must be a non-negative integer, got"

BAD = [
    # layout / workload options of estimate and theory
    (["estimate", "--global-batch-size", "0"], f"argument --global-batch-size: {POS} '0'"),
    (["estimate", "--num-layers", "0"], f"argument --num-layers: {POS} '0'"),
    (["estimate", "--tp", "0"], f"argument --tp: {POS} '0'"),
    (["estimate", "--tp", "-2"], f"argument --tp: {POS} '-2'"),
    (["estimate", "--tp", "two"], f"argument --tp: {POS} 'two'"),
    (["estimate", "--pp", "0"], f"argument --pp: {POS} '0'"),
    (["estimate", "--vpp", "0"], f"argument --vpp: {POS} '0'"),
    (["estimate", "--cp", "0"], f"argument --cp: {POS} '0'"),
    (["estimate", "--ep", "0"], f"argument --ep: {POS} '0'"),
    (["estimate", "--etp", "0"], f"argument --etp: {POS} '0'"),
    (["estimate", "--num-gpus", "0"], f"argument --num-gpus: {POS} '0'"),
    (["estimate", "--micro-batch-size", "0"], f"argument --micro-batch-size: {POS} '0'"),
    (["estimate", "--recompute-num-layers", "0"], f"argument --recompute-num-layers: {POS} '0'"),
    (["estimate", "--max-token-len", "0"], f"argument --max-token-len: {POS} '0'"),
    (["estimate", "--memory-margin", "1"], "argument --memory-margin: must be a fraction in [0, 1), got '1'"),
    (["estimate", "--memory-margin", "-0.1"], "argument --memory-margin: must be a fraction in [0, 1)"),
    (["estimate", "--memory-margin", "nan"], "argument --memory-margin: must be a fraction in [0, 1)"),
    (["estimate", "--megatron-args", ""], "argument --megatron-args: must be a path, got an empty string"),
    (["theory", "--seq-len", "0"], f"argument --seq-len: {POS} '0'"),
    (["theory", "--seq-len", "4096.5"], f"argument --seq-len: {POS} '4096.5'"),
    # plan
    (["plan", "--global-batch-size", "0"], f"argument --global-batch-size: {POS} '0'"),
    (["plan", "--num-gpus", "-8"], f"argument --num-gpus: {POS} '-8'"),
    (["plan", "--seq-len", "0"], f"argument --seq-len: {POS} '0'"),
    (["plan", "--top", "-1"], f"argument --top: {POS} '-1'"),
    (["plan", "--top", "0"], f"argument --top: {POS} '0'"),
    (["plan", "--validate", "0"], f"argument --validate: {POS} '0'"),
    (["plan", "--memory-margin", "1.5"], "argument --memory-margin: must be a fraction in [0, 1), got '1.5'"),
    (["plan", "--output-dir", ""], "argument --output-dir: must be a path, got an empty string"),
    (["plan", "--output-dir", "  "], "argument --output-dir: must be a path, got an empty string"),
    (["plan", "--tp-comm-overlap-cfg", ""], "argument --tp-comm-overlap-cfg: must be a path"),
    (["hardware", "--hardware-file", ""], "argument --hardware-file: must be a path, got an empty string"),
    # overlap (tune options on `mat overlap` and on `mat overlap tune`)
    (["overlap", "--num-splits", "0"], f"argument --num-splits: {POS} '0'"),
    (["overlap", "--num-splits", "2", "0"], f"argument --num-splits: {POS} '0'"),
    (["overlap", "--tp-sizes", "0"], f"argument --tp-sizes: {POS} '0'"),
    (["overlap", "--max-tp-size", "0"], f"argument --max-tp-size: {POS} '0'"),
    (["overlap", "--max-token-len", "0"], f"argument --max-token-len: {POS} '0'"),
    (["overlap", "--micro-batch-size", "0"], f"argument --micro-batch-size: {POS} '0'"),
    (["overlap", "--min-num-sm", "0"], f"argument --min-num-sm: {POS} '0'"),
    (["overlap", "--max-num-sm", "-4"], f"argument --max-num-sm: {POS} '-4'"),
    (["overlap", "--cga-sizes", "0"], f"argument --cga-sizes: {POS} '0'"),
    (
        ["overlap", "--overlap-threshold", "1.5"],
        "argument --overlap-threshold: must be a fraction in [0, 1], got '1.5'",
    ),
    (["overlap", "--scaling-tolerance", "-1"], "argument --scaling-tolerance: must be a non-negative number, got '-1'"),
    (["overlap", "--warmup", "-1"], f"argument --warmup: {NONNEG} '-1'"),
    (["overlap", "--repeats", "0"], f"argument --repeats: {POS} '0'"),
    (["overlap", "--verify-passes", "-1"], f"argument --verify-passes: {NONNEG} '-1'"),
    (["overlap", "--case-timeout", "0"], "argument --case-timeout: must be a positive number, got '0'"),
    (["overlap", "--case-timeout", "inf"], "argument --case-timeout: must be a positive number, got 'inf'"),
    (["overlap", "--output-dir", ""], "argument --output-dir: must be a path, got an empty string"),
    (["overlap", "tune", "--repeats", "0"], f"argument --repeats: {POS} '0'"),
    (["overlap", "tune", "--num-splits", "0"], f"argument --num-splits: {POS} '0'"),
    (["overlap", "analyze", "--num-splits", "2"], "unrecognized arguments: --num-splits"),
    # trace
    (["trace", "summary", TRACE, "--top", "0"], f"argument --top: {POS} '0'"),
    (["trace", "memory", "x.pickle", "--top", "-1"], f"argument --top: {POS} '-1'"),
    (["trace", "memory", "x.pickle", "--device", "-1"], f"argument --device: {NONNEG} '-1'"),
    (["trace", "merge", TRACE, "-o", ""], "argument -o/--output: must be a path, got an empty string"),
    (["trace", "merge", TRACE, "-o", "m.json", "--offset-us", "x=5"], "argument --offset-us: expected R=US"),
    (["trace", "merge", TRACE, "-o", "m.json", "--offset-us", "1=abc"], "argument --offset-us: expected R=US"),
    (["trace", "overlap", TRACE, "--rules", ""], "argument --rules: must be a path, got an empty string"),
    # profile
    (["profile", "--tp", "0"], "argument --tp: expected comma-separated positive integers, got '0'"),
    (["profile", "--tp", "1,0"], "argument --tp: expected comma-separated positive integers, got '1,0'"),
    (["profile", "--seq-len", "abc"], "argument --seq-len: expected comma-separated positive integers, got 'abc'"),
    (["profile", "--num-layers", "0"], f"argument --num-layers: {POS} '0'"),
    (["profile", "--warmup", "-1"], f"argument --warmup: {NONNEG} '-1'"),
    (["profile", "--repeats", "0"], f"argument --repeats: {POS} '0'"),
    (["profile", "--case-timeout", "-5"], "argument --case-timeout: must be a positive number, got '-5'"),
    (["profile", "--num-gpus", "0"], f"argument --num-gpus: {POS} '0'"),
    (["profile", "--output-dir", ""], "argument --output-dir: must be a path, got an empty string"),
    # validate
    (["validate", "--timeout-s", "-1"], "argument --timeout-s: must be a positive number, got '-1'"),
    (["validate", "--timeout-s", "0"], "argument --timeout-s: must be a positive number, got '0'"),
    (["validate", "--steps", "0"], f"argument --steps: {POS} '0'"),
    (["validate", "--warmup-steps", "-1"], f"argument --warmup-steps: {NONNEG} '-1'"),
    (["validate", "--num-layers", "0"], "argument --num-layers: must be a positive integer, max-fit or min-oom"),
    (["validate", "--num-layers", "half"], "argument --num-layers: must be a positive integer, max-fit or min-oom"),
    (["validate", "--layouts-per-job", "-1"], f"argument --layouts-per-job: {NONNEG} '-1'"),
    (["validate", "--available-gpus", "-1"], f"argument --available-gpus: {NONNEG} '-1'"),
    (["validate", "--recompute-num-layers", "-1"], f"argument --recompute-num-layers: {NONNEG} '-1'"),
    (["validate", "--nodes", "0"], f"argument --nodes: {POS} '0'"),
    (["validate", "--gpus-per-node", "0"], f"argument --gpus-per-node: {POS} '0'"),
    (["validate", "--tp", "0"], f"argument --tp: {POS} '0'"),
    (["validate", "--global-batch-size", "0"], f"argument --global-batch-size: {POS} '0'"),
    (["validate", "--output-dir", ""], "argument --output-dir: must be a path, got an empty string"),
]


@pytest.mark.parametrize(("argv", "expected"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_value_is_a_one_line_usage_error(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written: the command must not start
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    assert expected in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("mat") and "(see mat " in err
    assert not out and not any(tmp_path.iterdir())


GOOD = [
    # values that are legitimately 0 (or negative) parse and reach the command unchanged
    (["validate", "--layouts-per-job", "0"], "layouts_per_job", 0),  # 0: one torchrun job per world size
    (["validate", "--warmup-steps", "0"], "warmup_steps", 0),
    (["validate", "--available-gpus", "0"], "available_gpus", 0),  # every layout recorded as failed
    (["validate", "--recompute-num-layers", "0"], "recompute_num_layers", 0),  # block method: no layer recomputed
    (["validate", "--num-layers", "max-fit"], "num_layers", "max-fit"),
    (["validate", "--num-layers", "12"], "num_layers", "12"),
    (["overlap", "--verify-passes", "0"], "verify_passes", 0),
    (["overlap", "--warmup", "0"], "warmup", 0),
    (["overlap", "--scaling-tolerance", "0"], "scaling_tolerance", 0.0),
    (["overlap", "--overlap-threshold", "1"], "overlap_threshold", 1.0),
    (["overlap", "tune", "--verify-passes", "0"], "verify_passes", 0),
    (["profile", "--warmup", "0"], "warmup", 0),
    (["profile", "--tp", "1, 2,4"], "tp", [1, 2, 4]),
    (["estimate", "--gpu", "H100-SXM", "--memory-margin", "0"], "memory_margin", 0.0),
    (["plan", "--gpu", "H100-SXM", "--memory-margin", "0.1"], "memory_margin", 0.1),
    (["trace", "memory", "x.pickle", "--device", "0"], "device", 0),
    (["trace", "merge", TRACE, "-o", "m.json", "--offset-us", "1=-2.5"], "offset_us", ["1=-2.5"]),
    (["estimate", "--gpu", "H100-SXM", "--tp", "8"], "tp", 8),
]


@pytest.mark.parametrize(("argv", "dest", "value"), GOOD, ids=[" ".join(a) for a, _, _ in GOOD])
def test_legitimate_zero_and_edge_values_parse(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_overlap_defaults_survive_the_tune_subcommand():
    """`mat overlap tune` keeps the defaults and what was given before `tune`."""
    args = build_parser().parse_args(["overlap", "--repeats", "4", "tune", "--model", "Qwen3-8B"])
    assert (args.action, args.repeats, args.model, args.num_splits, args.case_timeout) == (
        "tune",
        4,
        ["Qwen3-8B"],
        [2, 4, 8],
        60.0,
    )


@pytest.mark.parametrize(
    ("func", "text"),
    [
        (argtypes.positive_int, "0"),
        (argtypes.non_negative_int, "-1"),
        (argtypes.positive_float, "-0.0"),
        (argtypes.non_negative_float, "-inf"),
        (argtypes.fraction, "1.01"),
        (argtypes.margin_fraction, "1.0"),
        (argtypes.non_empty_path, ""),
        (argtypes.positive_int_list, ","),
        (argtypes.num_layers_or_edge, "-3"),
        (argtypes.rank_offset, "1"),
    ],
)
def test_argtypes_refuse(func, text):
    with pytest.raises(argparse.ArgumentTypeError):
        func(text)
