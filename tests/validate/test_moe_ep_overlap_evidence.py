"""The 2x H200 MoE evidence of #40 (benchmarks/results/moe_ep_overlap_h200_x2*, moe_ep_host_h200_x2, moe_ep_r4_h200_x2,
moe_r5_h200_x2, moe_r6_h200_x2; `python benchmarks/moe_ep_overlap.py`): gpt-oss-20b (4 layers) and Mixtral-8x7B
(2 layers) at ep 1 and 2, with and without Megatron's all-to-all overlap, and padded token dropping, on six 2-GPU
hosts (A: rounds 1-3, B: the host experiment, C: round 4, D: round 5, E: round 6, F: round 7), predicted before each
round. What
the model gets right is held; its misses are pinned to the measured ranges docs/accuracy.md states, so a change in
either shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_script

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads((RESULTS / "moe_ep_overlap_h200_x2/report.json").read_text())


def _ok(report, label: str) -> list[dict]:
    return [r for r in report["rows"] if r["label"] == label and r["measured_step_s"] is not None]


def test_the_report_is_what_the_committed_runs_give(report):
    assert load_script("moe_ep_overlap").report() == report


def _err(r: dict, key: str) -> float:
    return r[key] / r["measured_step_s"] - 1


def test_each_round_was_predicted_before_it_ran():
    for folder, predicted, _, _ in load_script("moe_ep_overlap").ROUNDS.values():
        predicted_at = json.loads((RESULTS / folder / predicted).read_text())["predicted_at"]
        run_date = json.loads((RESULTS / folder / "summary.json").read_text())["date"]
        assert predicted_at < run_date, folder


def test_the_all_to_all_moves_as_modelled(report):
    """Round 1's profiled ep 2 steps' all-to-alls, matched across both ranks: the transfer is the model's within 10%
    (gpt-oss-20b 166 us against 175, Mixtral 127 against 128); what they lost was waiting for the other rank."""
    profiled = [r for r in report["rows"] if r["round"] == "r1" and r["collective_waits"] and r["model_all_to_all_ms"]]
    assert len(profiled) == 2
    for r in profiled:
        a2a = next(c for c in r["collective_waits"] if c["collective"] == "send_recv")
        assert a2a["transfer_median_us"] / 1e3 == pytest.approx(r["model_all_to_all_ms"], rel=0.10), r["label"]
        assert max(a2a["wait_sum_us"]) > 10 * a2a["transfer_sum_us"] / a2a["calls"], r["label"]


def test_the_faster_ep_size_is_the_predicted_one(report):
    """EP 2 against EP 1 at dp 2, the unprofiled rounds on hosts A, C, D (gpt-oss-20b) and E: regret 0."""
    for model, rounds in (
        ("oss20b L4", ("r1", "r2", "r4", "r5 oss", "r6")),
        ("mixtral L2", ("r1", "r2", "r4 mixtral", "r6")),
    ):
        for rnd in rounds:
            ep1 = next(r for r in _ok(report, f"{model} ep1 dp2") if r["round"] == rnd)
            ep2 = next(r for r in _ok(report, f"{model} ep2 dp2") if r["round"] == rnd)
            assert ep2["predicted_now_machine_floor_step_s"] < ep1["predicted_now_machine_floor_step_s"]
            assert ep2["measured_step_s"] < ep1["measured_step_s"], (model, rnd)


def test_the_overlap_loses_where_the_eager_moe_block_paces_the_layer(report):
    """gpt-oss-20b's MoE blocks are host-paced at ep 2: the combined step ran 9-16% slower than the serial schedule
    (hosts A and C); the model gives it no gain and now prices the loss, the output layer drained at each combined
    micro-batch's first token-count wait (15%: `moe_overlap.head_drain_s`, benchmarks/results/moe_overlap_host_h200_x2).
    Mixtral's blocks, which the model holds GPU-paced, ran 1-4% faster with it (the model: 1%)."""
    for serial_round, overlap_round in (("r2", "r3"), ("r4", "r4")):
        serial = next(r for r in _ok(report, "oss20b L4 ep2 dp2") if r["round"] == serial_round)
        overlap = next(r for r in _ok(report, "oss20b L4 ep2 dp2 a2a-overlap") if r["round"] == overlap_round)
        measured = overlap["measured_step_s"] / serial["measured_step_s"]
        model = overlap["predicted_now_step_s"] / serial["predicted_now_step_s"]
        assert measured > 1.08 and 1.0 < model < measured + 0.08
    for rnd in ("r1", "r2", "r4 mixtral"):
        serial, overlap = (next(r["measured_step_s"] for r in _ok(report, label) if r["round"] == rnd)
                           for label in ("mixtral L2 ep2 dp2", "mixtral L2 ep2 dp2 a2a-overlap"))  # fmt: skip
        assert 0.95 * serial < overlap < serial, rnd


def test_with_its_machines_floors_the_dropless_steps_hold_on_hosts_b_and_c(report):
    """Hosts B and C, each with the MoE host floor it measured minutes before its runs: every unprofiled dropless step
    (ep 1 and 2, serial and overlapped, both models) within 10%, where the default floors (an H100 lease's host) left
    host C's 7-25% under. A rank's MoE host grows with its local experts, not the model's: 16 local of 32 at ep 2 ran
    as 16 of 16 at ep 1 (485 / 494 ms)."""
    checked = 0
    for r in report["rows"]:
        if r["machine"] not in "BC" or r["measured_step_s"] is None or "cap1" in r["label"]:
            continue
        if "profiled" in r["label"] or "memory history" in r["label"]:
            continue
        assert abs(_err(r, "predicted_now_machine_floor_step_s")) < 0.10, r["label"]
        checked += 1
    assert checked == 10
    host = {r["label"]: r["measured_step_s"] for r in report["rows"] if r["round"] == "host"}
    assert host["oss20b L4 ep2 (16 local of 32)"] == pytest.approx(host["oss20b-E16 L4 ep1 (16 local of 16)"], rel=0.03)


def test_known_misses_stay_where_the_docs_put_them(report):
    """Not met, documented (docs/accuracy.md, "The EP all-to-all overlap on two GPUs"): on host A, with its own floors,
    the ep 2 steps ran 14-19% (gpt-oss-20b) and 14% (Mixtral) over the model; the overlap with delayed wgrad 22-32%."""
    for r in _ok(report, "oss20b L4 ep2 dp2"):
        if r["machine"] == "A":
            assert -0.20 < _err(r, "predicted_now_machine_floor_step_s") < -0.13
    for r in _ok(report, "mixtral L2 ep2 dp2"):
        if r["machine"] == "A":
            assert -0.15 < _err(r, "predicted_now_machine_floor_step_s") < -0.13
    dw = _ok(report, "mixtral L2 ep2 dp2 a2a-overlap+delay-wgrad")[0]["measured_step_s"]
    assert (
        dw
        > 1.10 * next(r for r in _ok(report, "mixtral L2 ep2 dp2 a2a-overlap") if r["round"] == "r2")["measured_step_s"]
    )


def test_peaks_within_5_percent_with_the_moe_backwards_queued_frees(report):
    """Hosts A-C: every run's peak (the allocator's reserve) within 5.5% of today's model, 29 of 31 within 5%:
    Mixtral's reserve ran 2.4-5.8 GiB over its allocation, the expert weight gradients its GPU-paced backward had freed
    on the host (`costmodel.queued_frees`), which the model before counted nowhere (7-15% under). Hosts D and E (rounds
    5 and 6, 19 runs): 15 within 5%. Not met: the padded Mixtral layout 7.5-8.1% under (its allocator history held
    4.2 GiB awaiting at the reserved peak against the model's 3.3, and 2.5 GiB reserved but free) and Mixtral's
    overlap 5.3-6.3% under."""
    rows = [r for r in report["rows"] if r["measured_peak_gib"]]
    errors = {id(r): r["predicted_now_peak_gib"] / r["measured_peak_gib"] - 1 for r in rows}
    first = [errors[id(r)] for r in rows if r["machine"] in "ABC"]
    assert len(first) == 31
    assert max(abs(e) for e in first) < 0.055
    assert sum(abs(e) < 0.05 for e in first) >= 29
    later = [r for r in rows if r["machine"] in "DE"]
    assert len(later) == 19
    misses = {r["label"]: errors[id(r)] for r in later if abs(errors[id(r)]) >= 0.05}
    assert set(misses) == {
        "mixtral L2 ep2 cap1-pad",
        "mixtral L2 ep2 cap1-pad memory history",
        "mixtral L2 ep2 a2a-overlap",
        "mixtral L2 ep2 a2a-overlap profiled",
    }
    assert all(-0.085 < e < -0.05 for e in misses.values())
    before = [r["predicted_before_peak_gib"] / r["measured_peak_gib"] - 1 for r in rows
              if r["machine"] in "ABC" and r["label"].startswith("mixtral")]  # fmt: skip
    assert max(before) < -0.06


def test_the_three_process_floor_on_a_new_host(report):
    """Round 6 (host E): the MoE floor measured in three processes per case, then the layouts predicted with it before
    they ran (`predicted_at_run_step_s`). Mixtral's steps within 4%; gpt-oss-20b's 10-15% over: this host's testbench
    block ran ~1.6x host D's where its steps ran 5% slower, so the empty-queue testbench level overstates the in-model
    pace here (not met, pinned). Host D's single-process floor had put gpt-oss ep 1 14% over and ep 2 within 1%."""
    r6 = {r["label"]: _err(r, "predicted_at_run_step_s") for r in report["rows"] if r["round"] == "r6"}
    assert abs(r6["mixtral L2 ep1 dp2"]) < 0.04 and abs(r6["mixtral L2 ep2 dp2"]) < 0.04
    assert 0.09 < r6["oss20b L4 ep2 dp2"] < 0.11 and 0.13 < r6["oss20b L4 ep1 dp2"] < 0.16
    r5 = {r["label"]: _err(r, "predicted_at_run_step_s") for r in report["rows"] if r["round"] == "r5 oss"}
    assert 0.13 < r5["oss20b L4 ep1 dp2"] < 0.15 and abs(r5["oss20b L4 ep2 dp2"]) < 0.01


def test_padded_gpt_oss_layers_wait_in_their_activation(report):
    """gpt-oss-20b's padded layers stop the host once per forward in the experts' quick-GEGLU (a pageable copy of its
    linear offset; `costmodel.layer.experts_activation_syncs_host`), so the model holds them host-bound as dropless
    blocks. With each host's own floors, the padded gpt-oss steps on hosts A, C, D and F (2 GPUs, ep 2; and one of
    F's GPUs, 16 and 32 experts) come within -12%..+12%, 4 of 9 within 10% (the rest 10-11.5%); held to their host
    per micro-batch, as a padded block that never waits, they ran 15-27% over the model. Mixtral's padded layers
    (SwiGLU, no such copy) stay within 4%."""
    padded = [r for r in report["rows"] if "cap1-pad" in r["label"] and "s512" not in r["label"]]
    padded = [r for r in padded if r["measured_step_s"] is not None and r["round"] != "blind padded"]
    oss = [_err(r, "predicted_now_machine_floor_step_s") for r in padded if r["label"].startswith("oss20b")]
    assert len(oss) == 9
    assert all(-0.12 < e < 0.12 for e in oss)
    assert sum(abs(e) < 0.10 for e in oss) >= 4
    mixtral = [_err(r, "predicted_now_machine_floor_step_s") for r in padded if r["label"].startswith("mixtral")]
    assert len(mixtral) == 3 and all(abs(e) < 0.04 for e in mixtral)


def test_padded_gpt_oss_blind_on_a_new_host(report):
    """One GPU of host G, its floors measured first and the layouts predicted with them before they ran: the two shapes
    no run had (capacity 1.5; 8192 tokens) came within 2%; the 32-expert layout 14.5% over, as gpt-oss's 32-local-expert
    dropless steps came 14-15% over on hosts D and E (the floor's slope in local experts; not met, pinned). Peaks 2-5%
    over."""
    blind = {r["label"]: _err(r, "predicted_at_run_step_s") for r in report["rows"] if r["round"] == "blind padded"}
    assert abs(blind["oss20b-E16 L4 cap1.5-pad"]) < 0.02
    assert abs(blind["oss20b-E16 L4 s8192 cap1-pad"]) < 0.02
    assert 0.13 < blind["oss20b L4 cap1-pad"] < 0.16
    peaks = [r for r in report["rows"] if r["round"] == "blind padded"]
    # peaks +1.9..+4.5% at the run (its floors), +2.0..+5.1% with the default floors' queued frees
    assert all(0.0 < r["predicted_now_peak_gib"] / r["measured_peak_gib"] - 1 < 0.052 for r in peaks)
