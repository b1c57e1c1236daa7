"""The gzipped Kineto export the testbench and validate runners share, on a real CPU profile."""

import gzip
import json

import pytest

from megatron_autotuner.testbench.measure import export_trace_gz

torch = pytest.importorskip("torch")


def test_export_trace_gz_writes_a_loadable_trace(tmp_path):
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("decoder.fwd"):
        torch.randn(64, 64) @ torch.randn(64, 64)
    out = export_trace_gz(prof, tmp_path / "traces" / "rank_0.json.gz")
    assert out == tmp_path / "traces" / "rank_0.json.gz"
    assert sorted(p.name for p in out.parent.iterdir()) == ["rank_0.json.gz"]  # the raw .json is gone
    with gzip.open(out) as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "decoder.fwd" for e in events)
