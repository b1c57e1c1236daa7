"""Analysis of the shipped H200 traces; the whole tuner end to end on the synthetic backend (CPU, gloo)."""

import os
from pathlib import Path

import pytest

from megatron_autotuner.overlap import OverlapTuner, OverlapTunerConfig, analyze_and_report, load_ub_yaml
from megatron_autotuner.overlap.analysis import te_layer_metrics
from megatron_autotuner.overlap.rules import cfg_violations

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def test_userbuffers_vs_nccl_trace_figures():
    ub = te_layer_metrics(FIX / "h200_te_layer_tp2_userbuffers_rank0.json.gz")
    nccl = te_layer_metrics(FIX / "h200_te_layer_tp2_nccl_rank0.json.gz")
    # NCCL: forward all-gather / reduce-scatter and the row ops' backward all-gather are fully exposed
    for slot in ("qkv.fwd", "proj.fwd", "fc1.fwd", "fc2.fwd", "proj.bwd", "fc2.bwd"):
        assert nccl[slot].overlap_us == 0.0 and nccl[slot].exposed_comm_us == pytest.approx(nccl[slot].comm_us)
    assert nccl["fc1.fwd"].comm_us == pytest.approx(159.2, abs=0.5)
    # userbuffers hides them: ring_exchange of fc1 fprop and of proj/fc2 dgrad fully overlapped
    assert ub["fc1.fwd"].overlap_ratio == pytest.approx(1.0)
    assert ub["fc1.fwd"].exposed_comm_us == pytest.approx(0.0, abs=0.01)
    assert ub["proj.bwd"].overlap_ratio == pytest.approx(0.975, abs=0.005)
    assert ub["fc2.fwd"].overlap_us == pytest.approx(122.3, abs=0.5)
    assert ub["proj.fwd"].overlap_ratio == pytest.approx(0.733, abs=0.005)
    # ... but the first userbuffers op of the step waits: qkv fprop leaves 1.25 ms of comm exposed
    assert ub["qkv.fwd"].exposed_comm_us == pytest.approx(1253.1, abs=1.0)
    assert ub["qkv.bwd"].overlap_ratio == pytest.approx(0.967, abs=0.005)  # bulk dgrad / wgrad
    for m in ub.values():
        assert 0 <= m.overlap_ratio <= 1 and m.overlap_us <= min(m.gemm_us, m.comm_us) + 1e-6


def test_fake_tuning_run_with_hang_resume_and_analysis(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    monkeypatch.setenv("MAT_OVERLAP_FAKE_HANG", "num_splits=8")  # fc2 fprop pipeline with 8 splits hangs
    config = OverlapTunerConfig(
        models=("Qwen3-0.6B",),
        tp_sizes=(2,),
        max_token_len=1024,
        fake=True,
        device="cpu",
        backend="te",
        case_timeout_s=2.5,
        operators=("qkv", "fc2"),
        min_num_sm=1,
        max_num_sm=12,
        cga_sizes=(1,),
        num_splits=(4, 8),
        output_dir=str(out),
        profile="key",
        verify_passes=1,
    )
    report = OverlapTuner(config).run()
    failures = report["failures"]
    assert any("timed out" in (f["error"] or "") for f in failures), failures
    s2 = next(s for s in report["summaries"] if s["tp"] == 2)
    assert s2["tuned_cfg_violations"] == []
    assert s2["layer"]["tuned_ms"] < s2["layer"]["te_default_ms"] < s2["layer"]["nccl_ms"]
    for row in s2["slots"]:
        assert row["tuned_not_slower_than_te_default"] is not False
    assert s2["tuned_cfg"]["fc2_fprop"].get("num_splits") != 8
    tuned = load_ub_yaml(out / "optimal_tp_comm_overlap_cfg_tp2.yaml")
    assert cfg_violations(tuned, tp=2, tokens=1024) == []
    assert (out / "optimal_tp_comm_overlap_cfg.yaml").exists() and (out / "summary.txt").exists()
    search = report["searches"][0]
    assert 0 < search["candidates_profiled_total"] < search["full_sweep_total"]
    assert report["scaling"]["Qwen3-0.6B"]["recommended_tp"] in (1, 2)
    n_records = len((out / "collect" / "rank_0.jsonl").read_text().splitlines())
    # resume: everything is recorded, nothing runs again
    monkeypatch.delenv("MAT_OVERLAP_FAKE_HANG")
    OverlapTuner(config).run()
    assert len((out / "collect" / "rank_0.jsonl").read_text().splitlines()) == n_records
    # the analysis alone, from the directory
    again = analyze_and_report(out, plots=False)
    assert again["summaries"][1]["layer"] == report["summaries"][1]["layer"]
    assert os.path.getsize(out / "tuning_report.json") > 1000


def test_analysis_imports_no_torch(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from megatron_autotuner.overlap import analyze_and_report;"
        "from megatron_autotuner.cli import main; main(['overlap', 'analyze', sys.argv[1]]);"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    (tmp_path / "collect").mkdir()
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tuning_report.json").exists()
