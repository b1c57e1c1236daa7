"""`Layout.manual_gc` (Megatron-LM's --manual-gc): the runner turns Python's collector off for the steps, and on one
H200 that did not make a host-bound step faster (benchmarks/manual_gc.py), so the cost model prices the flag as
nothing."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.validate.layout import Layout, load_layouts_file
from tests.benchmark_scripts import load_script


def test_the_field_keeps_earlier_ids_and_shows_in_the_label():
    layouts, _ = load_layouts_file("benchmarks/validation/h200_x1_moe_token_drop_layouts.json")
    assert layouts[0].layout_id.endswith(".71a695ad58")  # the committed run's id (moe_token_drop_h200)
    manual = layouts[0].replace(manual_gc=True, name="")
    assert manual.layout_id != layouts[0].layout_id and "manual-gc" in manual.label


@pytest.mark.mcore
def test_the_runner_turns_the_collector_off_for_the_steps(tiny, tmp_path):
    """On CPU: with the collector on, the steps of a tiny model trigger collections; off, a tenth as many at most."""
    pytest.importorskip("megatron.core")
    from megatron_autotuner.validate import validate_layouts
    from megatron_autotuner.validate.results import rank_file, read_records

    common = dict(model=tiny, seq_length=32, global_batch_size=2, warmup_steps=1, steps=3, use_te=False)
    layouts = [Layout(**common, manual_gc=False, name="on"), Layout(**common, manual_gc=True, name="off")]
    rep = validate_layouts(layouts, tmp_path / "o", "H200", device="cpu", layout_timeout_s=60, log=lambda *a: 0)
    assert [r["status"] for r in rep.rows] == ["ok", "ok"]
    collections = {
        r["layout"]["name"]: r["measured"]["gc_collections"] for r in read_records(rank_file(tmp_path / "o", 0))
    }
    # off: only the collections code asks for by gc.collect(); on: the collector's own as well, dozens a step
    assert collections["off"] * 10 < collections["on"]


def test_the_collector_off_made_no_host_bound_step_faster():
    """Both orders on one lease: off was never more than 3% faster (it was 0.1-12% slower where the host paced the
    step, as the machine drifted between runs), and the GPU-bound pairs ran alike. The predictions were written
    before the runs."""
    doc = load_script("manual_gc").report()
    assert len(doc["rows"]) == 6 and doc["fastest_off_over_on"] > -0.03
    assert set(doc["host_paced_cases"]) == {"0.6B", "30B-A3B-E16 L4 dropless fused"}
    for case, effect in doc["off_over_on_by_case"].items():
        assert -0.03 < effect < (0.10 if case in doc["host_paced_cases"] else 0.01)
    lease = load_script("manual_gc").LEASE
    predicted_at = json.loads((lease / "predicted.json").read_text())["predicted_at"]
    assert predicted_at < doc["versions"]["date"]


def test_a_launch_with_manual_gc_is_run_with_it(tmp_path, capsys):
    """`mat validate --megatron-args` runs the collector as the launch says, and the prediction is the same."""
    from megatron_autotuner.cli import main

    flags = ("--num-layers 2 --hidden-size 1024 --ffn-hidden-size 3072 --num-attention-heads 16 --seq-length 2048 "
             "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16 --swiglu")  # fmt: skip
    steps = {}
    for extra in ("", " --manual-gc --manual-gc-interval 100"):
        launch = tmp_path / f"l{len(extra)}.sh"
        launch.write_text(flags + extra + "\n")
        args = ["validate", "--megatron-args", str(launch), "--gpu", "H200", "--num-gpus", "1", "--dry-run", "--json"]
        assert main([*args, "--output-dir", str(tmp_path / f"v{len(extra)}")]) == 0
        (layout,) = json.loads(capsys.readouterr().out)["layouts"]
        steps[layout["layout"]["manual_gc"]] = layout["predicted"]["step_time_s"]
    assert set(steps) == {False, True} and steps[False] == steps[True]


def test_a_layouts_file_that_misspells_the_flag_gets_one_line(tmp_path, capsys):
    from megatron_autotuner.cli import main

    bad = tmp_path / "layouts.json"
    bad.write_text(json.dumps({"gpu": "H200", "layouts": [{"model": "Qwen3-0.6B", "seq_length": 4096,
                                                           "manual_gc": "yes"}]}))  # fmt: skip
    assert main(["validate", "--layouts", str(bad), "--dry-run", "--output-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == "mat: error: manual_gc: must be true or false, got 'yes'"
