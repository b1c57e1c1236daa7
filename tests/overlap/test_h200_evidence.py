"""The committed 2x H200 `mat overlap` run (benchmarks/results/overlap_h200_x2) re-checked on CPU.

The run's rank-0 records (collect/rank_0.jsonl) are analysed again with the package's own code and
must give the committed report: per-GEMM times, choices, yaml, search cost and TP-scaling verdict.
The torch-profiler traces of the run were not brought back from the GPU machine, so the overlap
ratios that break near-ties between candidates (analysis.best_candidate) come from the committed
report's per-candidate means; every time and count comes from the raw records.
"""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from megatron_autotuner.overlap import (
    SearchSpace,
    analyze_run,
    cfg_violations,
    load_ub_yaml,
    scaling_check,
    slots_for,
)
from megatron_autotuner.overlap.analysis import RangeMetrics
from megatron_autotuner.overlap.layer_check import measure_setups
from megatron_autotuner.overlap.report import SETUPS, build_report, summary_text
from megatron_autotuner.overlap.rules import EXTERNAL_PARTNER, UB_NAMES, allowed_methods, cfg_from_dict

EV = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "overlap_h200_x2"
MODELS = ("Qwen3-8B", "Llama-3.1-8B")
VERSIONS = {"torch": "2.11.0+cu130", "transformer_engine": "2.20.2", "megatron_core": "0.19.2"}


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((EV / "tuning_report.json").read_text())


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((EV / "config.json").read_text())


def _approx(x):
    """x with every float wrapped in pytest.approx: the run's Python (3.12) sums floats with compensation,
    older ones do not, so the last bits of sums and means may differ."""
    if isinstance(x, float):
        return pytest.approx(x, rel=1e-12, abs=1e-15)
    if isinstance(x, dict):
        return {k: _approx(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_approx(v) for v in x]
    return x


def _summary(report: dict, model: str, tp: int) -> dict:
    return next(s for s in report["summaries"] if (s["model"], s["tp"]) == (model, tp))


def _with_committed_overlap(committed: dict):
    """The records analysed again, each candidate given the committed trace metrics (traces not kept)."""
    an = analyze_run(EV, with_traces=False)
    by_key = {(c["model"], c["tp"], c["backend"], c["slot"], c["variant"]): c for c in committed["candidates"]}
    assert len(by_key) == len(committed["candidates"]) == len(an.candidates)
    for c in an.candidates:
        ref = by_key[(c.model, c.tp, c.backend, c.slot, c.key)]
        assert c.e2e_ms == ref["e2e_ms_samples"], (c.model, c.slot, c.key)
        if ref["overlap_ratio"] is not None:
            keys = ("gemm_us", "comm_us", "overlap_us", "exposed_comm_us")
            c.metrics = [
                RangeMetrics(
                    **{k: ref[k] for k in keys}, compute_us=0.0, overlap_ratio=ref["overlap_ratio"], span_us=0.0
                )
            ]
    return an


def test_provenance_device_versions_and_setup(committed, config):
    assert committed["device"] == "NVIDIA H200"
    assert {k: committed["versions"][k] for k in VERSIONS} == VERSIONS
    assert committed["measured_date"].startswith("2026-11-23")
    rounds = [json.loads(line) for line in (EV / "collect" / "rank_0.jsonl").read_text().splitlines()]
    envs = [r["env"] for r in rounds if r.get("kind") == "round"]
    assert len(envs) == 44 and all(e["device"] == "NVIDIA H200" for e in envs)
    assert all({k: e[k] for k in VERSIONS} == VERSIONS for e in envs)
    assert all(r.get("status") == "ok" for r in rounds if r.get("kind") in ("round", "job_done"))
    assert committed["failures"] == [] and committed["config"] == config
    assert config["tp_list"] == [2] and config["max_token_len"] == 8192 and config["backend"] == "both"
    check = json.loads((EV / "layer_check.json").read_text())
    assert check["env"]["device"] == "NVIDIA H200" and {k: check["env"][k] for k in VERSIONS} == VERSIONS


def test_reanalysis_reproduces_report(committed, config):
    """Per-GEMM times (all four setups), choices, tuned config, speedups, searches and scaling."""
    an = _with_committed_overlap(committed)
    again = build_report(an, config, tie_frac=config["noise_frac"])
    for key in ("summaries", "scaling", "searches", "candidates"):
        assert again[key] == _approx(committed[key]), key
    speedups = {s["model"]: s["predicted_layer_speedup_vs_te_default"] for s in again["summaries"] if s["tp"] == 2}
    assert speedups == {"Qwen3-8B": pytest.approx(1.0538, abs=1e-4), "Llama-3.1-8B": pytest.approx(1.0528, abs=1e-4)}
    # summary.txt is the text of the committed report
    assert summary_text(committed) == (EV / "summary.txt").read_text()


def test_cli_analyze_on_records_alone_reproduces_the_timings(tmp_path, committed):
    """`mat overlap analyze` on a copy of the records (no traces): same times and speedups; the choice
    may only move inside the noise band, where the missing overlap ratios would have broken the tie."""
    from megatron_autotuner.cli import main

    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(EV / "collect", run / "collect")
    shutil.copy(EV / "config.json", run)
    assert main(["overlap", "analyze", str(run)]) == 0
    again = json.loads((run / "tuning_report.json").read_text())
    tie = committed["config"]["noise_frac"]
    for s in committed["summaries"]:
        a = _summary(again, s["model"], s["tp"])
        assert a["layer"] == _approx(s["layer"]) and a["ops"] == _approx(s["ops"])
        assert a["predicted_layer_speedup_vs_te_default"] == _approx(s["predicted_layer_speedup_vs_te_default"])
        for r, ra in zip(s["slots"], a["slots"], strict=True):
            assert {k: ra[f"{k}_ms"] for k in SETUPS} == _approx({k: r[f"{k}_ms"] for k in SETUPS})
            if r["best_variant"] is not None:
                assert abs(ra["best_ms"] - r["best_ms"]) <= tie * r["best_ms"], (s["model"], r["slot"])
    for model in MODELS:
        assert again["scaling"][model]["recommended_tp"] == committed["scaling"][model]["recommended_tp"] == 1


def test_tuned_never_slower_than_te_default(committed, config):
    tie = config["noise_frac"]
    for model in MODELS:
        s = _summary(committed, model, 2)
        assert len(s["slots"]) == 8
        for r in s["slots"]:
            assert r["tuned_ms"] <= r["te_default_ms"] * (1 + tie), (model, r["slot"])
            assert r["tuned_not_slower_than_te_default"] is True
            assert r["best_ms"] <= r["tuned_ms"] * (1 + tie)  # the verified config is the search's best
        assert s["layer"]["tuned_ms"] < s["layer"]["te_default_ms"] / 1.05
        assert s["tuned_cfg_violations"] == []


def test_search_measured_far_fewer_candidates_than_a_full_sweep(committed, config):
    an = analyze_run(EV, with_traces=False)
    space = SearchSpace.from_job(2, config["max_token_len"], config)
    grid = {sl.key: space.full_grid_size(sl) for sl in slots_for(tuple(config["operators"]))}
    assert sum(grid.values()) == 454
    totals = {}
    for s in an.searches:
        assert s["full_sweep_candidates"] == grid
        for slot, n in s["candidates_profiled"].items():
            # what the search says it measured is what the records hold: distinct userbuffers variants
            assert n == len([c for c in an.group(s["model"], 2, "te", slot) if c.cfg is not None]), slot
        totals[s["model"]] = sum(s["candidates_profiled"].values())
    assert totals == {"Qwen3-8B": 29, "Llama-3.1-8B": 34}
    assert all(t < sum(grid.values()) / 10 for t in totals.values())
    assert {s["model"]: s["candidates_profiled_total"] for s in committed["searches"]} == totals


@pytest.mark.parametrize("model", MODELS)
def test_tuned_yaml_is_a_valid_te_ub_cfgs(model, committed):
    s = _summary(committed, model, 2)
    files = [EV / model / "optimal_tp_comm_overlap_cfg_tp2.yaml", EV / model / "optimal_tp_comm_overlap_cfg.yaml"]
    for path in files:
        raw = yaml.safe_load(path.read_text())
        # every GEMM but proj/fc2 wgrad (`external`, TE's fixed default, left out)
        assert list(raw) == [n for n in UB_NAMES if n not in EXTERNAL_PARTNER]
        cfg = load_ub_yaml(path)  # raises on keys TE's add_ub does not take
        assert cfg_violations(cfg, tp=2, tokens=8192) == []
        for name, v in cfg.items():
            assert v.method in allowed_methods(name), name
            if v.method in ("pipeline", "bulk"):
                assert v.num_sm is not None and v.cga_size is not None and v.set_sm_margin is not None
        assert raw == {n: v for n, v in s["tuned_cfg"].items() if n not in EXTERNAL_PARTNER}
    assert (
        "layer GEMMs: TE default {:.3f} ms, tuned {:.3f} ms".format(s["layer"]["te_default_ms"], s["layer"]["tuned_ms"])
        in files[0].read_text()
    )
    assert "recommended TP for this model: 1" in files[1].read_text()


def test_yaml_is_the_config_the_tuned_rounds_measured(committed):
    """The yaml is what the `tuned` rounds measured, GEMM by GEMM. (Before best_candidate required repeated
    samples, a single 0.624 ms sample of ring_exchange for Llama-3.1-8B proj_fprop beat TE's pipeline, 7
    samples at 0.639 ms, and went into the yaml unverified; report and yaml were regenerated from the same
    records with the rule.)"""
    rounds = [json.loads(line) for line in (EV / "collect" / "rank_0.jsonl").read_text().splitlines()]
    for model in MODELS:
        measured = [r["cfg"] for r in rounds if r.get("label") == "tuned" and r["model"] == model]
        assert len(measured) == 2 and measured[0] == measured[1]
        yml = load_ub_yaml(EV / model / "optimal_tp_comm_overlap_cfg_tp2.yaml")
        tuned = cfg_from_dict(measured[0])
        assert {n for n in UB_NAMES if n not in EXTERNAL_PARTNER and yml.get(n) != tuned.get(n)} == set(), model
    row = next(r for r in _summary(committed, "Llama-3.1-8B", 2)["slots"] if r["slot"] == "proj.fwd")
    assert row["best_variant"].startswith("pipeline") and row["best_ms"] == row["tuned_ms"]


def test_tp_scaling_verdict_follows_from_the_timings(committed, config):
    tol = config["scaling_tolerance"]
    for model, over in (("Qwen3-8B", 0.256), ("Llama-3.1-8B", 0.239)):
        tp1, tp2 = _summary(committed, model, 1), _summary(committed, model, 2)
        assert all(tp1["layer"][f"{k}_ms"] is None for k in ("te_default", "tuned", "symm_mem"))
        best, setup = min((tp2["layer"][f"{k}_ms"], k) for k in SETUPS)
        assert setup == "tuned"
        res = scaling_check("layer", tp1["layer"]["nccl_ms"], {2: (best, setup, None)}, tol)
        assert res.largest_efficient_tp == 1 and not res.points[0].efficient
        assert best / (tp1["layer"]["nccl_ms"] / 2) - 1 == pytest.approx(over, abs=0.002)
        assert best > (1 + tol) * tp1["layer"]["nccl_ms"] / 2
        sc = committed["scaling"][model]
        assert sc["recommended_tp"] == res.largest_efficient_tp == 1
        ops = {r["name"]: r["largest_efficient_tp"] for r in sc["results"]}
        # the big MLP GEMMs scale (fc1 92-96%, fc2 89-90% efficient); qkv and proj do not (46-62%)
        assert ops == {"qkv": 1, "proj": 1, "fc1": 2, "fc2": 2, "layer": 1}


# ---- layer check (overlap/layer_check.py) --------------------------------------------------------------


class _FakeTE:
    """TE's userbuffers state as the layer check meets it: layers with overlap flags refuse to be built
    before initialize_ub (TE 2.x asserts it) and look their communicators up at every forward."""

    def __init__(self):
        self.cfg = None
        self.live = False
        self.events = []

    def build(self, overlap):
        assert not overlap or self.live, "initialize_ub() must be called before layer construction."
        self.events.append(("build", overlap))
        return {"overlap": overlap}

    def init(self, cfg):
        assert not self.live, "initialize_ub called twice"
        self.live, self.cfg = True, cfg
        self.events.append(("init", cfg))

    def destroy(self):
        self.live, self.cfg = False, None
        self.events.append(("destroy",))

    def time(self, layer):
        if layer["overlap"]:
            assert self.live
            return 10.0 if self.cfg is None else 9.0
        return 11.0


def test_layer_check_builds_the_overlap_layer_after_initialize_ub():
    """The 2x H200 layer check failed for both models with TE's "initialize_ub() must be called before
    layer construction" (layer_check_first_attempt_failed.json): it built the overlap layer before
    initialising userbuffers."""
    check = json.loads((EV / "layer_check_first_attempt_failed.json").read_text())
    assert {m["status"] for m in check["models"].values()} == {"failed"}
    assert all("initialize_ub() must be called before" in m["error"] for m in check["models"].values())

    te, tuned = _FakeTE(), {"proj_fprop": {"method": "ring_exchange"}}
    ms = measure_setups(te.build, te.init, te.destroy, te.time, tuned, passes=2)
    assert ms == {"nccl": [11.0, 11.0], "te_default": [10.0, 10.0], "tuned": [9.0, 9.0]}
    assert [e for e in te.events if e[0] == "build"] == [("build", False), ("build", True)]  # built once each
    assert te.events[:3] == [("build", False), ("init", None), ("build", True)]
    assert not te.live  # userbuffers destroyed at the end


def test_tuned_yaml_in_a_real_layer(committed):
    """The fixed layer check on 2x H200 (megatron-core TE TransformerLayer, TP=2 + SP, tp_comm_overlap=True,
    seq 8192, 2 passes x 8 steps): the tuned yaml beats TE's default in both models. Llama-3.1-8B: 1.045x
    measured vs 1.053x predicted from the GEMMs; Qwen3-8B: 1.018x vs 1.054x (TE default's two passes are
    5% apart there, so the layer cannot resolve more)."""
    check = json.loads((EV / "layer_check.json").read_text())
    assert check["env"]["device"] == "NVIDIA H200" and check["tp"] == 2 and check["seq_len"] == 8192
    predicted = {s["model"]: s["predicted_layer_speedup_vs_te_default"] for s in committed["summaries"] if s["tp"] == 2}
    for model, m in check["models"].items():
        assert m["status"] == "ok" and len(m["ms"]["tuned"]) == 2
        assert max(m["ms"]["tuned"]) < max(m["ms"]["te_default"]), model
        assert m["speedup_tuned_vs_te_default"] > 1.0
        spread = max(m["ms"]["te_default"]) / min(m["ms"]["te_default"]) - 1
        assert abs(m["speedup_tuned_vs_te_default"] - predicted[model]) <= max(spread, 0.01), model


def test_layer_check_keeps_partial_times_and_frees_userbuffers_on_error():
    te = _FakeTE()
    calls = []

    def time(layer):
        calls.append(layer["overlap"])
        if len(calls) == 3:  # the tuned setup of the first pass fails
            raise RuntimeError("ub failure")
        return te.time(layer)

    ms = {"nccl": [], "te_default": [], "tuned": []}
    with pytest.raises(RuntimeError):
        measure_setups(te.build, te.init, te.destroy, time, {}, passes=2, ms=ms)
    assert ms == {"nccl": [11.0], "te_default": [10.0], "tuned": []}
    assert not te.live


def test_layer_check_at_tp1_times_the_plain_layer_only():
    """On one GPU the layer check is the scaling baseline: the plain layer, no userbuffers set up."""
    te = _FakeTE()
    ms = measure_setups(te.build, te.init, te.destroy, te.time, None, passes=2, setups=("nccl",))
    assert ms == {"nccl": [11.0, 11.0]}
    assert te.events == [("build", False)] and not te.live
