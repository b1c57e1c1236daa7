"""The CUDA_DEVICE_MAX_CONNECTIONS a launch exports: read as written for the launch itself (`mat estimate`, the plan's
row for the launch, `mat validate`), checked against Megatron-LM's asserts (validate_args,
megatron/training/arguments.py), and never applied to the plan's candidates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.megatron_args import launch_device_max_connections, read_launch_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launches"
REAL = FIXTURES / "real" / "megatron"
TP2 = (
    "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 4096 --num-attention-heads 32 "
    "--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 64 "
    "--tensor-model-parallel-size 2 --sequence-parallel --bf16 --vocab-size 128256{extra}\n"
)
# Mixtral-shaped, CP 2 x EP 4 with the all-to-all overlap (which sets 8 on Hopper unless the launch says otherwise)
MOE_CP2 = (
    "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 4096 --ffn-hidden-size 14336 "
    "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope --seq-length 32768 "
    "--max-position-embeddings 32768 --vocab-size 32000 --num-experts 8 --moe-router-topk 2 "
    "--moe-token-dispatcher-type alltoall --moe-grouped-gemm --moe-permute-fusion --expert-model-parallel-size 4 "
    "--context-parallel-size 2 --overlap-moe-expert-parallel-comm --micro-batch-size 1 --global-batch-size 32 "
    "--bf16 --use-distributed-optimizer\n"
)


def _write(tmp_path: Path, name: str, text: str, connections: str | None) -> str:
    path = tmp_path / name
    path.write_text((f"export CUDA_DEVICE_MAX_CONNECTIONS={connections}\n" if connections else "") + text)
    return str(path)


def _estimate(capsys, launch: str, gpu: str = "H100-SXM") -> dict:
    assert main(["estimate", "--megatron-args", launch, "--gpu", gpu, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "script",
    [
        "NVIDIA__Megatron-LM__examples__gpt3__train_gpt3_175b_distributed.sh",  # export CUDA_DEVICE_MAX_CONNECTIONS=1
        "NVIDIA__Megatron-LM__examples__llama__train_llama3_8b_h100_fp8.sh",  # ${CUDA_DEVICE_MAX_CONNECTIONS:-1}
    ],
)
def test_public_launches_export_one(script):
    assert launch_device_max_connections(read_launch_file(str(REAL / script), {}, False)) == 1


def test_nvidias_qwen3_recipe_exports_the_overlaps_eight():
    launch = read_launch_file(str(FIXTURES / "qwen3_235b_a22b_h100_256gpu_fp8cs.sh"), {}, False)
    assert launch_device_max_connections(launch) == 8


@pytest.mark.parametrize("value", ["x", "0", "33"])
def test_a_value_outside_cudas_range_is_one_line(tmp_path, capsys, value):
    launch = _write(tmp_path, "l.sh", TP2.format(extra=""), value)
    assert main(["estimate", "--megatron-args", launch, "--gpu", "H100-SXM"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mat: error: CUDA_DEVICE_MAX_CONNECTIONS: must be an integer 1-32")
    with pytest.raises(ConfigError):
        launch_device_max_connections(read_launch_file(launch, {}, False))


def test_tp_at_eight_before_blackwell_is_refused_as_megatron_lm_refuses_it(tmp_path, capsys):
    launch = _write(tmp_path, "l.sh", TP2.format(extra=""), "8")
    assert main(["estimate", "--megatron-args", launch, "--gpu", "H100-SXM"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mat: error: CUDA_DEVICE_MAX_CONNECTIONS: is 8: Megatron-LM asserts 1 with tensor or context parallelism "
        "before Blackwell"
    )
    _estimate(capsys, launch, "B200")  # the requirement "no longer exists since the Blackwell architecture"
    # `mat validate` of the same launch: refused as estimate refuses it, on that GPU
    dry = ["validate", "--megatron-args", launch, "--dry-run", "--json", "--output-dir", str(tmp_path / "v")]
    assert main([*dry, "--gpu", "H100-SXM"]) == 2
    assert capsys.readouterr().err.strip().startswith("mat: error: CUDA_DEVICE_MAX_CONNECTIONS: is 8: Megatron-LM")
    assert main([*dry, "--gpu", "B200"]) == 0
    assert json.loads(capsys.readouterr().out)["layouts"][0]["layout"]["cuda_device_max_connections"] == 8
    fsdp = _write(tmp_path, "f.sh", TP2.format(extra=" --use-megatron-fsdp"), "8")
    _estimate(capsys, fsdp)  # FSDP beside TP only warns


def test_fsdp_at_one_is_refused(tmp_path, capsys):
    launch = _write(tmp_path, "f.sh", TP2.format(extra=" --use-megatron-fsdp"), "1")
    assert main(["estimate", "--megatron-args", launch, "--gpu", "H100-SXM"]) == 2
    assert "FSDP" in capsys.readouterr().err


def test_the_plan_shows_a_refused_launch_and_still_plans(tmp_path, capsys):
    launch = _write(tmp_path, "l.sh", TP2.format(extra=""), "8")
    out = tmp_path / "p"
    args = ["plan", "--megatron-args", launch, "--gpu", "H100-SXM", "--no-chart", "--top", "2", "--json"]
    assert main(args + ["--output-dir", str(out)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["current_run"]["refused"].startswith("CUDA_DEVICE_MAX_CONNECTIONS: is 8")
    assert plan["candidates"]


def test_the_overlap_beside_cp_at_one_is_priced_and_said_at_one(tmp_path, capsys):
    """At 1 the CP ring hides behind the attention chunks (`estimate.cp_ring_hides`); the export wins over the 8 the
    layout would otherwise be given, and the note says which value it priced."""
    one = _estimate(capsys, _write(tmp_path, "one.sh", MOE_CP2, "1"))
    eight = _estimate(capsys, _write(tmp_path, "eight.sh", MOE_CP2, "8"))
    unset = _estimate(capsys, _write(tmp_path, "unset.sh", MOE_CP2, None))
    assert one["step_time_s"] < eight["step_time_s"] == unset["step_time_s"]
    (note,) = [n for n in one["notes"] if "CUDA_DEVICE_MAX_CONNECTIONS" in n]
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in note and "ring exchange is predicted hidden" in note


def _validate_dry_run(tmp_path: Path, capsys, launch: str, name: str) -> dict:
    args = ["validate", "--megatron-args", launch, "--gpu", "H100-SXM", "--dry-run", "--json"]
    assert main(args + ["--output-dir", str(tmp_path / name)]) == 0
    (layout,) = json.loads(capsys.readouterr().out)["layouts"]
    return layout


def test_validate_runs_the_launchs_value(tmp_path, capsys):
    """The runner sets the launch's value in its workers (`Layout.process_max_connections`) and predicts with it."""
    one = _validate_dry_run(tmp_path, capsys, _write(tmp_path, "one.sh", MOE_CP2, "1"), "v1")
    unset = _validate_dry_run(tmp_path, capsys, _write(tmp_path, "unset.sh", MOE_CP2, None), "v0")
    assert one["layout"]["cuda_device_max_connections"] == 1 and unset["layout"]["cuda_device_max_connections"] is None
    assert one["predicted"]["step_time_s"] < unset["predicted"]["step_time_s"]
