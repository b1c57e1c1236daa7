"""Inputs that once expanded without bound or divided by zero: one line naming the field and the limit, exit 2, and
the legitimate forms beside them still read."""

from __future__ import annotations

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.megatron_args import moe_layer_pattern
from megatron_autotuner.specs.pipeline import parse_layout_string

SMALL = (
    "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
    "--micro-batch-size 1 --global-batch-size 8 "
)


def _one_line_error(capsys, argv: list[str], field: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"mat: error: {field}: "), err
    return err


@pytest.mark.parametrize("layout", ["Et*99999999999L", "E(t|)*99999999999999999999999L", "E" + "t" * 100_001 + "L"])
def test_a_layout_string_that_unrolls_past_the_limit_is_refused(capsys, layout):
    argv = ["estimate", "--model", "Llama-3.1-8B", "--gpu", "H100-SXM", "--num-gpus", "8", "--pipeline-layout", layout]
    assert "100000" in _one_line_error(capsys, argv, "pipeline_model_parallel_layout")


def test_layout_strings_of_real_size_still_unroll():
    assert len(parse_layout_string("Et|(tt|)*30mL")) == 32
    assert parse_layout_string("Et*3|t*4L") == ["Ettt", "ttttL"]


@pytest.mark.parametrize(
    ("freq", "problem"),
    [
        ("[1]*100000000000", "limit 10000"),
        ("+".join(["[1]"] * 200_000), "limit 4096"),
        ("2*[1,0]*3000", "limit 10000"),
        ("[[1]*3]*2", "flat list"),
    ],
)
def test_a_moe_layer_freq_expression_past_its_limits_is_refused(capsys, tmp_path, freq, problem):
    launch = tmp_path / "launch.txt"
    launch.write_text(SMALL + f"--num-experts 4 --moe-layer-freq {freq}\n")
    argv = ["estimate", "--megatron-args", str(launch), "--gpu", "H100-SXM"]
    assert problem in _one_line_error(capsys, argv, "moe_layer_freq")


def test_long_and_real_moe_layer_freq_expressions_still_read():
    assert len(moe_layer_pattern("+".join(["[1]"] * 1000), 1000)) == 1000  # a 1000-term chain: walked, not recursed
    assert moe_layer_pattern("[0]*3+[1]*58", 61) == (0, 0, 0) + (1,) * 58  # DeepSeek-V3
    assert moe_layer_pattern("([0]+[1])*2", 4) == (0, 1, 0, 1)
    with pytest.raises(ConfigError):
        moe_layer_pattern("[1]*3", 4)


@pytest.mark.parametrize("flag", ["--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"])
def test_zero_virtual_stage_settings_are_refused(capsys, tmp_path, flag):
    launch = tmp_path / "launch.txt"
    launch.write_text(SMALL + f"--pipeline-model-parallel-size 2 {flag} 0\n")
    argv = ["estimate", "--megatron-args", str(launch), "--gpu", "H100-SXM"]
    assert "positive integer, got 0" in _one_line_error(capsys, argv, flag[2:].replace("-", "_"))


ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (ALIAS_BOMB, "unfolds its aliases to more than 1000000 values (the limit)"),  # 9^9 values from 760 bytes
        ("data:\n  train_batch_size: 32\nnest: " + "[" * 5000 + "]" * 5000 + "\n", "is nested deeper than 64 levels"),
    ],
)
def test_a_verl_yaml_past_the_yaml_limits_is_refused(capsys, tmp_path, text, problem):
    path = tmp_path / "verl.yaml"
    path.write_text(text)
    assert problem in _one_line_error(capsys, ["rlhf", "--verl-args", str(path), "--gpu", "H100-SXM"], "verl_args")


def test_a_yaml_file_past_the_limits_is_one_config_error(tmp_path):
    from megatron_autotuner.files import read_yaml_bounded

    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(ConfigError, match=r"hardware_file: .*bomb.yaml unfolds its aliases to more than 1000000"):
        read_yaml_bounded(path, "hardware_file")


def test_yaml_with_a_few_aliases_still_reads():
    from megatron_autotuner.files import load_yaml_bounded

    assert load_yaml_bounded("a: &x [1, 2]\nb: *x\nc: {d: 1}") == {"a": [1, 2], "b": [1, 2], "c": {"d": 1}}
    assert load_yaml_bounded("") is None


VERL = (
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct data.max_prompt_length=512 data.max_response_length=1024 "
    "actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 "
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 actor_rollout_ref.actor.ppo_mini_batch_size=16 "
    "algorithm.adv_estimator=grpo "
)


@pytest.mark.parametrize(
    ("extra", "field", "problem"),
    [
        ("data.train_batch_size=null", "data.train_batch_size", "must be an integer >= 1, got null"),
        (
            "data.train_batch_size=32 actor_rollout_ref.rollout.tensor_model_parallel_size=3",
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            "3 does not divide the 8 GPUs",
        ),
        (
            "data.train_batch_size=32 actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.actor.strategy",
            "mat rlhf models verl's Megatron engine only",
        ),
        (
            "data.train_batch_size=32 actor_rollout_ref.rollout.gpu_memory_utilization=high",
            "actor_rollout_ref.rollout.gpu_memory_utilization",
            "must be a number, got 'high'",
        ),
    ],
)
def test_verl_values_verl_would_refuse_are_one_line_errors(capsys, tmp_path, extra, field, problem):
    path = tmp_path / "verl.txt"
    path.write_text(VERL + extra + "\n")
    assert problem in _one_line_error(capsys, ["rlhf", "--verl-args", str(path), "--gpu", "H100-SXM"], field)


@pytest.mark.parametrize(
    ("extra", "product"),
    [("data.train_batch_size=32 actor_rollout_ref.rollout.n=100000", "32 x 100000 = 3200000"),
     ("data.train_batch_size=1000000000", "1000000000 x 4 = 4000000000")],
)  # fmt: skip
def test_a_step_of_more_sequences_than_the_limit_is_refused_before_any_work(capsys, tmp_path, extra, product):
    """The audit: rollout.n=100000 ran past 300 s, data.train_batch_size=1000000000 grew to 8 GiB."""
    path = tmp_path / "verl.txt"
    path.write_text(VERL + extra + "\n")
    err = _one_line_error(
        capsys, ["rlhf", "--verl-args", str(path), "--gpu", "H100-SXM"],
        "data.train_batch_size x actor_rollout_ref.rollout.n",
    )  # fmt: skip
    assert f"{product} sequences per step; at most 65536" in err
    argv = ["plan", "--model", "Qwen3-0.6B", "--gpu", "H100-SXM", "--num-gpus", "8", "--global-batch-size",
            "100000", "--prompt-len", "512:1024", "--response-len", "256:512", "--no-chart",
            "--output-dir", str(tmp_path / "p")]  # fmt: skip
    assert "at most 65536 are sampled" in _one_line_error(capsys, argv, "global_batch_size")


def test_validate_report_only_on_a_file_or_a_missing_folder_is_a_one_line_error(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out in (afile, tmp_path / "missing"):
        argv = ["validate", "--report-only", "--output-dir", str(out), "--model", "Qwen3-0.6B", "--seq-len", "128"]
        assert "is not a folder" in _one_line_error(capsys, [*argv, "--gpu", "H100-SXM"], "output_dir")


def test_a_sequence_longer_than_the_limit_is_refused(capsys, tmp_path):
    base = ["plan", "--model", "Qwen3-0.6B", "--gpu", "H100-SXM", "--num-gpus", "8", "--mode", "forward",
            "--global-batch-size", "64", "--no-chart", "--output-dir", str(tmp_path / "p")]  # fmt: skip
    err = _one_line_error(
        capsys, [*base, "--prompt-len", "512:99999999999", "--response-len", "256:512"], "prompt_len.max"
    )
    assert "above the limit of 4194304 per sequence" in err
    histogram = tmp_path / "lengths.csv"
    histogram.write_text("100,5\n99999999999,1\n")
    assert "above the limit" in _one_line_error(
        capsys, [*base, "--length-histogram", str(histogram)], "length_histogram"
    )


_HEAD = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
    "--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 "
    "--vocab-size 128256"
)


def _read_timed(tmp_path, text: str):
    import time

    from megatron_autotuner.specs.megatron_args import read_launch_file

    path = tmp_path / "launch.sh"
    path.write_text(text)
    start = time.process_time()  # CPU time: the tests run two at a time
    launch = read_launch_file(str(path))
    return launch, time.process_time() - start


def test_reading_a_launch_is_linear_in_its_flags(tmp_path):
    """128,000 flags (2.5 MB, under the 4 MiB file limit) read in seconds: argparse's option matching is quadratic
    in the options given (8,000 took 4.8 s of its 6), so each option reaches it once, its last value as
    Megatron-LM's parser keeps (2.8 s here, measured); and an array grown by 40,000 `+=` no longer copies itself
    each time (10.5 s before, 2 s now)."""
    flags = " \\\n".join(f"    --lr {i}e-5" for i in range(128_000))
    launch, seconds = _read_timed(tmp_path, f"{_HEAD} \\\n{flags}\n")
    assert seconds < 15
    assert launch.args["lr"] == "127999e-5" and launch.args["num_layers"] == "32"
    assert any(n.startswith("--lr given more than once") for n in launch.notes)
    grown = "ARGS=()\n" + "".join(f"ARGS+=(--lr {i}e-5)\n" for i in range(40_000)) + f'{_HEAD} "${{ARGS[@]}}"\n'
    launch, seconds = _read_timed(tmp_path, grown)
    assert seconds < 8 and launch.args["lr"] == "39999e-5"


def test_a_string_grown_past_the_copy_bound_is_refused(tmp_path):
    """`A="$A ..."` repeated copies the value each time (quadratic, in bash too): past 1 GiB of built values the
    read stops with one line, in about a second, instead of running for minutes."""
    grown = 'A=""\n' + "".join(f'A="$A --lr {i}e-5"\n' for i in range(100_000)) + f"{_HEAD} $A\n"
    with pytest.raises(ConfigError, match="GiB of variable values"):
        _read_timed(tmp_path, grown)
    launch, _ = _read_timed(
        tmp_path, 'A=""\n' + "".join(f'A="$A --lr {i}e-5"\n' for i in range(2_000)) + f"{_HEAD} $A\n"
    )
    assert launch.args["lr"] == "1999e-5"


def test_a_long_double_quoted_string_reads_in_linear_time(tmp_path):
    """Double-quoted values were appended a character at a time, which is quadratic (400 KB took 3.7 s, 3.9 MB ran
    past 120 s): a 1 MB value now reads in about a second, and a 3.9 MB one (under the 4 MiB file limit) meets the
    word bound in seconds."""
    launch, seconds = _read_timed(tmp_path, f'NOTE="{"x" * 1_000_000} \\$HOME \\q"\n{_HEAD} --lr "1e-5"\n')
    assert seconds < 5
    assert launch.args["lr"] == "1e-5" and launch.args["num_layers"] == "32"
    import time

    start = time.process_time()
    with pytest.raises(ConfigError, match="a word grows past"):
        _read_timed(tmp_path, f'NOTE="{"x" * 3_900_000}"\n{_HEAD}\n')
    assert time.process_time() - start < 10


def test_a_moe_layer_freq_entry_other_than_0_or_1_is_refused():
    """megatron-core raises "Invalid layer pattern" on such an entry (gpt_layer_specs.py); it had been read as MoE."""
    with pytest.raises(ConfigError, match="0 / 1"):
        moe_layer_pattern("[2]*24", 24)
    assert moe_layer_pattern("[1,0]*12", 24) == (1, 0) * 12
