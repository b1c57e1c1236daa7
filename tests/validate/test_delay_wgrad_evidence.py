"""`--delay-wgrad-compute` beside the EP all-to-all overlap on 2x H200, host R (benchmarks/validation/x2_delay_wgrad.sh,
benchmarks/results/delay_wgrad_h200_x2, `python benchmarks/delay_wgrad.py`): three interleaved fresh-process pairs of
Mixtral L2 ep 2, against the process-to-process pace noise found on hosts P and Q."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_scripts import load_script

delay_wgrad = load_script("delay_wgrad")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return delay_wgrad.repeat_rows()


def test_every_pair_ran_slower_with_delayed_wgrad(rows):
    """+8.2%, +8.4%, +8.6%: a spread far under the step's change, so not one process's draw; the earlier unprofiled
    single runs (hosts A and D) +11.9% and +12.6%."""
    pairs = delay_wgrad.pairs(rows)
    assert len(pairs) == 3
    assert all(0.07 < p["change"] < 0.10 for p in pairs)
    earlier = {e["folder"]: e["change"] for e in delay_wgrad.earlier()}
    assert 0.10 < earlier["moe_ep_overlap_h200_x2_r2"] < 0.14 and 0.10 < earlier["moe_r5_h200_x2/more"] < 0.14


def test_the_model_priced_both_the_same_before_the_runs(rows):
    """Predicted first with host D's floors: 246.5 ms either way; without delayed wgrad within 7%, with it 8-14% under.
    Peaks within 5%."""
    predicted = json.loads((delay_wgrad.RESULTS / "predicted.json").read_text())
    assert len({round(p["predicted"]["step_time_s"], 6) for p in predicted["layouts"]}) == 1
    for row in rows:
        err = row["predicted_before_step_s"] / row["measured_step_s"] - 1
        assert (-0.07 < err < 0.01) if not row["delay_wgrad"] else (-0.14 < err < -0.07), row["label"]
        assert abs(row["predicted_before_peak_gib"] / row["measured_peak_gib"] - 1) < 0.05, row["label"]
