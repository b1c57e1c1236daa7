"""Real megatron-core 0.16 runs on CPU (gloo, local spec): training + forward-only through the real
`get_forward_backward_func`, DP2 / TP2, resume, injected OOM / hang recorded per layout.

CPU limits (megatron-core allocates on CUDA there): no pipeline parallelism, no full recompute,
no CP (TE attention only), no megatron DDP / distributed optimizer (plain AdamW instead).
"""

import json

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.validate import validate_layouts
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.results import rank_file, read_records
from tests.proc_helpers import processes_mentioning

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.mcore


def _lay(model, name, **kw):
    base = dict(model=model, seq_length=32, global_batch_size=2, warmup_steps=1, steps=2, use_te=False, name=name)
    return Layout(**{**base, **kw})


def test_world1_train_forward_resume_and_faults(tiny, tmp_path, monkeypatch):
    layouts = [
        _lay(tiny, "train"),
        _lay(tiny, "forward", mode="forward"),
        _lay(tiny, "oom", global_batch_size=4),  # fault injection: a CUDA OOM raised in the step loop
        _lay(tiny, "hang", micro_batch_size=2),  # fault injection: hangs -> killed after the timeout
        _lay(tiny, "after", num_layers=1),  # runs in the restarted job
    ]
    monkeypatch.setenv("MAT_VALIDATE_FAULT", "oom:oom")
    out = tmp_path / "out"
    # first batch: everything except the hang, then the hang alone with a short timeout
    rep = validate_layouts(
        layouts[:3] + layouts[4:],
        out,
        "H200",
        device="cpu",
        layout_timeout_s=60,
        log=lambda *a: 0,
        layouts_per_job=None,
    )
    # one shared job; the OOM ends it (fail fast) and "after" runs in a fresh one
    assert len(list((out / "jobs").glob("*.json"))) == 2
    rows = {r["label"]: r for r in rep.rows}
    assert rows["train"]["status"] == "ok" and rows["forward"]["status"] == "ok" and rows["after"]["status"] == "ok"
    m = rows["train"]["measured"]
    assert len(read_records(rank_file(out, 0))[0]["measured"]["step_times_s"]) == 2
    assert m["step_time_s"] > 0 and m["tokens_per_s_per_gpu"] == pytest.approx(2 * 32 / m["step_time_s"])
    assert rows["train"]["layer_spec"] == "local" and isinstance(m["loss"], float)
    assert rows["oom"]["status"] == "failed" and rows["oom"]["failure_kind"] == "oom"
    assert "out of memory" in rows["oom"]["error"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["targets"]["layouts_ok"] == 3 and summary["targets"]["layouts_failed"] == 1
    assert len((out / "results.jsonl").read_text().splitlines()) == 4
    # rerun: nothing runs again (no new job file)
    jobs = sorted((out / "jobs").glob("*.json"))
    validate_layouts(layouts[:3] + layouts[4:], out, "H200", device="cpu", log=lambda *a: 0)
    assert sorted((out / "jobs").glob("*.json")) == jobs

    monkeypatch.setenv("MAT_VALIDATE_FAULT", "hang:hang")
    rep = validate_layouts(layouts, out, "H200", device="cpu", layout_timeout_s=8, log=lambda *a: 0)
    hang = next(r for r in rep.rows if r["label"] == "hang")
    assert hang["status"] == "failed" and hang["failure_kind"] == "timeout" and "timed out" in hang["error"]
    assert sum(r["status"] == "ok" for r in rep.rows) == 3
    assert processes_mentioning(str(out)) == []  # the hung rank was killed with its torchrun


def test_world2_dp_and_tp(tiny, tmp_path):
    layouts = [
        _lay(tiny, "dp2", num_gpus=2, global_batch_size=4),
        _lay(tiny, "tp2", num_gpus=2, tp=2, sequence_parallel=False, global_batch_size=4),
    ]
    rep = validate_layouts(layouts, tmp_path / "o", "H200", device="cpu", layout_timeout_s=60, log=lambda *a: 0)
    assert [r["status"] for r in rep.rows] == ["ok", "ok"]
    assert all(len(r["per_rank"]) == 2 for r in rep.rows)
    assert len(list((tmp_path / "o" / "jobs").glob("*.json"))) == 2  # default: a fresh job per layout


def test_expandable_segments_run_in_their_own_job(tiny, tmp_path, monkeypatch):
    """A process has one caching allocator: layouts that want expandable segments get their own job, whose
    worker sets PYTORCH_CUDA_ALLOC_CONF before CUDA starts (and keeps the user's other settings)."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    layouts = [
        _lay(tiny, "default", expandable_segments=False),
        _lay(tiny, "expandable", expandable_segments=True, memory_history=True),
    ]
    out = tmp_path / "out"
    rep = validate_layouts(
        layouts, out, "H200", device="cpu", layout_timeout_s=60, log=lambda *a: 0, layouts_per_job=None
    )
    assert [r["status"] for r in rep.rows] == ["ok", "ok"]
    assert len(list((out / "jobs").glob("*.json"))) == 2
    conf = {
        r["layout"]["expandable_segments"]: r["env"]["pytorch_cuda_alloc_conf"] for r in read_records(rank_file(out, 0))
    }
    assert conf == {False: "max_split_size_mb:512", True: "max_split_size_mb:512,expandable_segments:True"}
    # the allocator history needs CUDA: on CPU the layout still runs, with a note instead of a snapshot
    expandable = next(r for r in read_records(rank_file(out, 0)) if r["layout"]["memory_history"])
    assert "memory history needs CUDA" in expandable["note"] and "memory_history" not in expandable


def test_stand_ins_run_each_rank_alone_and_resume_the_missing_rank(tiny, tmp_path):
    """`stand_in="all"`: each rank of a 2-rank TP layout runs in its own process over torch's fake process group
    (no torchrun); the records say so, only memory is compared, and a rerun runs only a rank with no record."""
    lay = _lay(tiny, "tp2", num_gpus=2, tp=2, sequence_parallel=False, global_batch_size=4)
    out = tmp_path / "o"
    rep = validate_layouts([lay], out, "H200", device="cpu", layout_timeout_s=60, log=lambda *a: 0, stand_in="all")
    row = rep.rows[0]
    assert row["status"] == "ok" and row["stand_in"] and len(row["per_rank"]) == 2
    assert row["error_rel"]["step_time"] is None and row["measured"]["step_time_s"] is None
    records = [read_records(rank_file(out, r))[0] for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["stand_in"]) for r in records] == [(0, 2, True), (1, 2, True)]
    assert not list((out / "jobs").glob("world*"))  # no torchrun job
    # lose rank 1's record: the rerun runs rank 1 alone
    rank_file(out, 1).unlink()
    logs = sorted((out / "jobs").glob("*_rank*.log"))
    stamps = {p.name: p.stat().st_mtime_ns for p in logs}
    rep = validate_layouts([lay], out, "H200", device="cpu", layout_timeout_s=60, log=lambda *a: 0, stand_in="all")
    assert rep.rows[0]["status"] == "ok" and len(read_records(rank_file(out, 0))) == 1
    assert len(read_records(rank_file(out, 1))) == 1
    changed = [p.name for p in logs if p.stat().st_mtime_ns != stamps[p.name]]
    assert len(changed) == 1 and changed[0].endswith("_rank1.log")


def test_a_pipeline_layout_string_reaches_megatron_core(tiny, tmp_path):
    """The runner hands a layout string to megatron-core's TransformerConfig, which builds what it says. (pp > 1
    cannot run on CPU: megatron-core's p2p calls torch.cuda.synchronize(); the GPU test runs uneven stages.)"""
    lay = _lay(tiny, "layout", pipeline_layout="EttL")
    assert lay.parallel().pipeline_layout.rank_layers(0) == [0, 1]
    out = tmp_path / "o"
    rep = validate_layouts([lay], out, "H200", device="cpu", layout_timeout_s=60, log=lambda *a: 0, stand_in="stages")
    assert rep.rows[0]["status"] == "ok", rep.rows[0].get("error")
    bad = _lay(tiny, "bad", pipeline_layout="EtttL")  # 3 layers in the layout, 2 in the model
    with pytest.raises(ConfigError, match="holds 3 decoder layers"):
        bad.check()
