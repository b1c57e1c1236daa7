import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.costmodel import CostOptions, estimate, gemm_time_s
from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload, get_gpu_spec, load_model_spec
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
H100 = get_gpu_spec("H100-SXM")
LLAMA8 = load_model_spec("Llama-3.1-8B")


def test_large_gemm_runs_at_default_efficiency():
    t = gemm_time_s(8192, 8192, 8192, H100)
    assert t == pytest.approx(2 * 8192**3 / (989e12 * d.GEMM_EFFICIENCY["bf16"]) + d.KERNEL_OVERHEAD_S)


def test_small_gemm_is_less_efficient():
    big = 2 * 8192**3 / gemm_time_s(8192, 8192, 8192, H100)
    small = 2 * 256**3 / gemm_time_s(256, 256, 256, H100)
    assert small < 0.5 * big


def test_defaults_agree_with_committed_measurements():
    data = json.loads((ROOT / "benchmarks/results/testbench_h200_x2/defaults_h200.json").read_text())
    attn = {
        (o["causal"], o["head_dim"], o["phase"], o["seq_length"]): o["achieved_tflops"] / 989
        for o in data["ops"]
        if o["op"] == "core_attention" and o.get("backend") == "cudnn"
    }
    for (causal, hd), phases in d.ATTENTION_EFFICIENCY.items():
        for phase, points in phases.items():
            for s, eff in points:
                assert eff == pytest.approx(attn[(causal, hd, phase, s)], abs=0.002)
    fp8 = sorted(
        o["achieved_tflops"] / 1979
        for o in data["ops"]
        if o["op"] == "gemm" and o["precision"] == "fp8" and o["flops"] >= 1e11
    )
    assert d.GEMM_EFFICIENCY["fp8"] == pytest.approx(fp8[len(fp8) // 2], abs=0.02)


def test_estimate_outputs_are_consistent():
    p = ParallelConfig(8, tp=2, sequence_parallel=True)
    w = Workload(8192, 1, 64)
    e = estimate(LLAMA8, p, w, H100)
    assert e.tokens_per_s_per_gpu == pytest.approx(64 * 8192 / e.step_time_s / 8)
    assert e.mfu == pytest.approx(e.model_tflops_per_gpu / 989)
    assert 0.2 < e.mfu < 0.8
    assert e.time.breakdown["total"] == pytest.approx(e.step_time_s)
    data = e.to_dict()
    for key in (
        "step_time_s",
        "tokens_per_s_per_gpu",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "peak_memory_gib",
        "memory_breakdown_gib",
        "fits",
        "time_breakdown_s",
    ):
        assert key in data


def test_recompute_costs_time_and_saves_memory():
    p = ParallelConfig(8, tp=2, sequence_parallel=True)
    none = estimate(LLAMA8, p, Workload(8192, 1, 64), H100)
    full = estimate(LLAMA8, p, Workload(8192, 1, 64, RecomputeConfig("full")), H100)
    assert full.step_time_s > none.step_time_s * 1.15
    assert full.peak_memory_gib < none.peak_memory_gib
    assert full.hardware_tflops_per_gpu > full.model_tflops_per_gpu


def test_forward_mode_is_cheaper_than_training():
    p = ParallelConfig(8, tp=2, sequence_parallel=True)
    train = estimate(LLAMA8, p, Workload(8192, 1, 64), H100)
    fwd = estimate(LLAMA8, p, Workload(8192, 1, 64, mode="forward"), H100)
    assert fwd.step_time_s < train.step_time_s / 2
    assert fwd.peak_memory_gib < train.peak_memory_gib


def test_max_token_len_changes_time_and_memory():
    p = ParallelConfig(8, tp=2, sequence_parallel=True)
    small = estimate(LLAMA8, p, Workload(4096, 1, 64, max_token_len=4096), H100)
    big = estimate(LLAMA8, p, Workload(4096, 1, 64, max_token_len=16384), H100)
    assert big.peak_memory_gib > small.peak_memory_gib
    assert big.step_time_s != small.step_time_s


def test_fp8_is_faster_than_bf16():
    p = ParallelConfig(8)
    bf16 = estimate(LLAMA8, p, Workload(8192, 1, 64), H100)
    fp8 = estimate(LLAMA8, p, Workload(8192, 1, 64, precision="fp8"), H100)
    assert fp8.step_time_s < bf16.step_time_s
    with pytest.raises(ConfigError, match="fp8"):
        estimate(LLAMA8, p, Workload(8192, 1, 64, precision="fp8"), get_gpu_spec("A100-80GB"))


def test_bad_options_name_the_field():
    with pytest.raises(ConfigError, match="flops_convention"):
        CostOptions(flops_convention="half")
    with pytest.raises(ConfigError, match="memory_margin"):
        CostOptions(memory_margin=1.5)


@settings(max_examples=15, deadline=None)
@given(dp_exp=st.integers(0, 3), gbs_factor=st.integers(1, 4))
def test_more_data_parallel_gpus_never_increase_memory(dp_exp, gbs_factor):
    gbs = 64 * gbs_factor
    a = estimate(LLAMA8, ParallelConfig(2 * 2**dp_exp, tp=2, sequence_parallel=True), Workload(4096, 1, gbs), H100)
    b = estimate(LLAMA8, ParallelConfig(4 * 2**dp_exp, tp=2, sequence_parallel=True), Workload(4096, 1, gbs), H100)
    assert b.peak_memory_gib <= a.peak_memory_gib + 1e-9


@settings(max_examples=15, deadline=None)
@given(pp=st.sampled_from([1, 2, 4]), k=st.integers(1, 6))
def test_step_time_monotone_in_global_batch(pp, k):
    p = ParallelConfig(8, tp=2, pp=pp, sequence_parallel=True)
    gbs = 4 * 4 * k
    t1 = estimate(LLAMA8, p, Workload(4096, 1, gbs), H100).step_time_s
    t2 = estimate(LLAMA8, p, Workload(4096, 1, gbs + 16), H100).step_time_s
    assert t2 > t1


def _pp_exposed_s(parallel, options):
    est = estimate(LLAMA8, parallel, Workload(4096, 1, 64), H100, options)
    return est.to_dict()["time_breakdown_s"]["exposed_comm"]["pp"]


def test_unoverlapped_pipeline_exchanges_count_once_per_model_chunk():
    """Without overlap_p2p_comm each of the v model chunks of a stage sends and receives once per
    micro-batch and pass, so the exposed p2p time grows with v; with it only the fill is exposed."""
    options = CostOptions(overlap_p2p_comm=False)
    # 16 GPUs: the pipeline crosses nodes, where the exchange is slow enough to see
    plain = _pp_exposed_s(ParallelConfig(16, tp=1, pp=4), options)
    inter2 = _pp_exposed_s(ParallelConfig(16, tp=1, pp=4, vpp=2), options)
    inter4 = _pp_exposed_s(ParallelConfig(16, tp=1, pp=4, vpp=4), options)
    assert inter2 == pytest.approx(2 * plain, rel=1e-6) and inter4 == pytest.approx(4 * plain, rel=1e-6)
    assert _pp_exposed_s(ParallelConfig(16, tp=1, pp=4, vpp=4), CostOptions()) < 0.25 * inter4


def test_scatter_gather_pipeline_exchange_trades_network_bytes_for_an_nvlink_gather():
    """Megatron-LM 2021: without SP each TP rank sends 1/tp over the network, then an NVLink all-gather."""
    options = CostOptions(overlap_p2p_comm=False)
    scattered = CostOptions(overlap_p2p_comm=False, p2p_scatter_gather=True)
    cross_node = ParallelConfig(64, tp=8, pp=8)
    full, split = _pp_exposed_s(cross_node, options), _pp_exposed_s(cross_node, scattered)
    assert 0 < split < 0.5 * full
    # with sequence parallelism the boundary tensor is already 1/tp: the option changes nothing
    sp = ParallelConfig(64, tp=8, pp=8, sequence_parallel=True)
    assert _pp_exposed_s(sp, scattered) == pytest.approx(_pp_exposed_s(sp, options))


def test_published_runs_within_targets():
    published = load_script("published")
    results = published.compare_published(ROOT / "tests/fixtures/published_runs.csv")
    s = published.summary(results)
    assert s["rows"] == 8
    # Target of the issue: every dense row within 15%, median within 8% (9.5% and 5.5% at this commit). The MoE row
    # (Qwen3-30B-A3B, 8 local experts, flex over HybridEP) is 32% slow since its eager MoE blocks are held to the host
    # floor measured on one H200 lease (`defaults.FUSED_MOE_HOST_FLOOR_*`); priced at GPU time it was 13% fast, and
    # with the flex dispatcher's cheaper exchange 44% fast: its host, not modelled apart, is its open error.
    dense = [r for r in results if not r.estimate.model.is_moe]
    assert len(dense) == 7 and max(abs(r.error) for r in dense) < 0.15
    assert s["median_abs_error"] < 0.08
    (moe,) = [r for r in results if r.estimate.model.is_moe]
    assert -0.35 < moe.error < -0.25
    # Narayanan et al. ran Megatron-LM 2021: synchronous pipeline exchanges with the scatter/gather
    # optimization, one per model chunk and micro-batch (145.6B: +11.4% with overlapped exchanges)
    by = {r.model: r for r in results}
    assert by["GPT-145.6B"].estimate.to_dict()["time_breakdown_s"]["exposed_comm"]["pp"] > 0.3
    # each row runs with its source's gradient dtype: bf16 main grads where the scripts set
    # grad_reduce_in_fp32=False (Megatron-Bridge performance configs; NeMo 2.0's only for fp8)
    fp32_grads = {r.model: r.estimate.parallel.grad_reduce_in_fp32 for r in results}
    assert fp32_grads["Qwen3-30B-A3B"] is False
    assert fp32_grads["Llama-3.1-8B"] and fp32_grads["Llama-3.1-70B"] and fp32_grads["GPT-145.6B"]
    # and its fp8 settings: Megatron-Bridge's "fp8_cs" (tensorwise, fp8 parameters); Megatron-LM's defaults else
    fp8 = {r.model: (r.estimate.workload.fp8_recipe, r.estimate.workload.fp8_param) for r in results}
    assert fp8["Qwen3-30B-A3B"] == ("tensorwise", True) and fp8["Llama-2-7B"] == ("delayed", False)


def test_measured_h200_layers_within_10_percent():
    """The 2x H200 testbench's single layers, timed phase by phase from an empty queue: by their GPU time alone the
    TP 2 layers are 17-38% under; as the testbench times them (issue order, default host floor) every fwd + bwd is
    within 10% (the compute an overlapped NCCL collective slows, `defaults.NCCL_OVERLAP_COST`, brought the eighth
    in), and every backward within 10.5%."""
    rows = json.loads((ROOT / "benchmarks/results/testbench_h200_x2/dense_summary.json").read_text())["rows"]
    result = load_script("measured").compare_decoder_rows(rows, "H200")
    assert len(result) == 24
    both = [r for r in result if r["phase"] == "fwd+bwd"]
    assert all(r["gpu_only_error"] < -0.15 for r in both if r["tp"] == 2)
    assert all(abs(r["error"]) <= 0.10 for r in both)
    assert all(abs(r["error"]) <= 0.105 for r in result if r["phase"] == "bwd")
    committed = json.loads((ROOT / "benchmarks/results/measured_comparison.json").read_text())
    assert committed["rows"] == result


def test_h200_whole_layers_and_empty_queue_layers():
    """Whole TE layers (the layer check: TP 1 on one H200, TP 2 on 2x H200) within 10% without overlap; the single
    layers one H200 timed from an empty queue: predicted before the lease, every backward and every GPU-bound
    forward within 10%; today's issue order, given each case's own host time, every forward within 7%."""
    script = load_script("measured")
    whole = script.compare_layer_check()
    plain = [r for r in whole if r["setup"] == "nccl"]
    assert {(r["model"], r["tp"]) for r in plain} == {(m, tp) for m in ("Qwen3-8B", "Llama-3.1-8B") for tp in (1, 2)}
    assert all(abs(r["error"]) <= 0.10 for r in plain)
    queue = script.compare_empty_queue()
    assert len(queue) == 12
    assert all(abs(r["error_before"]) <= 0.10 for r in queue if r["phase"] == "bwd" and r["model"] != "Qwen3-0.6B")
    assert all(abs(r["error_before"]) <= 0.10 for r in queue if r["seq_length"] == 8192)
    forwards = [r for r in queue if r["phase"] == "fwd"]
    assert all(abs(r["error_now_host_measured"]) < 0.07 for r in forwards)
    # the 8B forwards at s4096 took longer than both their GPU time and their host time
    lagged = [r for r in forwards if r["seq_length"] == 4096 and "8B" in r["model"]]
    assert all(r["measured_ms"] > max(r["gpu_ms"], r["host_ms"]) + 0.6 for r in lagged)
    committed = json.loads((ROOT / "benchmarks/results/measured_comparison.json").read_text())
    assert committed["whole_layers"] == whole and committed["empty_queue_h200_x1"] == queue


def _group_launch_fractions(trace_path: Path) -> list[float]:
    """Per op group of the second `decoder.fwd` range of a torch-profiler trace: when the host launched its large
    kernel (GEMM / attention), as a fraction of the range's host time."""
    events = json.loads(gzip.decompress(trace_path.read_bytes()))["traceEvents"]
    fwd = [e for e in events if e.get("name") == "decoder.fwd" and e.get("cat") == "user_annotation"][1]
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    fractions = []
    for k in events:
        t = launches.get(k.get("args", {}).get("correlation")) if k.get("cat") == "kernel" else None
        if t is not None and fwd["ts"] <= t <= fwd["ts"] + fwd["dur"] and ("nvjet" in k["name"] or "sdpa" in k["name"]):
            fractions.append((t - fwd["ts"]) / fwd["dur"])
    return sorted(fractions)


def test_issue_order_predicted_before_a_second_h200_lease():
    """Ten decoder layers the issue fractions were not read from, their forward's GPU time by issue group written
    before the lease: today's model gives the same groups, and with each case's own host time every phase (training
    forward, no-grad forward, backward) lands within -4..+9%. The lease's trace of a large TP 1 layer launched its
    five groups within 0.015 of the committed fractions."""
    from megatron_autotuner.costmodel.layer import forward_issue_groups_s

    script = load_script("measured")
    lease = ROOT / "benchmarks/results/validation_h200_x1/issue_order"
    written = json.loads((lease / "predicted_issue_order.json").read_text())["cases"]
    assert len(written) == 10
    for c in written:
        model, ctx = script._layer(c["model"], "H200", 1, False, c["seq_length"], c["micro_batch_size"], True)
        assert [g * 1e3 for g in forward_issue_groups_s(model, 0, ctx)] == pytest.approx(c["gpu_fwd_groups_ms"])
    rows = script.compare_issue_order()
    assert len(rows) == 30 and {r["phase"] for r in rows} == {"fwd", "fwd_no_grad", "bwd"}
    assert all(-0.04 <= r["error"] <= 0.09 for r in rows)
    committed = json.loads((ROOT / "benchmarks/results/measured_comparison.json").read_text())
    assert committed["issue_order_h200_x1"] == rows
    traced = _group_launch_fractions(lease / "qwen3_8b_decoder.rank_0.json.gz")
    assert traced == pytest.approx(list(d.FORWARD_ISSUE_FRACTIONS[False]), abs=0.015)


def test_expandable_segments_shrink_only_the_fragmentation_allowance(capsys):
    """`--expandable-segments` (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, the default) against
    `--no-expandable-segments` changes the reserved-but-unallocated allowance from 0.18 to 0.034 x activations and
    nothing else."""
    from megatron_autotuner.cli import main
    from megatron_autotuner.theory.memory import EXPANDABLE_SEGMENTS_FRAGMENTATION_FRACTION, MemoryAllowance

    args = ["estimate", "--model", "Qwen3-8B", "--gpu", "H200", "--num-gpus", "2", "--seq-len", "8192"]
    args += ["--global-batch-size", "4", "--micro-batch-size", "1", "--tp", "2", "--sp", "--json"]
    out = {}
    for flag in (["--no-expandable-segments"], ["--expandable-segments"], []):
        assert main(args + flag) == 0
        out[flag[0] if flag else "none"] = json.loads(capsys.readouterr().out)
    default, expandable = out["--no-expandable-segments"], out["--expandable-segments"]
    assert out["none"] == expandable
    assert expandable["step_time_s"] == default["step_time_s"]
    act = default["memory_breakdown_gib"]["activations"]
    saved = default["memory_breakdown_gib"]["allowance"] - expandable["memory_breakdown_gib"]["allowance"]
    fractions = MemoryAllowance().fragmentation_fraction - EXPANDABLE_SEGMENTS_FRAGMENTATION_FRACTION
    assert saved == pytest.approx(fractions * act) and saved > 0
    assert default["peak_memory_gib"] - expandable["peak_memory_gib"] == pytest.approx(saved)


def test_grad_reduce_in_bf16_flag_halves_the_gradient_buffer(capsys, tmp_path):
    """`mat estimate --grad-reduce-in-bf16` and `mat plan --grad-reduce-in-bf16`: the gradient buffer halves, the
    optimizer step's fp32 shard copy is reported, and the plan's exported Megatron-LM arguments carry the flag."""
    from megatron_autotuner.cli import main

    args = ["estimate", "--model", "Qwen3-8B", "--gpu", "H200", "--num-gpus", "2", "--seq-len", "8192"]
    args += ["--global-batch-size", "4", "--json"]
    out = {}
    for flag in ([], ["--grad-reduce-in-bf16"]):
        assert main(args + flag) == 0
        out[bool(flag)] = json.loads(capsys.readouterr().out)
    fp32, bf16 = out[False]["memory_breakdown_gib"], out[True]["memory_breakdown_gib"]
    assert bf16["gradients"] == pytest.approx(fp32["gradients"] / 2)
    assert bf16["optimizer_step"] == pytest.approx(fp32["gradients"] / 2) and fp32["optimizer_step"] == 0
    assert out[True]["inputs"]["parallel"]["grad_reduce_in_fp32"] is False
    assert main(args[:-1] + ["--grad-reduce-in-bf16"]) == 0  # the table says what was assumed
    table = capsys.readouterr().out
    assert "main-grads=bf16" in table and "optimizer step only (fp32 grad copy)" in table
    assert main(args[:-1]) == 0
    assert "optimizer step only" not in capsys.readouterr().out
    plan_args = ["plan", "--model", "Qwen3-8B", "--gpu", "H200", "--num-gpus", "2", "--seq-len", "8192"]
    plan_args += ["--global-batch-size", "4", "--top", "1", "--no-chart", "--output-dir", str(tmp_path)]
    assert main(plan_args + ["--grad-reduce-in-bf16", "--json"]) == 0
    capsys.readouterr()
    assert "--grad-reduce-in-bf16" in (tmp_path / "rank_1" / "megatron_lm_args.txt").read_text()
