"""What `mat plan` counts and lists: every considered layout is a candidate, a rejection, or a slower token budget of
a candidate; and no two candidates are the same layout under two names."""

from __future__ import annotations

import pytest

from megatron_autotuner.search import layout_label, plan, plan_with_graphs
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.lengths import LengthDistribution, SequenceLengths

H100 = get_gpu_spec("H100-SXM")


@pytest.mark.parametrize(
    ("name", "gpus", "mode", "lengths", "graphs"),
    [
        ("Qwen3-8B", 8, "train", False, "off"),
        ("Qwen3-8B", 8, "forward", True, "off"),
        ("Qwen3-8B", 8, "train", True, "off"),
        ("Qwen3-4B", 2, "train", False, "try"),
    ],
)
def test_the_counts_add_up(name, gpus, mode, lengths, graphs):
    """Token budgets (verl dynamic batching) keep one budget per layout: the others are counted as superseded,
    so considered = fit + rejected + superseded (the header once read '298 considered, 48 fit, 61 rejected')."""
    kwargs, seq = {"mode": mode}, 4096
    if lengths:
        prompt, response = LengthDistribution("prompt", 512, 1024), LengthDistribution("response", 2000, 4096)
        kwargs["lengths"] = SequenceLengths(prompt, response)
        seq = kwargs["lengths"].max_tokens  # the longest prompt + response, as `mat plan` takes it
    r = plan_with_graphs(load_model_spec(name), H100, gpus, seq, 64, cuda_graphs=graphs, **kwargs)
    assert r.considered == len(r.candidates) + len(r.rejections) + r.superseded
    assert (r.superseded > 0) == lengths
    d = r.to_dict(top_k=1)
    assert d["considered"] == d["feasible"] + d["rejected"] + d["superseded"]


def test_without_a_second_optimizer_shard_there_is_no_no_distopt_twin():
    """At dp x cp = 1 (and one expert data-parallel rank) megatron-core's distributed optimizer shards nothing, so
    'no-distopt' is the same layout with the same numbers: the plan lists it once; where it shards, both stay."""
    r = plan(load_model_spec("Llama-3.1-8B"), H100, 8, 8192, 64)
    labels = [layout_label(c.parallel, c.workload) for c in r.candidates]
    assert len(labels) == len(set(labels))
    single = [c for c in r.candidates if c.parallel.dp * c.parallel.cp == 1]
    assert single and all(c.parallel.use_distributed_optimizer for c in single)
    sharded = [c for c in r.candidates if c.parallel.dp * c.parallel.cp > 1]
    assert any(not c.parallel.use_distributed_optimizer for c in sharded)
