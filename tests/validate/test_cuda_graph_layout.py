"""Layouts with CUDA graphs: the JSON fields, their rules, the refusal on CPU, and (GPU) a graphed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import CudaGraphConfig
from megatron_autotuner.validate.layout import Layout, load_layouts_file

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "validation"


def test_layout_fields_round_trip_and_keep_old_ids():
    plain = Layout(model="Qwen3-0.6B", seq_length=4096)
    graphed = plain.replace(cuda_graph_impl="transformer_engine", cuda_graph_scope=["mlp", "attn"])
    assert graphed.workload().cuda_graph == CudaGraphConfig("transformer_engine", ("attn", "mlp"), 2)
    assert Layout.from_dict(json.loads(json.dumps(graphed.to_dict()))) == graphed
    assert "cuda_graph" not in plain.layout_id and plain.layout_id != graphed.layout_id
    assert "graphs=transformer_engine[attn+mlp]" in graphed.label
    # an id stays the same for layouts that do not set the new fields (ids of committed evidence): the empty scope
    # list of to_dict() counts as its default
    assert "cuda_graph_impl" in Layout.ID_FIELDS_ONLY_WHEN_SET
    assert Layout.from_dict(plain.to_dict()).layout_id == plain.layout_id
    assert plain.layout_id == plain.replace(cuda_graph_scope=[]).layout_id


def test_layout_rules():
    with pytest.raises(ConfigError, match="must exceed cuda_graph_warmup_steps"):
        Layout(model="Qwen3-0.6B", seq_length=4096, cuda_graph_impl="local", warmup_steps=2)
    with pytest.raises(ConfigError) as err:
        Layout(model="Qwen3-0.6B", seq_length=4096, cuda_graph_impl="full_iteration", cuda_graph_scope=["attn"])
    assert err.value.field == "cuda_graph_scope"
    with pytest.raises(ConfigError, match="fixed micro-batch shapes"):
        Layout(model="Qwen3-0.6B", seq_length=4096, max_token_len=8192, cuda_graph_impl="transformer_engine").check()


def test_from_configs_carries_the_graphs():
    from megatron_autotuner.specs import ParallelConfig, Workload

    w = Workload(4096, cuda_graph=CudaGraphConfig("transformer_engine", ("attn", "mlp")))
    lay = Layout.from_configs("Qwen3-0.6B", ParallelConfig(1), w)
    assert (lay.cuda_graph_impl, lay.cuda_graph_scope) == ("transformer_engine", ("attn", "mlp"))


def test_graphs_are_refused_on_cpu_in_one_line(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron_autotuner.validate.runner import run_layout

    lay = Layout(model="Qwen3-0.6B", num_layers=1, seq_length=32, cuda_graph_impl="transformer_engine")
    record = run_layout(lay, "cpu", tmp_path, rank=0)
    assert record["status"] == "failed" and record["failure_kind"] == "error"
    assert record["error"] == "CUDA graphs (transformer_engine) need CUDA (no CUDA device)"


def test_benchmark_layouts_are_valid_and_fit_the_gpu():
    """benchmarks/validation/h100_x1_cuda_graphs_layouts.json: every layout valid, eager / graphed in pairs, and each
    predicted to fit one H100 (80 GiB) with the graphs' memory."""
    from megatron_autotuner.costmodel.estimate import CostOptions, estimate
    from megatron_autotuner.specs import get_gpu_spec

    layouts, extra = load_layouts_file(BENCH / "h100_x1_cuda_graphs_layouts.json")
    gpu = get_gpu_spec(extra["gpu"])
    assert len(layouts) == 36
    pairs: dict[tuple, set[str]] = {}
    for lay in layouts:
        lay.check()
        pairs.setdefault((lay.model, lay.num_layers, lay.micro_batch_size, lay.mode), set()).add(lay.cuda_graph_impl)
        e = estimate(lay.model_spec(), lay.parallel(), lay.workload(), gpu, CostOptions())
        assert e.fits, (lay.label, e.peak_memory_gib)
    assert all(v == {"none", "transformer_engine"} for v in pairs.values())


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("impl", "scope"), [("transformer_engine", ["attn", "mlp"]), ("local", []), ("full_iteration", [])]
)
def test_gpu_graphed_run_reports_graphed_step_times(tmp_path, impl, scope):
    """A 2-layer Qwen3-0.6B trains with graphs on one GPU: it finishes, the graphs were captured before the timed
    steps, and those steps' times are reported."""
    import torch

    from megatron_autotuner.validate import validate_layouts
    from megatron_autotuner.validate.results import rank_file, read_records

    lay = Layout(
        model="Qwen3-0.6B", num_layers=2, seq_length=1024, warmup_steps=3, steps=3, cuda_graph_impl=impl,
        cuda_graph_scope=scope, cuda_graph_warmup_steps=1,
    )  # fmt: skip
    gpu = "H200" if "H200" in torch.cuda.get_device_name() else "H100-SXM"
    rep = validate_layouts([lay], tmp_path, gpu, layout_timeout_s=300, log=lambda *a: 0)
    row = rep.rows[0]
    assert row["status"] == "ok", row.get("error")
    assert row["measured"]["step_time_s"] > 0
    record = read_records(rank_file(tmp_path, 0))[0]
    assert len(record["measured"]["step_times_s"]) == 3
    graphs = record["cuda_graphs"]
    assert graphs["impl"] == impl and graphs["captured_before_step"] == 1
    if impl == "transformer_engine":
        assert graphs["graphs_created"] and record["measured"]["graph_capture_s"] > 0
