"""The dense host floor measured in the model on two H100 leases (benchmarks/results/validation_h100_x1/host_probe
and host_probe_2, `h100_x1_host_probe.sh`): the probes give the committed floors, the outside-layer defaults are
those probes' medians, and the second lease was predicted before its runs within 10% on 16 of 18 layouts."""

import json
import statistics
from pathlib import Path

import pytest

from megatron_autotuner.costmodel import calibration_from_dict
from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.validate.host_floor import dense_floors_from_probes
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict
from megatron_autotuner.validate.results import aggregate

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = ROOT / "benchmarks/results/validation_h100_x1"
LEASES = ("host_probe", "host_probe_2")


def _rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]


def _probe_rows(lease: str, part: str = "run") -> list[dict]:
    return list(aggregate(VALIDATION / lease / part / "host_floor" / "probes").values())


def _floor_doc(lease: str, part: str = "run") -> dict:
    return json.loads((VALIDATION / lease / part / "host_floor/host_floor.calibration.json").read_text())


@pytest.mark.parametrize(("lease", "part"), [("host_probe", "run"), ("host_probe", "after"), ("host_probe_2", "run")])
def test_committed_floor_is_what_the_probes_give(lease, part):
    """The probes' committed records, re-aggregated, give the floor the predictions used (the first lease ran before
    the outside-layer terms existed: it has no microbatch_s / step_s)."""
    (floor,) = dense_floors_from_probes(_probe_rows(lease, part))
    (committed,) = _floor_doc(lease, part)["dense_host_floor"]
    for key in ("fwd_s", "bwd_s", "fwd_no_grad_s", "microbatch_s", "step_s"):
        if key in committed:
            assert floor[key] == pytest.approx(committed[key], rel=1e-9), key
    assert len(floor["probes"]) == 6  # three models, training and forward-only


def _ratios() -> tuple[list[float], list[float]]:
    """Per probed model and round of the first lease: host per micro-batch outside the layers over the layer's
    training forward, and per step over its forward + backward."""
    per_mb, per_step = [], []
    for part in ("run", "after"):
        probes = dense_floors_from_probes(_probe_rows("host_probe", part))[0]["probes"]
        by_model = {}
        for p in probes:
            by_model.setdefault(p["model"], {})[p["mode"]] = p
        for both in by_model.values():
            train, fwd = both["train"], both["forward"]
            per_mb.append(fwd["outside_layers_ms"] / train["fwd_ms"])
            step = train["outside_layers_ms"] - fwd["outside_layers_ms"]
            per_step.append(step / (train["fwd_ms"] + train["bwd_ms"]))
    return per_mb, per_step


def test_outside_layer_defaults_are_the_first_leases_probes():
    per_mb, per_step = _ratios()
    assert len(per_mb) == len(per_step) == 6
    assert statistics.median(per_mb) == pytest.approx(d.DENSE_HOST_MICROBATCH_PER_LAYER_FWD, abs=0.005)
    assert statistics.median(per_step) == pytest.approx(d.DENSE_HOST_STEP_PER_LAYER, abs=0.005)


def test_second_lease_predicted_before_the_runs_with_its_measured_floor():
    """16 of 18 within 10% (median 1.4%), and the predictions `mat validate` wrote are what today's model makes with
    the committed floor: the step-time model has not moved since."""
    lease = VALIDATION / "host_probe_2"
    calibration = calibration_from_dict(_floor_doc("host_probe_2"))
    errors = []
    for r in _rows(lease / "run"):
        assert r["status"] == "ok"
        errors.append(r["predicted"]["step_time_s"] / r["measured"]["step_time_s"] - 1)
        gaf = r.get("gradient_accumulation_fusion", False)
        now = predict(Layout.from_dict(r["layout"]), "H100-SXM", calibration, gradient_accumulation_fusion=gaf)
        assert now["step_time_s"] == pytest.approx(r["predicted"]["step_time_s"], rel=1e-6), r["label"]
    assert len(errors) == 18
    assert sum(abs(e) <= 0.10 for e in errors) == 16
    assert statistics.median(abs(e) for e in errors) < 0.03
    assert all(abs(e) <= 0.16 for e in errors)


def test_default_floor_cannot_fit_every_lease():
    """The same eager layout on five H100 leases: the host's pace, not the model, sets the spread."""
    label = "Q3-0.6B mbs1 train eager"
    measured = []
    for folder in ("host_bound", "graphed_training", "small_forward", "host_probe/run", "host_probe_2/run"):
        for r in _rows(VALIDATION / folder):
            if r["label"].startswith(label) and r["status"] == "ok":
                measured.append(r["measured"]["step_time_s"])
    assert len(measured) == 5
    assert max(measured) / min(measured) > 1.5  # 165.5 .. 269.0 ms


def test_in_model_host_times_track_the_probes_in_the_median_not_per_process():
    """Each run's own layer host times (`Layout.host_timing`; the forward-only runs against the forward-only probe)
    over its lease's probe of the same model: the median is the probe's at every micro-batch (the GPU's load does
    not slow the host), but one process issues up to a quarter faster or half slower than another."""
    by_mbs: dict[int, list[float]] = {}
    for lease in LEASES:
        probes = {(p["model"], p["mode"]): p for p in dense_floors_from_probes(_probe_rows(lease))[0]["probes"]}
        for r in _rows(VALIDATION / lease / "run"):
            lay = r["layout"]
            ratio = r["measured"]["host_timing"]["fwd_ms"] / probes[(lay["model"], lay["mode"])]["fwd_ms"]
            by_mbs.setdefault(lay["micro_batch_size"], []).append(ratio)
    assert sorted(by_mbs) == [1, 2, 4] and all(len(v) == 12 for v in by_mbs.values())
    for ratios in by_mbs.values():
        assert statistics.median(ratios) == pytest.approx(1.0, abs=0.05)
    every = [x for v in by_mbs.values() for x in v]
    assert 0.7 < min(every) < 0.8 and 1.4 < max(every) < 1.55


@pytest.mark.parametrize("lease", LEASES)
def test_forward_only_peaks_within_5pct(lease):
    """Forward-only peaks with the logits rule (`MemoryAllowance.bytes_for`): every eager forward row of both leases
    within 5%."""
    for r in _rows(VALIDATION / lease / "run"):
        if r["layout"]["mode"] != "forward":
            continue
        gaf = r.get("gradient_accumulation_fusion", False)
        now = predict(Layout.from_dict(r["layout"]), "H100-SXM", gradient_accumulation_fusion=gaf)
        assert now["peak_memory_gib"] / r["measured"]["peak_gib"] - 1 == pytest.approx(0, abs=0.05), r["label"]
