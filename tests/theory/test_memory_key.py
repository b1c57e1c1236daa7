"""What the memory model reads of a layout: the search memoises `memory_per_stage` on `memory_parallel`, so a layout
that differs only in what that clears must have the same memory, stage by stage."""

from __future__ import annotations

import pytest

from megatron_autotuner.search import RECOMPUTE_CHOICES
from megatron_autotuner.specs import load_model_spec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload
from megatron_autotuner.theory.memory import memory_parallel, memory_per_stage


@pytest.mark.parametrize(
    "name, gpus, tp, pp, ep, vpp, mbs, recompute",
    [
        ("Qwen3-30B-A3B", 16, 1, 2, 8, 2, 2, "none"),
        ("Qwen3-235B-A22B", 64, 2, 1, 8, None, 1, "selective"),
        ("Mixtral-8x7B", 8, 1, 1, 8, None, 1, "full"),
        ("DeepSeek-V3", 256, 1, 1, 32, None, 1, "none"),
    ],
)
def test_the_all_to_all_overlap_and_delayed_wgrad_leave_memory_as_it_is(name, gpus, tp, pp, ep, vpp, mbs, recompute):
    model = load_model_spec(name)
    plain = ParallelConfig(gpus, tp=tp, pp=pp, ep=ep, vpp=vpp, sequence_parallel=tp > 1)
    workload = Workload(4096, mbs, gpus * 4, recompute=RECOMPUTE_CHOICES[recompute])
    for overlap, delay in ((True, False), (True, True)):
        scheduled = plain.replace(moe_a2a_overlap=overlap, delay_wgrad_compute=delay)
        assert memory_parallel(scheduled) == plain
        assert memory_per_stage(model, scheduled, workload) == memory_per_stage(model, plain, workload)
    assert memory_parallel(plain) is plain


def test_a_layers_kind_is_derived_once_and_the_same():
    for name in ("DeepSeek-V3", "Qwen3-Next-80B-A3B", "gpt-oss-120b", "Llama-3.1-8B"):
        model = load_model_spec(name)
        kinds = [model.layer_kind(i) for i in range(model.num_layers)]
        assert kinds == [model._derive_layer_kind(i) for i in range(model.num_layers)]
        assert len(set(kinds)) > 1 or name == "Llama-3.1-8B"  # the patterns are read, not one kind for all
