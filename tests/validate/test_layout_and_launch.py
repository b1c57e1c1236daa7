"""Layouts, torchrun / Slurm commands, ordering (pure Python)."""

import json
import os
from pathlib import Path

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload
from megatron_autotuner.validate.launcher import (
    WORKER_MODULE,
    order_for_job,
    slurm_script,
    stand_in_command,
    torchrun_command,
)
from megatron_autotuner.validate.layout import Layout, load_layouts_file


def test_layout_defaults_ids_and_reduced_model():
    a = Layout(model="Qwen3-8B", seq_length=4096, num_gpus=2, tp=2, num_layers=4)
    assert a.sequence_parallel is True and a.parallel().dp == 1 and a.workload().global_batch_size == 1
    assert a.model_spec().num_layers == 4 and a.model_spec().name == "Qwen3-8B"
    assert a.layout_id == Layout.from_dict(json.loads(json.dumps(a.to_dict()))).layout_id
    assert a.layout_id == a.replace(name="renamed").layout_id  # the label is not part of the id
    assert a.layout_id != a.replace(steps=6).layout_id
    # expandable segments by default, said in the label; the default allocator is the id's baseline (earlier runs)
    assert a.expandable_segments and a.label == "tp2 sp dp1 mbs1 expandable"
    assert a.replace(expandable_segments=False).label == "tp2 sp dp1 mbs1"
    assert a.layout_id != a.replace(expandable_segments=False).layout_id
    b = Layout(model="Qwen3-8B", seq_length=4096, num_gpus=2, global_batch_size=8)
    assert b.num_microbatches == 4 and b.sequence_parallel is False


def test_layout_rejects_bad_input():
    with pytest.raises(ConfigError, match="not a layout field"):
        Layout.from_dict({"model": "Qwen3-8B", "seq_length": 8, "tpp": 2})
    with pytest.raises(ConfigError):
        Layout(model="Qwen3-8B", seq_length=4096, num_gpus=3, tp=2)
    with pytest.raises(ConfigError, match="steps"):
        Layout(model="Qwen3-8B", seq_length=4096, steps=0)
    with pytest.raises(ConfigError, match="pp"):
        Layout(model="Qwen3-8B", seq_length=4096, num_gpus=2, pp=2, num_layers=3).check()
    with pytest.raises(ConfigError, match="^grad_reduce_in_fp32: must be true or false, got 'no'$"):
        Layout.from_dict({"model": "Qwen3-8B", "seq_length": 8, "grad_reduce_in_fp32": "no"})
    for field in ("ddp_side_stream", "expandable_segments", "memory_history"):
        with pytest.raises(ConfigError, match=f"^{field}: must be true or false, got 1$"):
            Layout.from_dict({"model": "Qwen3-8B", "seq_length": 8, field: 1})


def test_from_configs_and_file(tmp_path):
    par = ParallelConfig(num_gpus=4, tp=2, pp=2, vpp=2, sequence_parallel=True)
    wl = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=8, recompute=RecomputeConfig("full"))
    lay = Layout.from_configs("Qwen3-8B", par, wl, num_layers=8, steps=2)
    assert (lay.tp, lay.pp, lay.vpp, lay.recompute, lay.steps, lay.num_layers) == (2, 2, 2, "full", 2, 8)
    assert lay.parallel() == par and lay.workload() == wl
    path = tmp_path / "l.json"
    path.write_text(
        json.dumps(
            {
                "gpu": "H200",
                "defaults": {"model": "Qwen3-8B", "num_layers": 4},
                "layouts": [{"seq_length": 4096}, {"seq_length": 8192, "num_gpus": 2}],
            }
        )
    )
    layouts, extra = load_layouts_file(path)
    assert extra == {"gpu": "H200"} and [x.seq_length for x in layouts] == [4096, 8192]
    path.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_layouts_file(path)


def test_torchrun_and_slurm(tmp_path):
    cmd = torchrun_command(2, tmp_path / "job.json", tmp_path, "cuda", timeout_s=90)
    assert "--standalone" in cmd and "--nproc-per-node=2" in cmd and WORKER_MODULE in cmd
    assert cmd[cmd.index("--timeout-s") + 1] == "90" and cmd[cmd.index("--layouts") + 1] == str(tmp_path / "job.json")
    multi = torchrun_command(16, tmp_path / "j.json", tmp_path, nnodes=2, rdzv_endpoint="node0:29500")
    assert "--nnodes=2" in multi and "--nproc-per-node=8" in multi and "--rdzv-endpoint=node0:29500" in multi
    with pytest.raises(ValueError):
        torchrun_command(16, tmp_path / "j.json", tmp_path, nnodes=2)
    script = slurm_script("/x/l.json", "/x/out", nodes=2, gpus_per_node=8, partition="gpu")
    assert script.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in script and "#SBATCH --partition=gpu" in script
    assert "srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=8" in script and WORKER_MODULE in script


def test_predicted_oom_layouts_run_last():
    a, b, c = (Layout(model="Qwen3-8B", seq_length=s) for s in (1024, 2048, 4096))
    assert order_for_job([a, b, c], {a.layout_id}) == [b, c, a]


def test_fp8_recipe_and_params_reach_the_run_and_the_prediction():
    """A layout's fp8 recipe / parameters go into megatron-core's TransformerConfig overrides and into the
    prediction's workload; at their defaults they leave the ids of earlier runs unchanged."""
    from megatron_autotuner.validate.runner import config_overrides

    base = Layout(model="Llama-3.1-8B", seq_length=8192, num_layers=4, precision="fp8")
    cs = base.replace(fp8_recipe="tensorwise", fp8_param=True)
    assert base.replace(fp8_recipe="delayed", fp8_param=False).layout_id == base.layout_id
    assert cs.layout_id != base.layout_id and cs.replace(fp8_param=False).layout_id != cs.layout_id
    assert base.label == "tp1 dp1 mbs1 fp8 expandable"
    assert cs.label == "tp1 dp1 mbs1 fp8-tensorwise fp8-params expandable"
    assert cs.workload().fp8_recipe == "tensorwise" and cs.workload().fp8_param is True
    overrides = config_overrides(cs, use_te=True, device="cuda")
    assert (overrides["fp8_recipe"], overrides["fp8_param"]) == ("tensorwise", True)
    assert "fp8_param" not in config_overrides(
        cs.replace(precision="bf16", fp8_recipe="delayed", fp8_param=False), True, "cuda"
    )
    with pytest.raises(ConfigError, match="^fp8_param: needs the distributed optimizer"):
        cs.replace(use_distributed_optimizer=False).check()
    planned = Layout.from_configs("Llama-3.1-8B", cs.parallel(), cs.workload(), num_layers=4)
    assert planned.workload() == cs.workload() and planned.label == cs.label


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "validation").glob("*_layouts.json"))
)
def test_committed_gpu_layout_files_are_valid(path):
    """Every layouts file a GPU evidence script runs loads, and megatron-core's rules accept each layout: a
    mistake found here costs nothing, one found on a leased GPU costs device time."""
    layouts, extra = load_layouts_file(path)
    assert layouts and extra.get("gpu")
    for lay in layouts:
        lay.check()
    assert len({lay.layout_id for lay in layouts}) == len(layouts)


def test_stand_in_command_and_worker_arguments():
    """A stand-in is the worker alone (no torchrun) with its rank and world size; the worker refuses a rank
    outside the world, or one without the other, before it imports torch."""
    from megatron_autotuner.validate import worker

    cmd = stand_in_command(Path("j.json"), Path("o"), 3, 4, python="py")
    assert cmd[:3] == ["py", "-m", WORKER_MODULE] and "torch.distributed.run" not in cmd
    assert cmd[-4:] == ["--stand-in-rank", "3", "--stand-in-world-size", "4"]
    for bad in (["--stand-in-rank", "2", "--stand-in-world-size", "2"], ["--stand-in-rank", "0"]):
        with pytest.raises(SystemExit):
            worker.main(["--layouts", "x.json", "--out-dir", "o", *bad])


def test_stand_in_ranks_are_the_first_of_each_pipeline_stage_and_refuse_moe_expert_groups():
    """megatron-core's default order tp-cp-ep-dp-pp: stage s starts at rank s x world / pp."""
    lay = Layout(model="Qwen3-8B", seq_length=4096, num_gpus=16, tp=2, pp=4, cp=2, global_batch_size=32)
    assert lay.stand_in_ranks() == [0, 4, 8, 12]
    assert lay.stand_in_ranks(all_ranks=True) == list(range(16))
    assert Layout(model="Qwen3-30B-A3B", seq_length=4096, num_gpus=2, pp=2).stand_in_ranks() == [0, 1]
    with pytest.raises(ConfigError, match="ep x etp = 2"):
        Layout(model="Qwen3-30B-A3B", seq_length=4096, num_gpus=2, ep=2).stand_in_ranks()


def test_every_rank_alone_stops_at_a_world_one_could_run_in_turn(capsys):
    """A fuzzed `--stand-in all --num-gpus 2**63-1` listed every rank's command and ran the machine out of memory."""
    from megatron_autotuner.cli import main

    huge = Layout(model="Qwen3-0.6B", seq_length=1024, num_gpus=2**20)
    assert huge.stand_in_ranks() == [0]
    with pytest.raises(ConfigError, match="at most 65536"):
        huge.stand_in_ranks(all_ranks=True)
    argv = ["validate", "--model", "Qwen3-0.6B", "--gpu", "H100-SXM", "--seq-len", "1024", "--stand-in", "all",
            "--num-gpus", str(2**63 - 1), "--dry-run"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("mat: error: stand_in: --stand-in all runs each of the")


def test_from_configs_keeps_packing_and_lengths():
    """A packed plan (verl's dynamic batching with variable lengths) validates packed: max_token_len, the prompt /
    response [mean, max] and the seed survive, and the layout's workload is the planned one."""
    from megatron_autotuner.specs.lengths import LengthDistribution, SequenceLengths

    lengths = SequenceLengths.from_mean_max((300.0, 1024), (1200.0, 3072), seed=7)
    par = ParallelConfig(num_gpus=2, tp=2, sequence_parallel=True)
    wl = Workload(seq_length=4096, global_batch_size=16, max_token_len=8192, lengths=lengths)
    lay = Layout.from_configs("Qwen3-8B", par, wl, num_layers=2)
    assert (lay.max_token_len, lay.prompt_length, lay.response_length, lay.length_seed) == (
        8192, (300.0, 1024), (1200.0, 3072), 7,
    )  # fmt: skip
    assert lay.packed and lay.workload() == wl and lay.parallel() == par
    # packed with every sequence seq_length long: the budget alone
    fixed = Layout.from_configs("Qwen3-8B", par, wl.replace(lengths=None), num_layers=2)
    assert fixed.max_token_len == 8192 and fixed.prompt_length is None and fixed.workload() == wl.replace(lengths=None)
    # a whole-sequence histogram has no [mean, max] form
    hist = SequenceLengths(sequence=LengthDistribution.from_histogram("length_histogram", [(1000, 3), (4000, 1)]))
    with pytest.raises(ConfigError, match="histogram"):
        Layout.from_configs("Qwen3-8B", par, wl.replace(lengths=hist), num_layers=2)


def test_the_worker_sets_what_expandable_segments_need(monkeypatch):
    """Before CUDA starts the worker adds expandable_segments:True to PYTORCH_CUDA_ALLOC_CONF (keeping the user's other
    settings), and beside transformer_engine CUDA graphs NCCL_GRAPH_REGISTER=0, which megatron-core's graph helper
    asserts; the default allocator gets neither."""
    from megatron_autotuner.validate.worker import set_allocator_config

    base = Layout(model="Qwen3-0.6B", seq_length=1024, num_layers=2)
    graphed = base.replace(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))
    for layout, conf, register in (
        (graphed, "max_split_size_mb:512,expandable_segments:True", "0"),
        (base, "max_split_size_mb:512,expandable_segments:True", None),
        (graphed.replace(expandable_segments=False), "max_split_size_mb:512", None),
    ):
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
        monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
        set_allocator_config([layout])
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == conf and os.environ.get("NCCL_GRAPH_REGISTER") == register


@pytest.mark.parametrize(
    "fields,field,says",
    [
        ({"moe_token_dispatcher": "flex"}, "moe_token_dispatcher", "alltoall, allgather"),
        ({"recompute": "selective", "recompute_modules": "moe"}, "recompute_modules", "list of module names"),
        ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["moe"]}, "cuda_graph_scope", "drop-and-pad"),
    ],
)
def test_layout_fields_a_cli_audit_found_misread(fields, field, says):
    """A layouts file's flex dispatcher was refused under the ParallelConfig's field with names the runner refuses
    next; a string of modules read as its letters; a moe-scope graph without drop-and-pad was predicted although
    megatron-core refuses it (the --megatron-args path already said so)."""

    with pytest.raises(ConfigError) as err:
        Layout(model="Mixtral-8x7B", seq_length=4096, num_layers=2, num_gpus=2, ep=2, **fields).check()
    assert err.value.field == field and says in str(err.value)
