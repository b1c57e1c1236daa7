"""gpt-oss's experts stop the host in their activation (`costmodel.layer.experts_activation_syncs_host`): a padded
block of theirs cannot issue ahead of the GPU. Evidence: a profiled step of gpt-oss-20b-E16's padded layers on one
H200 (benchmarks/validation/h200_x1_moe_timeline.sh, benchmarks/results/moe_timeline_h200)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.layer import experts_activation_syncs_host
from megatron_autotuner.specs import load_model_spec as load_model
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/moe_timeline_h200"


def test_only_the_fused_quick_geglu_experts_wait():
    assert experts_activation_syncs_host(load_model("gpt-oss-20b"), fused_bias_activation=True)
    assert not experts_activation_syncs_host(load_model("gpt-oss-20b"), fused_bias_activation=False)
    for name in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"):
        assert not experts_activation_syncs_host(load_model(name), fused_bias_activation=True), name


def _trace_events(pattern: str) -> list[dict]:
    (path,) = (RESULTS / "raw").glob(pattern)
    return json.load(gzip.open(path))["traceEvents"]


def test_the_padded_layers_waited_once_per_forward_in_the_activation():
    """The last profiled step: 4 layers x 4 micro-batches, one stream synchronisation each, in the `aten::to` that
    builds the activation's linear offset just before WeightedQuickGeGLUFunction; no token-count wait
    (cudaEventSynchronize) as the dropless layers have."""
    events = _trace_events("gpt-oss-20b-E16.*.json.gz")
    steps = sorted((e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"] == "train_step"),
                   key=lambda e: e["ts"])  # fmt: skip
    start, end = steps[-2]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and start <= e["ts"] < end]
    syncs = [e for e in runtime if e["name"] == "cudaStreamSynchronize"]
    assert len(syncs) == 16
    assert not [e for e in runtime if e["name"] == "cudaEventSynchronize"]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e["tid"] == syncs[0]["tid"]), key=lambda e: e["ts"])
    for sync in syncs:
        enclosing = [e["name"] for e in ops if e["ts"] <= sync["ts"] <= e["ts"] + e["dur"]]
        assert enclosing[0] == "aten::to"
        following = next(e["name"] for e in ops if e["ts"] > sync["ts"] and e["name"].endswith("Function"))
        assert following == "WeightedQuickGeGLUFunction"


def test_a_padded_gpt_oss_step_is_paced_as_a_dropless_one():
    """Held host-bound, the padded gpt-oss-20b ep 2 step is the dropless one's (471 ms with the default floors); a
    padded Mixtral block still issues ahead, and its step stays below its dropless one."""
    for model, equal in (("gpt-oss-20b", True), ("Mixtral-8x7B", False)):
        steps = []
        for pad in (False, True):
            kw = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True} if pad else {}
            lay = Layout(model=model, seq_length=4096, num_layers=4, num_gpus=2, ep=2, global_batch_size=8, **kw)
            steps.append(predict(lay, "H200", None, gradient_accumulation_fusion=False)["step_time_s"])
        assert (steps[1] == pytest.approx(steps[0])) is equal, model
