"""CP's ring exchange and CUDA_DEVICE_MAX_CONNECTIONS (`estimate.cp_ring_hides`): with one hardware queue (or on
Blackwell) the ring hides behind the attention chunks, with more it is held exposed; TP's communication is predicted
as with one. Checked against the 2x H200 runs of benchmarks/validation/x2_connections.sh
(benchmarks/results/connections_h200_x2, report.json from benchmarks/connections.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.estimate import CostOptions, cp_ring_hides, estimate
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload
from megatron_autotuner.validate.layout import Layout

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import connections  # noqa: E402

H100, B200 = get_gpu_spec("H100-SXM"), get_gpu_spec("B200")
LLAMA = load_model_spec("Llama-3.1-8B").replace(num_layers=4)
LONG = Workload(seq_length=32768, global_batch_size=4)


def step_s(parallel: ParallelConfig, gpu=H100, connections_: int | None = None, model=LLAMA, work=LONG) -> float:
    options = CostOptions(cuda_device_max_connections=connections_)
    return estimate(model, parallel, work, gpu, options).step_time_s


def test_the_ring_is_exposed_with_more_than_one_queue_before_blackwell():
    cp2 = ParallelConfig(num_gpus=2, cp=2)
    assert step_s(cp2, connections_=8) > step_s(cp2, connections_=1) == step_s(cp2)  # the layout's own: 1
    assert step_s(cp2, B200, 8) == step_s(cp2, B200, 1)  # Blackwell keeps the issue order without it
    # TP's communication is predicted as with one queue (measured: a TP 2 step unchanged at 8)
    tp2 = ParallelConfig(num_gpus=2, tp=2, sequence_parallel=True)
    assert step_s(tp2, connections_=8) == step_s(tp2, connections_=1)


def test_the_all_to_all_overlap_brings_its_own_queues():
    """The overlap sets 8 (alltoall) on Hopper (`specs.parallel.A2A_OVERLAP_MAX_CONNECTIONS`): beside CP its ring is
    exposed without any option saying so; a run that keeps 1 (an explicit option) hides it again."""
    parallel = ParallelConfig(num_gpus=4, cp=2, ep=4, moe_a2a_overlap=True)
    assert not cp_ring_hides(parallel, H100, CostOptions())
    assert cp_ring_hides(parallel, H100, CostOptions(cuda_device_max_connections=1))
    assert cp_ring_hides(parallel, B200, CostOptions())
    assert cp_ring_hides(replace(parallel, moe_a2a_overlap=False), H100, CostOptions())


@pytest.mark.parametrize("bad", [0, 33, -1, True, 8.0, "8"])
def test_connections_outside_cudas_range_are_refused(bad):
    with pytest.raises(ConfigError) as exc:
        CostOptions(cuda_device_max_connections=bad)
    assert exc.value.field == "cuda_device_max_connections"
    with pytest.raises(ConfigError) as exc:
        Layout(model="Llama-3.1-8B", seq_length=4096, num_gpus=2, cp=2, cuda_device_max_connections=bad)
    assert exc.value.field == "cuda_device_max_connections"


def test_a_layout_names_its_connections_and_predicts_with_them():
    plain = Layout(model="Llama-3.1-8B", num_layers=4, seq_length=32768, num_gpus=2, cp=2, global_batch_size=4)
    eight = plain.replace(cuda_device_max_connections=8)
    assert plain.process_max_connections is None and eight.process_max_connections == 8
    assert "cdmc8" in eight.label and eight.layout_id != plain.layout_id
    # a layout that names none keeps the id it had before the field existed (resume and committed runs key on it)
    assert plain.layout_id == plain.replace(cuda_device_max_connections=None).layout_id
    from megatron_autotuner.validate.predict import predict

    assert predict(eight, "H200")["step_time_s"] > predict(plain, "H200")["step_time_s"]


REPORT = json.loads((ROOT / "benchmarks/results/connections_h200_x2/report.json").read_text())


def test_the_report_is_what_the_evidence_and_todays_model_give():
    table = connections.rows()
    assert [r["measured_step_s"] for r in table] == [r["measured_step_s"] for r in REPORT["rows"]]
    for row, committed in zip(table, REPORT["rows"], strict=True):
        assert row["predicted_now_step_s"] == pytest.approx(committed["predicted_now_step_s"], rel=1e-6)
    for pair, committed in zip(connections.pairs(table), REPORT["pairs"], strict=True):
        assert pair["label"] == committed["label"]
        assert pair["model_step_change_ms"] == pytest.approx(committed["model_step_change_ms"], abs=1e-6)
        assert pair["measured_step_change_ms"] == pytest.approx(committed["measured_step_change_ms"])


def test_the_measured_runs_bound_the_mechanism():
    """At 8 connections, CP 2's step at 32k tokens lengthened by 6.6 and 11.4 ms on one host (Llama-3.1-8B) and by
    -6.4 and +6.5 ms on another (Qwen3-8B, predicted blind; the two processes at 1 connection differed by 12.8 ms):
    4.5 ms on average, where the model holds the ring fully exposed (10.5). The mean lies between hiding (0) and the
    model: the model is the upper bound the plan prices. Its ring ran more exposed on both profiled ranks. TP 2's
    gathers / scatters ran more exposed in the trace but its step did not lengthen, as the model (TP hidden) says."""
    cp = [p for p in REPORT["pairs"] if p["kind"] == "cp"]
    tp = [p for p in REPORT["pairs"] if p["kind"] == "tp"]
    assert len(cp) == 4 and len(tp) == 2
    model = {p["model_step_change_ms"] for p in cp}
    assert len(model) == 1 and min(model) > 0  # one shape: Llama's and Qwen3's 8B share its attention
    mean = sum(p["measured_step_change_ms"] for p in cp) / len(cp)
    assert 0.0 < mean <= max(model)
    for p in tp:
        assert p["model_step_change_ms"] == 0.0 and abs(p["measured_step_change_ms"]) < 5.0  # 0.7% of the step
    exposed = [x for p in cp + tp if "measured_exposed_change_ms_by_rank" in p for x in p[
        "measured_exposed_change_ms_by_rank"]]  # fmt: skip
    assert len(exposed) == 4 and min(exposed) > 0
    # every dense step within 10% of today's model (the MoE pairs ran with the default host floors: no host's own)
    for r in REPORT["rows"]:
        if not r["part"].startswith("moe"):
            assert abs(r["predicted_now_step_s"] / r["measured_step_s"] - 1) < 0.10


def test_the_overlap_beside_cp_ran_faster_than_the_model_says():
    """Mixtral-8x7B CP 2 x EP 2 on two hosts: the all-to-all overlap ran 0.7% and 4.0% faster, the model has it 0.7%
    slower (its saving nil here, plus 3 ms of exposed ring): a miss of the ranking on the second host (4.0% > the 3%
    bar), kept as measured. Both steps 10-15% slower than the model with the default floors."""
    for part in ("moe", "moe_floors"):
        plain, overlap = (r for r in REPORT["rows"] if r["part"] == part)
        assert overlap["measured_step_s"] < plain["measured_step_s"]
        assert overlap["predicted_now_step_s"] > plain["predicted_now_step_s"]
        for r in (plain, overlap):
            assert -0.16 < r["predicted_now_step_s"] / r["measured_step_s"] - 1 < -0.09
