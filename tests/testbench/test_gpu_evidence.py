"""What the committed H200 testbench run (benchmarks/results/testbench_h200_x2) proves, checked on CPU.

Run: 2x H200, torch 2.11.0+cu130, megatron-core 0.19.2, Transformer Engine 2.20.2 (TE layer spec),
2026-11-22, `benchmarks/testbench/h200_x2.sh`. That run predates `bias_activation_fusion` being set,
so its MLPs used megatron-core's unfused GLU: theory is evaluated with `fused_bias_activation=False`.
"""

from pathlib import Path

import pytest

from megatron_autotuner.testbench.cases import Case
from megatron_autotuner.testbench.estimates import estimate_case
from megatron_autotuner.testbench.results import all_records, latest_by_case
from megatron_autotuner.theory.memory import ActivationOptions

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "testbench_h200_x2"
UNFUSED = ActivationOptions(fused_bias_activation=False)


def ok_records(*subdirs: str) -> list[dict]:
    records = []
    for sub in subdirs:
        for rank in (0, 1):
            records += [r for r in latest_by_case(all_records(RUN / sub), rank).values() if r["status"] == "ok"]
    return records


def test_run_recorded_its_environment():
    rec = ok_records("dense")[0]
    assert rec["env"]["device"] == "NVIDIA H200"
    assert rec["env"]["megatron_core"] == "0.19.2" and rec["env"]["transformer_engine"] == "2.20.2"
    assert rec["layer_spec"] == "te"


def test_weights_measured_equal_theory_exactly():
    records = ok_records("dense", "pieces", "moe", "chunk")
    assert len(records) >= 60
    assert all(r["ratio"]["weight_bytes"] == pytest.approx(1.0, abs=1e-3) for r in records)


@pytest.mark.parametrize(
    ("ops", "low", "high"),
    [
        (("column_linear", "row_linear", "lm_head", "norm"), 0.999, 1.002),
        (("attention",), 1.0, 1.06),  # + cuDNN softmax stats / RNG state theory leaves out
        (("decoder", "gpt_chunk"), 0.995, 1.02),
    ],
)
def test_activation_memory_measured_vs_theory(ops, low, high):
    records = [r for r in ok_records("dense", "pieces", "chunk") if r["case"]["op"] in ops]
    assert records
    for rec in records:
        estimated = estimate_case(Case.from_dict(rec["case"]), UNFUSED)["activation_bytes"]
        ratio = rec["real"]["activation_bytes"] / estimated
        assert low <= ratio <= high, (rec["case_id"], ratio)


def test_unfused_glu_keeps_exactly_two_more_ffn_tensors():
    """decoder - attention (both measured) = MLP block; the unfused-GLU term is what closes the gap."""
    by_key = {
        (r["case"]["model"], r["case"]["tp"], r["case"]["seq_length"], r["case"]["op"]): r for r in ok_records("dense")
    }
    for (_model, tp, seq, op), dec in by_key.items():
        if op != "decoder":
            continue
        case = Case.from_dict(dec["case"])
        fused = estimate_case(case)["activation_bytes"]
        unfused = estimate_case(case, UNFUSED)["activation_bytes"]
        ffn = case.model_spec().ffn_hidden_size
        assert unfused - fused == pytest.approx(2 * 2 * ffn * seq / tp)
        assert abs(dec["real"]["activation_bytes"] - unfused) < 0.02 * unfused
        assert abs(dec["real"]["activation_bytes"] - fused) > 0.25 * fused


def test_achieved_tflops_and_tp_scaling():
    rows = {
        (r["case"]["model"], r["case"]["op"], r["case"]["tp"], r["case"]["seq_length"]): r["real"]
        for r in ok_records("dense", "pieces")
        if r["rank"] == 0
    }
    for model in ("Qwen3-8B", "Llama-3.1-8B"):
        tp1 = rows[(model, "decoder", 1, 8192)]
        tp2 = rows[(model, "decoder", 2, 8192)]
        # a full TE decoder layer runs at > 50% of the H200's 989 dense bf16 TFLOP/s on one GPU
        assert tp1["fwd_bwd_tflops"] > 0.5 * 989
        assert tp1["fwd_bwd_mfu"] == pytest.approx(tp1["fwd_bwd_tflops"] / 989.0, rel=1e-6)
        # TP=2 with sequence parallel is faster per layer, but far from 2x (NCCL all-gather / reduce-scatter)
        speedup = tp1["fwd_bwd_ms"]["median"] / tp2["fwd_bwd_ms"]["median"]
        assert 1.2 < speedup < 1.9
        # GEMM pieces at s=8192 beat the whole layer's rate
        assert rows[(model, "column_linear", 1, 8192)]["fwd_bwd_tflops"] > tp1["fwd_bwd_tflops"]


def test_profile_and_snapshot_artifacts_present():
    traces = sorted((RUN / "profile" / "torch_profiler").glob("*/rank_*.json.gz"))
    assert len(traces) == 2
    assert list((RUN / "snapshot" / "memory_snapshot").glob("*/rank_0.html.gz"))


def test_profile_trace_attributes_forward_and_backward_work():
    """The testbench's `<op>.fwd` / `<op>.bwd` ranges own their GPU work (backward via autograd's thread)."""
    from megatron_autotuner.trace import load_trace, overlap

    for path in sorted((RUN / "profile" / "torch_profiler").glob("*/rank_*.json.gz")):
        trace = load_trace(path)
        fwd, bwd = overlap(trace, "decoder.fwd"), overlap(trace, "decoder.bwd")
        assert fwd.source == "cpu" and bwd.source == "cpu_window"
        assert bwd.category_us["gemm"] == pytest.approx(2 * fwd.category_us["gemm"], rel=0.15)
        # TP=2 + SP without userbuffers: forward all-gather / reduce-scatter run alone on the GPU
        assert fwd.overlap_us == 0.0 and {c.name for c in fwd.by_collective} == {"all_gather", "reduce_scatter"}
        assert all(c.name == "nccl" for c in fwd.by_library + bwd.by_library)
