"""CUDA graphs over an eager MoE layer's attention, router and preprocess on 2x H200 (benchmarks/validation/
x2_moe_graphs.sh, benchmarks/results/moe_graphs_h200_x2, `python benchmarks/moe_graphs.py`): what held, and the miss
the model keeps (it credits the graphs with 0-8% of the step where they took 11-39%)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import moe_graphs  # noqa: E402

E32 = "30B-A3B-E32 L4 ep2"


@pytest.fixture(scope="module")
def table() -> list[dict]:
    return moe_graphs.rows()


@pytest.fixture(scope="module")
def changes(table) -> dict[tuple[str, str], dict]:
    return {(c["part"], c["label"]): c for c in moe_graphs.graph_changes(table)}


def test_each_run_stored_todays_model_with_its_hosts_floor(table):
    """The prediction made at the run, after the host's floors were measured, is today's model."""
    for row in table:
        assert row["predicted_now_step_s"] == pytest.approx(row["predicted_at_run_step_s"], rel=0.02), row["label"]


def test_the_eager_32_expert_steps(table):
    """Within 10% on hosts L and M; host N's ran 15% over the model, its layers timed (unprofiled) at 14.0-14.3 ms
    forward and 10.8-10.9 ms backward on both ranks against its floor's 7.0 ms MoE block each way."""
    eager = {r["host"]: r for r in table if r["label"].startswith(f"{E32} eager") and r["part"] != "ranks"}
    assert sorted(eager) == ["L", "M", "N"]
    for host in ("L", "M"):
        assert abs(eager[host]["predicted_now_step_s"] / eager[host]["measured_step_s"] - 1) < 0.10, host
    assert -0.20 < eager["N"]["predicted_now_step_s"] / eager["N"]["measured_step_s"] - 1 < -0.10
    for rank in eager["N"]["layer_host_ms_by_rank"]:
        assert 13.5 < rank["fwd_ms"] < 15.0 and 10.0 < rank["bwd_ms"] < 11.5


def test_the_three_scopes_took_30_to_35_percent_off_on_four_hosts(changes):
    for key in (
        ("run", f"{E32} graphs attn+router+preprocess"),
        ("profile", f"{E32} graphs attn+router+preprocess profiled"),
        ("timed", f"{E32} graphs attn+router+preprocess host-timed"),
        ("ranks", f"{E32} graphs attn+router+preprocess profiled both ranks"),
    ):
        assert -0.36 < changes[key]["measured_change"] < -0.29, key


def test_the_model_credits_the_graphs_far_less_than_they_took(changes):
    """The known miss: the model takes the router's and preprocess's measured shares of the block's forward host off
    (`costmodel.layer.moe_block_host_s`) and gives the attention graph nothing on a MoE layer; the graphs took 20-28
    points more. Update this test when the model prices the attention's host of a synchronised MoE layer."""
    for key, change in changes.items():
        if "E32" not in key[1] or "mbs4" in key[1]:
            continue
        assert change["model_change"] > change["measured_change"] + 0.10, key
        assert change["model_change"] > -0.10, key


def test_the_forward_is_host_paced_between_the_token_count_waits(table):
    """In every profiled step a forward span between two of the dispatcher's waits held 1.5 ms of computation, and
    each scope graphed shortened it: eager 17.1 ms, attn 11.0, +router 8.6, +preprocess 7.6 (profiled)."""
    profiled = [r for r in table if r["part"] == "profile"]
    spans = [r["trace"]["median_span_ms"] for r in profiled]
    assert len(profiled) == 4 and spans == sorted(spans, reverse=True)
    for row in profiled:
        trace = row["trace"]
        assert trace["syncs"] == 16  # 4 layers x 4 micro-batches: one wait per layer forward
        assert trace["median_compute_ms"] < 0.25 * trace["median_span_ms"], row["label"]


def test_estimates_of_host_paced_dropless_moe_layers_say_what_the_graphs_took():
    """`estimate.moe_graphs_note`: on the eager and graphed host-paced layouts of this evidence, none on the GPU-paced
    micro-batch-4 one, nor on a dense model."""
    from megatron_autotuner.validate.layout import load_layouts_file
    from megatron_autotuner.validate.predict import estimate_layout

    layouts, _ = load_layouts_file(ROOT / "benchmarks/validation/x2_moe_graphs_layouts.json")
    notes = {lay.name: [n for n in estimate_layout(lay, "H200").notes if "30-35%" in n] for lay in layouts}
    assert notes[f"{E32} eager"][0].startswith("the MoE layers wait on the host for their token counts")
    assert notes[f"{E32} graphs attn"][0].startswith("graphs of attn over the eager MoE layers")
    assert notes[f"{E32} mbs4 graphs attn+router+preprocess"] == []
    dense = replace(layouts[0], model="Qwen3-4B", ep=1)
    assert not [n for n in estimate_layout(dense, "H200").notes if "30-35%" in n]


def test_one_ranks_host_paces_the_other(table):
    """Host O kept both ranks' traces: in each step one rank issued every forward span slower than the other (eager
    19.5 against 13.3 ms, graphed 9.6 against 7.5) and never waited, while the other waited for it at each span's
    token-count wait; the model has one host pace for every rank."""
    both = [r for r in table if r["part"] == "ranks"]
    assert len(both) == 2
    for row in both:
        slow, fast = sorted(row["traces_by_rank"], key=lambda t: -t["mean_issue_ms"])
        assert slow["mean_issue_ms"] > 1.25 * fast["mean_issue_ms"], row["label"]
        assert slow["mean_wait_ms"] < 0.5 < 1.5 < fast["mean_wait_ms"], row["label"]


def test_the_plan_says_it_of_a_host_paced_moe_best(tmp_path, capsys):
    """Qwen3-30B-A3B on 8 H100s at 4k tokens: the plan's best waits on the host for most of its step, so its notes
    carry `moe_graphs_note` beside the plan's own CUDA-graph note."""
    import json

    from megatron_autotuner.cli import main

    args = ["plan", "--model", "Qwen3-30B-A3B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "4096"]
    args += ["--global-batch-size", "64", "--top", "1", "--no-chart", "--json", "--output-dir", str(tmp_path / "p")]
    assert main(args) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("best layout: the MoE layers wait on the host") and "30-35%" in n for n in notes)
