"""`--megatron-args`: estimate / theory / plan / validate read a launch; bad launches are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.cli import main

LAUNCHES = Path(__file__).resolve().parents[1] / "fixtures" / "launches"
LLAMA_405B = str(LAUNCHES / "llama31_405b_h100_1024gpu_fp8cs.sh")
SMALL = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
    "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope "
    "--vocab-size 128256 --seq-length 8192 --max-position-embeddings 8192 --tensor-model-parallel-size 8 "
    "--sequence-parallel --micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer "
    "--hidden-dropout 0 --attention-dropout 0 --cuda-graph-impl transformer_engine\n"
)


def test_estimate_reads_a_launch_and_lists_what_it_does_not_model(capsys):
    assert main(["estimate", "--megatron-args", LLAMA_405B, "--gpu", "H100-SXM", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inputs"]["parallel"]["pipeline_layout"]["describe"] == "embedding+loss accounted"
    assert data["inputs"]["num_gpus"] == 1024 and data["inputs"]["overlap_grad_reduce"] is True
    assert "--overlap-param-gather-with-optimizer-step" in data["not_modelled"]


def test_plan_puts_your_launch_beside_the_best_with_the_flags_to_change(tmp_path, capsys):
    launch = tmp_path / "launch.sh"
    launch.write_text(SMALL)
    args = ["plan", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--no-chart", "--top", "2"]
    assert main(args + ["--output-dir", str(tmp_path / "p")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # CUDA graphs are modelled: the launch's TE graphs are not a "not modelled" note, and every candidate keeps them
    assert "your launch:" in out and "not modelled: --cuda-graph-impl" not in out
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    current = plan["current_run"]
    assert current["parallel"]["tp"] == 8 and current["speedup_of_best"] >= 1.0
    if current["speedup_of_best"] > 1.0:
        assert current["flag_changes"] and (tmp_path / "p" / "flag_changes.txt").exists()


def test_theory_and_validate_dry_run_take_a_launch(tmp_path, capsys):
    launch = tmp_path / "launch.sh"
    launch.write_text(SMALL)
    assert main(["theory", "--megatron-args", str(launch), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["tp"] == 8
    args = ["validate", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--dry-run"]
    assert main(args + ["--output-dir", str(tmp_path / "v"), "--num-layers", "4"]) == 0
    assert "tp8" in capsys.readouterr().out


def test_bad_launches_and_conflicting_options_are_one_line_errors(tmp_path, capsys):
    launch = tmp_path / "launch.sh"
    launch.write_text(SMALL.replace("--swiglu", "--swigloo"))
    assert main(["estimate", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--strict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown Megatron-LM flag --swigloo (did you mean --swiglu?)" in err
    launch.write_text(SMALL)
    assert main(["estimate", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--tp", "2"]) == 2
    assert "--tp goes in the Megatron-LM launch (--tensor-model-parallel-size)" in capsys.readouterr().err
    assert main(["estimate", "--megatron-args", str(tmp_path / "missing.sh"), "--gpu", "H100-SXM"]) == 2
    assert "megatron_args: cannot read" in capsys.readouterr().err


def test_plan_of_a_launch_that_does_not_fit_names_the_fastest_layout_that_does(tmp_path, capsys):
    launch = tmp_path / "launch.sh"
    launch.write_text(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
        "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
        "--position-embedding-type rope --seq-length 8192 --micro-batch-size 8 --global-batch-size 64 "
        "--vocab-size 128256 --bf16 --use-distributed-optimizer\n"
    )
    out_dir = tmp_path / "p"
    assert main(["plan", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--no-chart", "--top", "1",
                 "--output-dir", str(out_dir)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "your launch does not fit" in out and "the fastest layout that does" in " ".join(out.split())
    plan = json.loads((out_dir / "plan.json").read_text())
    assert not plan["current_run"]["fits"] and plan["current_run"]["flag_changes"]
    assert "does not fit; rank 1 is the fastest layout that does" in (out_dir / "flag_changes.txt").read_text()


@pytest.mark.parametrize("command", ["estimate", "plan", "rlhf"])
def test_a_var_without_a_value_is_one_line_exit_2(tmp_path, capsys, command):
    launch = tmp_path / "launch.sh"
    launch.write_text("--num-layers 2\n")
    flag = "--verl-args" if command == "rlhf" else "--megatron-args"
    with pytest.raises(SystemExit) as info:
        main([command, flag, str(launch), "--gpu", "H100-SXM", "--var", "TP"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and "argument --var: expected NAME=VALUE, got 'TP'" in err[-1]


def test_megatrons_default_dropout_is_said_where_a_launch_leaves_it(tmp_path, capsys):
    """A launch without --hidden-dropout / --attention-dropout gets Megatron-LM's 0.1 for both, which the step and
    memory price (masks, dropout kernels): estimate's JSON and plan's 'your launch' say so; with 0 given, nothing."""
    default = tmp_path / "default.sh"
    default.write_text(SMALL.replace("--hidden-dropout 0 --attention-dropout 0 ", ""))
    assert main(["estimate", "--megatron-args", str(default), "--gpu", "H100-SXM", "--json"]) == 0
    notes = [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("dropout:")]
    assert len(notes) == 1 and "hidden 0.1, attention 0.1" in notes[0]
    args = ["plan", "--megatron-args", str(default), "--gpu", "H100-SXM", "--no-chart", "--top", "1"]
    assert main(args + ["--output-dir", str(tmp_path / "p")]) == 0
    assert " ".join(capsys.readouterr().out.split()).count("note: dropout:") == 1
    given = tmp_path / "given.sh"
    given.write_text(SMALL)
    assert main(["estimate", "--megatron-args", str(given), "--gpu", "H100-SXM", "--json"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("dropout:")]


def test_plan_and_estimate_json_carry_the_run_settings_their_text_prints(tmp_path, capsys):
    """Every run setting the text's 'run settings assumed' line prints (allocator, overlaps, fusions, TP overlap, the
    dropout the model runs with, what paces the host) is a `run_settings` entry of plan --json, plan.json and
    estimate --json: a launch without dropout flags runs Megatron-LM's 0.1, which costs ~11% of the step."""
    default = tmp_path / "default.sh"
    default.write_text(SMALL.replace("--hidden-dropout 0 --attention-dropout 0 ", ""))
    args = ["plan", "--megatron-args", str(default), "--gpu", "H100-SXM", "--no-chart", "--top", "1"]
    assert main([*args, "--output-dir", str(tmp_path / "text")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert main([*args, "--json", "--output-dir", str(tmp_path / "json")]) == 0
    settings = json.loads(capsys.readouterr().out)["run_settings"]
    assert settings["hidden_dropout"] == 0.1 and settings["attention_dropout"] == 0.1
    assert settings["tp_comm_overlap"] is False and settings["host_floor"] == "default"
    assert settings["host_pace_range"] == [0.54, 2.23]
    assert json.loads((tmp_path / "json" / "plan.json").read_text())["run_settings"] == settings
    assert "hidden dropout 0.1, attention dropout 0.1" in text and "host floor default" in text
    assert main(["estimate", "--megatron-args", str(default), "--gpu", "H100-SXM", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_settings"] == settings
    given = tmp_path / "given.sh"
    given.write_text(SMALL)
    assert main(["estimate", "--megatron-args", str(given), "--gpu", "H100-SXM", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_settings"]["hidden_dropout"] == 0.0


def test_plan_json_carries_the_notes_it_prints_under_your_launch(tmp_path, capsys):
    """The launch's own notes (dropout it takes from Megatron-LM's defaults, the host it waits on ...) are in
    plan.json's current_run as in the text, which printed them while the JSON dropped them."""
    launch = tmp_path / "launch.sh"
    launch.write_text(SMALL.replace("--hidden-dropout 0", "").replace("--attention-dropout 0", ""))
    args = ["plan", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--no-chart", "--top", "1"]
    assert main(args + ["--output-dir", str(tmp_path / "p")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    notes = json.loads((tmp_path / "p" / "plan.json").read_text())["current_run"]["notes"]
    assert any(note.startswith("dropout:") for note in notes)
    for note in notes:
        assert " ".join(note.split())[:60] in out
