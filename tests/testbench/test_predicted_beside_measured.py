"""The testbench's summary puts the cost model's time beside each dense decoder layer it measured, timed as the
testbench times it: from an empty launch queue, with the host time the record measured or else the default floor."""

import json
from pathlib import Path

from megatron_autotuner.testbench.results import all_records
from megatron_autotuner.testbench.summary import summary_rows

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_h200_layers_with_their_own_host_time_within_8pct():
    rows = summary_rows(all_records(RESULTS / "validation_h200_x1/host_probe/testbench"))
    assert len(rows) == 6 and all(r["predicted_host"] == "measured" for r in rows)
    assert all(abs(r["fwd_bwd_error"]) < 0.08 for r in rows)
    assert all(r["predicted_fwd_bwd_ms"] == r["predicted_fwd_ms"] + r["predicted_bwd_ms"] for r in rows)


def test_records_without_host_times_use_the_default_floor_and_other_ops_get_none():
    """The 2x H200 run predates host timing: its decoder rows are predicted with the default floor; its attention,
    MLP and MoE rows carry no prediction."""
    rows = [r for r in summary_rows(all_records(RESULTS / "testbench_h200_x2/dense")) if r["status"] == "ok"]
    decoders = [r for r in rows if r["op"] == "decoder"]
    assert decoders and all(r["predicted_host"] == "default floor" for r in decoders)
    assert all(abs(r["fwd_bwd_error"]) < 0.15 for r in decoders)
    assert all("predicted_fwd_ms" not in r for r in rows if r["op"] != "decoder")
    json.dumps(rows)
