"""CUDA graphs in the search: tried where the fastest eager layout waits on the host (`search.plan_with_graphs`)."""

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.search import plan, plan_with_graphs
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.parallel import CudaGraphConfig

H100 = get_gpu_spec("H100-SXM")
SMALL, LARGE = load_model_spec("Qwen3-0.6B"), load_model_spec("Llama-3.1-8B")


def test_a_host_bound_small_model_gets_graphs_and_says_why():
    """Qwen3-0.6B on one H100 waits on the host eager (measured: graphed micro-batch 4 training 253 ms against
    290-333 ms eager on three leases, benchmarks/results/validation_h100_x1/graphed_training)."""
    eager = plan(SMALL, H100, 1, 4096, 8)
    assert eager.best.estimate.time.breakdown["host_bound"] > 0
    auto = plan_with_graphs(SMALL, H100, 1, 4096, 8)
    best = auto.best.estimate
    assert best.workload.cuda_graph == CudaGraphConfig("transformer_engine", ("attn", "mlp"))
    assert best.step_time_s < eager.best.estimate.step_time_s
    assert any("CUDA graphs tried" in note for note in auto.notes)
    # eager layouts stay in the ranking beside the graphed ones
    assert any(not c.estimate.workload.cuda_graph.enabled for c in auto.candidates)
    off = plan_with_graphs(SMALL, H100, 1, 4096, 8, cuda_graphs="off")
    assert off.best.estimate.step_time_s == eager.best.estimate.step_time_s and off.notes == eager.notes


def test_a_gpu_bound_model_is_planned_eager_unless_asked():
    eager = plan(LARGE, H100, 8, 8192, 64)
    assert eager.best.estimate.time.breakdown["host_bound"] == 0.0
    auto = plan_with_graphs(LARGE, H100, 8, 8192, 64)
    assert [c.label for c in auto.top(5)] == [c.label for c in eager.top(5)] and auto.notes == eager.notes
    tried = plan_with_graphs(LARGE, H100, 8, 8192, 64, cuda_graphs="try")
    assert any(c.estimate.workload.cuda_graph.enabled for c in tried.candidates)
    assert any("--cuda-graphs try" in note for note in tried.notes)


def test_a_launch_s_own_graphs_are_kept_and_bad_modes_refused():
    own = CudaGraphConfig("transformer_engine", ("attn",))
    kept = plan_with_graphs(SMALL, H100, 1, 4096, 8, cuda_graph=own)
    assert {c.estimate.workload.cuda_graph for c in kept.candidates} == {own}
    with pytest.raises(ConfigError, match="cuda_graphs"):
        plan_with_graphs(SMALL, H100, 1, 4096, 8, cuda_graphs="sometimes")


def test_mat_plan_says_it_tried_graphs_and_refuses_a_bad_mode(tmp_path, capsys):
    import json

    from megatron_autotuner.cli import main

    common = ["plan", "--model", "Qwen3-0.6B", "--gpu", "H100-SXM", "--num-gpus", "1", "--seq-len", "4096",
              "--global-batch-size", "8", "--no-chart", "--json"]  # fmt: skip
    assert main([*common, "--output-dir", str(tmp_path / "auto")]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert any("CUDA graphs tried" in note for note in auto["notes"])
    assert "graphs-transformer_engine" in auto["candidates"][0]["label"]
    assert main([*common, "--cuda-graphs", "off", "--output-dir", str(tmp_path / "off")]) == 0
    off = json.loads(capsys.readouterr().out)
    assert "graphs" not in off["candidates"][0]["label"] and not any("CUDA graphs" in n for n in off["notes"])
    with pytest.raises(SystemExit) as exc:
        main([*common, "--cuda-graphs", "sometimes"])
    assert exc.value.code == 2 and "error: argument --cuda-graphs" in capsys.readouterr().err
