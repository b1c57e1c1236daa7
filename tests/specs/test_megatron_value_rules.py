"""A launch's values checked as Megatron-LM's argparse and validate_args check them (the catalogue's types and
choices, regenerated from Megatron-LM's parser): refused in one line where they change the prediction, noted where
they do not."""

from __future__ import annotations

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.specs.megatron_args import catalog, launch_to_specs, read_launch

SMALL = (
    "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
    "--global-batch-size 8 "
)


@pytest.mark.parametrize(
    ("extra", "field", "problem"),
    [
        ("--micro-batch-size 0", "micro_batch_size", "must be a positive integer, got 0"),  # was predicted as 1
        ("--micro-batch-size 1 --kv-channels 0", "kv_channels", "must be a positive integer, got 0"),
        ("--micro-batch-size two", "micro_batch_size", "must be an integer, got 'two'"),
        (
            "--micro-batch-size 1 --fp8-format hybrid --fp8-recipe bogus",  # was predicted as blockwise
            "fp8_recipe",
            "--fp8-recipe 'bogus' is not one of Megatron-LM's choices (tensorwise, delayed, mxfp8, blockwise, custom)",
        ),
        ("--micro-batch-size 1 --recompute-granularity some", "recompute_granularity", "(full, selective)"),
    ],
)
def test_values_megatron_lm_refuses_are_refused(capsys, tmp_path, extra, field, problem):
    path = tmp_path / "launch.txt"
    path.write_text(SMALL + extra + "\n")
    assert main(["estimate", "--megatron-args", str(path), "--gpu", "H100-SXM"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"mat: error: {field}: ") and problem in err, err


def test_values_of_forks_that_do_not_change_a_step_are_notes():
    launch = read_launch(SMALL + "--micro-batch-size 1 --tokenizer-type PretrainedFromHF --normalization rmsnorm")
    assert any(n.startswith("tokenizer_type: --tokenizer-type 'PretrainedFromHF' is not one") for n in launch.notes)
    assert launch_to_specs(launch).model.normalization == "RMSNorm"  # Megatron-DeepSpeed's spelling, mapped
    alibi = launch_to_specs(read_launch(SMALL + "--micro-batch-size 1 --position-embedding-type alibi"))
    assert any("ALiBi's attention bias is not modelled" in n for n in alibi.notes)


def test_the_catalogue_knows_megatron_lm_types_and_choices():
    by_dest = catalog()[2]
    assert by_dest["micro_batch_size"].type == "int" and by_dest["lr"].type == "float"
    assert by_dest["fp8_recipe"].choices == ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
    assert by_dest["normalization"].choices == ("LayerNorm", "RMSNorm")


def test_a_launchs_model_is_named_after_its_file(tmp_path):
    from megatron_autotuner.specs.megatron_args import read_launch_file

    path = tmp_path / "pretrain_small.sh"
    path.write_text(SMALL + "--micro-batch-size 1\n")
    assert launch_to_specs(read_launch_file(str(path))).model.name == "pretrain_small (4L 256h)"
    assert launch_to_specs(read_launch(SMALL + "--micro-batch-size 1")).model.name == "megatron-args (4L 256h)"
