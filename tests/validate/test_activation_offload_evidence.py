"""megatron-core activation offloading on one H100 (benchmarks/results/validation_h100_x1/activation_offload, README
there; predictions were written before each run). Today's cost model re-predicts the committed layouts with the
copy calibration the script used, so a change that moves a prediction is seen here."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.costmodel.calibration import load_calibration
from megatron_autotuner.validate.layout import load_layouts_file
from megatron_autotuner.validate.predict import predict, predicted_allocated_gib

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results/validation_h100_x1/activation_offload"
# what benchmarks/validation/h100_x1_activation_offload.sh passes as --calibration (the measured host-copy table)
COPY_CAL = ROOT / "benchmarks/results/testbench_h100_x1/host_floor/copy.calibration.json"
MIB = 1 << 20


def _rows(batch: str) -> dict[str, tuple[dict, dict]]:
    summary = json.loads((RESULTS / batch / "summary.json").read_text())
    layouts, _ = load_layouts_file(RESULTS / batch / "layouts.json")
    by_id = {lay.layout_id: lay for lay in layouts}
    cal = load_calibration(COPY_CAL)
    out = {}
    for row in summary["rows"]:
        assert row["status"] == "ok" and row["env"]["device"].startswith("NVIDIA H100")
        assert row["env"]["megatron_core"] == "0.19.2"
        out[row["label"]] = (row, predict(by_id[row["layout_id"]], "H100-SXM", cal))
    return out


@pytest.fixture(scope="module")
def rows():
    out = {**_rows("fine_grained"), **_rows("layer_level")}
    assert len(out) == 5
    return out


@pytest.fixture(scope="module")
def repeat():
    """The Qwen3-0.6B pair again on a second lease (8 timed steps, then one profiled step each)."""
    out = _rows("profile")
    assert len(out) == 2
    return out


def _err(now: dict, row: dict) -> float:
    return now["step_time_s"] / row["measured"]["step_time_s"] - 1


def test_allocated_memory_with_and_without_offloading_within_2pct(rows, repeat):
    for row, now in [*rows.values(), *repeat.values()]:
        assert predicted_allocated_gib(now) / row["measured"]["max_allocated_gib"] - 1 == pytest.approx(0, abs=0.02)


def test_gpu_bound_llama_steps_within_10pct(rows):
    """Llama-3.1-8B (4 layers) is GPU-bound: the offloading host cost hides under the GPU work. The copies hide
    better than predicted (fine-grained +1.7 ms measured over the baseline, +18.7 ms exposed predicted; layer-level
    +70 ms against +91 ms): pinned here as an over-prediction."""
    for label, (row, now) in rows.items():
        if label.startswith("L3-8B.L4"):
            assert _err(now, row) == pytest.approx(0, abs=0.10)
            # the launch-queue ramp (`estimate.host_issue_ramp_s`) adds under 1% here: the GPU sets the pace
            assert now["step_time_s"] == pytest.approx(row["predicted"]["step_time_s"], rel=0.015)
    base, fine = rows["L3-8B.L4 baseline"], rows["L3-8B.L4 offload core_attn+attn_proj"]
    assert fine[1]["offload_s"] > 5 * (fine[0]["measured"]["step_time_s"] - base[0]["measured"]["step_time_s"])


def test_megatron_core_counts_the_attention_output_twice(rows, repeat):
    """megatron-core's `offload_summary_bytes` (the runs' `offloaded_gib`) sums, per group, the bytes of every
    tensor it copies (`OffloadTensorGroup.update_offload_info`) of the first micro-batch, without the last layer's
    groups (the offload margin). core_attn copies q, k, v and the attention output that TE's attention saves;
    attn_proj copies linear_proj's input, the same storage (freed only by attn_proj, `forced_released_tensors=
    [core_attn_out]`), so the counter is the model's copied bytes while the drop in allocated memory is its
    freed bytes."""
    for label, layers, out_mib, qkv_mib in (("L3-8B.L4", 3, 32, 48), ("Q3-0.6B", 27, 16, 32)):
        row, now = rows[f"{label} offload core_attn+attn_proj"]
        base = rows[f"{label} baseline"][0]
        counted_gib = row["measured"]["offloaded_gib"]
        copied_mib = layers * (qkv_mib + out_mib + out_mib)  # core_attn: q, k, v, output; attn_proj: the output
        freed_mib = layers * (qkv_mib + out_mib)
        assert counted_gib * 1024 == pytest.approx(copied_mib)
        assert now["offload_copied_gib"] == pytest.approx(counted_gib)  # the model's copied bytes are the counter
        assert now["offloaded_gib"] * 1024 == pytest.approx(freed_mib)  # the model's bytes off the GPU
        drop_gib = base["measured"]["max_allocated_gib"] - row["measured"]["max_allocated_gib"]
        assert drop_gib * 1024 == pytest.approx(freed_mib, rel=0.01)
    # per module, as megatron-core's own summary splits it (runs/rank_0.jsonl)
    layers, out_mib, qkv_mib = 27, 16, 32
    records = [json.loads(line) for line in (RESULTS / "profile/runs/rank_0.jsonl").read_text().splitlines()]
    split = next(r for r in records if r["layout"]["activation_offload"])["measured"]["offloaded_gib_by_module"]
    assert split["core_attn"] * 1024 == pytest.approx(layers * (qkv_mib + out_mib))
    assert split["attn_proj"] * 1024 == pytest.approx(layers * out_mib)


def test_host_bound_offload_host_term(rows, repeat):
    """Qwen3-0.6B is host-bound (the GPU's kernels take 275 ms of a ~760 ms step in the profiled steps), so the
    offloaded groups' host work (`defaults.FINE_GRAINED_OFFLOAD_HOST_*`) sets the step, and the copies' GPU waits
    hide in the GPU's idle time. On the second lease the fine-grained row's error is within 5 points of the
    baseline's (both under); on the first lease it stays 17 points further under (+416 ms measured, not seen again:
    the second lease measured +122 ms)."""
    base, fine = repeat["Q3-0.6B baseline"], repeat["Q3-0.6B offload core_attn+attn_proj"]
    assert abs(_err(*fine[::-1]) - _err(*base[::-1])) < 0.05
    # without the host term the model would be the baseline's host time plus nothing: the copies hide
    groups = 4 * 27 * 2
    per_group = d.FINE_GRAINED_OFFLOAD_HOST_FWD_S_PER_GROUP + d.FINE_GRAINED_OFFLOAD_HOST_BWD_S_PER_GROUP
    assert fine[1]["step_time_s"] - base[1]["step_time_s"] == pytest.approx(groups * per_group, rel=0.02)
    first_base, first_fine = rows["Q3-0.6B baseline"], rows["Q3-0.6B offload core_attn+attn_proj"]
    # the baseline is under by the host's work outside the layers (`DenseHostFloor.step_s` / `microbatch_s`) less
    # what the default still misses on this lease's slow host
    assert _err(first_base[1], first_base[0]) == pytest.approx(-0.09, abs=0.01)
    assert _err(first_fine[1], first_fine[0]) < -0.20  # the known miss of the first lease


def test_the_constant_is_what_the_trace_shows():
    """The forward / backward host time of the offload hooks in the profiled step (216 offloaded groups: 4
    micro-batches x 27 layers x 2 modules) and no host synchronisation beyond the step's end."""
    trace = next((RESULTS / "profile/traces").glob("*c9fcc13140.rank_0.json.gz"))
    with gzip.open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]

    def total_ms(name: str) -> float:
        return sum(e["dur"] for e in events if e["name"] == name) / 1e3

    fwd = total_ms("FineGrainedOffloadingGroupCommitFunction") + total_ms("FineGrainedOffloadingGroupStartFunction")
    prefix = "autograd::engine::evaluate_function: FineGrainedOffloadingGroup"
    bwd = total_ms(prefix + "CommitFunctionBackward") + total_ms(prefix + "StartFunctionBackward")
    assert fwd / 216 / 1e3 == pytest.approx(d.FINE_GRAINED_OFFLOAD_HOST_FWD_S_PER_GROUP, rel=0.01)
    assert bwd / 216 / 1e3 == pytest.approx(d.FINE_GRAINED_OFFLOAD_HOST_BWD_S_PER_GROUP, rel=0.01)
    assert total_ms("cudaStreamSynchronize") + total_ms("cudaEventSynchronize") < 1.0
