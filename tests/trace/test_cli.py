"""`mat trace summary | overlap | merge` through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from .helpers import NCCL, UB


def test_summary_json(mat):
    code, out, _ = mat("trace", "summary", NCCL[0], UB[0], "--json", "--top", "3")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and len(doc["traces"]) == 2
    nccl, ub = doc["traces"]
    assert nccl["rank"] == 0 and len(nccl["top_kernels"]) == 3
    assert nccl["overlap"]["overlap_us"] == pytest.approx(690.977, abs=0.01)
    assert {c["category"] for c in ub["categories"]} >= {"gemm", "attention", "comm", "peer_copy"}
    assert ub["unmatched_kernels"] == []


def test_summary_table(mat):
    code, out, _ = mat("trace", "summary", UB[1])
    assert code == 0
    assert "Time per category" in out and "userbuffers" in out and "Streams" in out


def test_overlap_range_json(mat):
    code, out, _ = mat("trace", "overlap", UB[0], "--range", "_LayerNormLinear", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["overlap"]["instances"] == 2 and doc["overlap"]["overlap_us"] > 0
    code, out, _ = mat("trace", "overlap", NCCL[1])
    assert code == 0 and "exposed communication" in out


def test_merge(mat, tmp_path):
    out_file = tmp_path / "m.json.gz"
    code, out, _ = mat("trace", "merge", "-o", out_file, *NCCL, "--offset-us", "1=-1.5", "--json")
    assert code == 0 and out_file.exists()
    assert [r["shift_us"] for r in json.loads(out)["ranks"]] == [0.0, -1.5]


def test_errors_are_one_line(mat, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [{"ph": "X"')
    code, _, err = mat("trace", "summary", bad)
    assert code == 2
    assert err.startswith(f"mat: error: {bad}: truncated JSON") and err.count("\n") == 1
    code, _, err = mat("trace", "overlap", NCCL[0], "--range", "nope")
    assert code == 2 and "nope" in err
    code, _, err = mat("trace", "merge", "-o", tmp_path / "x.json", NCCL[0], "--offset-us", "zero")
    assert code == 2 and "R=US" in err
    assert not (tmp_path / "x.json").exists()
