"""The caching allocator's large pool (`theory.allocator`), on hand-worked request sequences, and its hole for
variable-size packed forward-only logits in the cost model (issue #26)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_autotuner.specs import load_model_spec
from megatron_autotuner.specs.lengths import SequenceLengths
from megatron_autotuner.specs.parallel import ParallelConfig, Workload, packed_batch
from megatron_autotuner.theory.allocator import (
    allocation_size,
    large_pool_peak,
    logits_events,
    packed_logits_fragment_bytes,
    round_size,
)
from megatron_autotuner.theory.memory import MemoryAllowance, memory_per_stage, packed_logits_fragment

MIB = 1 << 20
HISTORY = (
    Path(__file__).resolve().parents[2]
    / "benchmarks/results/validation_h100_x1/rlhf_packing/diagnostics/fw_rank0.pickle.gz"
)


def _run(*events):
    return large_pool_peak(list(events))


def test_sizes_are_rounded_as_the_allocator_rounds_them():
    assert round_size(1) == 512 and round_size(513) == 1024 and round_size(100 * MIB) == 100 * MIB
    assert allocation_size(2 * MIB) == 20 * MIB  # 1-10 MiB: a kLargeBuffer segment
    assert allocation_size(100 * MIB + 1) == 102 * MIB  # >= 10 MiB: up to 2 MiB


def test_same_or_smaller_micro_batches_reuse_the_first_segments():
    # only the 2 MiB rounding of the two segments is left unallocated (a split leaves more than 1 MiB free)
    assert 0 < packed_logits_fragment_bytes((1000, 1000, 1000), 50_000, False) < 4 * MIB
    assert packed_logits_fragment_bytes((1000, 900, 800), 50_000, False) < 4 * MIB
    assert packed_logits_fragment_bytes((1024, 1024), 8192, False) == 0  # 16 and 32 MiB: no rounding
    assert packed_logits_fragment_bytes((), 50_000, False) == 0


def test_a_larger_micro_batch_takes_the_fp32_block_for_its_bf16_logits_and_a_new_segment_for_fp32():
    # 100 / 200 MiB, then 101 / 202 MiB: 101 does not fit the freed 100 MiB block, best fit is the 200 MiB one
    # (split: 99 MiB stays free there); 202 fits neither 100 nor 99: a third segment
    peak = _run(
        ("alloc", "b1", 100 * MIB), ("alloc", "f1", 200 * MIB), ("free", "f1", 0), ("free", "b1", 0),
        ("alloc", "b2", 101 * MIB), ("alloc", "f2", 202 * MIB), ("free", "f2", 0), ("free", "b2", 0),
    )  # fmt: skip
    assert peak.segments == (100 * MIB, 200 * MIB, 202 * MIB)
    assert peak.held_peak_bytes == 303 * MIB
    assert peak.unallocated_at_peak_bytes == 199 * MIB
    # a third pass of the first sizes finds room: 100 -> the 100 MiB block, 200 -> the 200 MiB one
    again = _run(
        ("alloc", "b1", 100 * MIB), ("alloc", "f1", 200 * MIB), ("free", "f1", 0), ("free", "b1", 0),
        ("alloc", "b2", 101 * MIB), ("alloc", "f2", 202 * MIB), ("free", "f2", 0), ("free", "b2", 0),
        ("alloc", "b3", 100 * MIB), ("alloc", "f3", 200 * MIB), ("free", "f3", 0), ("free", "b3", 0),
    )  # fmt: skip
    assert again.reserved_bytes == 502 * MIB


def test_freed_pieces_of_one_segment_merge_and_pieces_of_two_do_not():
    one = _run(
        ("alloc", "a", 100 * MIB), ("free", "a", 0),
        ("alloc", "b", 40 * MIB), ("alloc", "c", 60 * MIB), ("free", "b", 0), ("free", "c", 0),
        ("alloc", "d", 100 * MIB),
    )  # fmt: skip
    assert one.segments == (100 * MIB,)
    two = _run(
        ("alloc", "a", 100 * MIB), ("alloc", "b", 100 * MIB), ("free", "a", 0), ("free", "b", 0),
        ("alloc", "c", 150 * MIB),
    )  # fmt: skip
    assert two.segments == (100 * MIB, 100 * MIB, 150 * MIB)


def test_a_block_is_split_only_when_more_than_1_mib_would_remain():
    # 99.5 MiB in a free 100 MiB block: 0.5 MiB would remain, so the whole block is handed out
    whole = _run(
        ("alloc", "a", 100 * MIB), ("free", "a", 0), ("alloc", "b", 99 * MIB + MIB // 2), ("alloc", "c", 20 * MIB)
    )
    assert whole.segments == (100 * MIB, 20 * MIB) and whole.held_peak_bytes == 120 * MIB
    split = _run(("alloc", "a", 100 * MIB), ("free", "a", 0), ("alloc", "b", 80 * MIB), ("alloc", "c", 20 * MIB))
    assert split.segments == (100 * MIB,)


def test_the_2_mib_segment_rounding_absorbs_a_few_more_tokens():
    # 100 MiB + 1 byte gets a 102 MiB segment, so a later 101.5 MiB request fits it
    peak = _run(("alloc", "a", 100 * MIB + 1), ("free", "a", 0), ("alloc", "b", 101 * MIB + MIB // 2))
    assert peak.segments == (102 * MIB,)


def test_training_order_is_replayed_too():
    events = logits_events([10, 20], 1_000_000, training=True, steps=1)
    assert [a for a, _, _ in events[:6]] == ["alloc", "alloc", "free", "alloc", "free", "free"]
    assert events[1][2] == 4 * 10 * 1_000_000 and events[3][2] == 2 * 10 * 1_000_000


def test_the_allocator_history_of_the_8b_16k_forward_run_is_reproduced():
    """The logits requests of diagnostics/fw_rank0.pickle.gz, replayed, and the same requests from the token
    counts alone, give the three segments the history shows cudaMalloc'ed for them (exact bytes)."""
    from megatron_autotuner.trace.memory_history import load_snapshot

    trace = load_snapshot(HISTORY)["device_traces"][0]
    history_segments = tuple(e["size"] for e in trace if e["action"] == "segment_alloc" and e["size"] > 1 << 30)
    assert history_segments == (3774873600, 7549747200, 7602176000)
    live: dict[int, str] = {}
    replay = []
    for i, e in enumerate(trace):
        if e["size"] > 1 << 30 and e["action"] == "alloc":
            live[e["addr"]] = str(i)
            replay.append(("alloc", str(i), e["size"]))
        elif e["action"] == "free_completed" and e["addr"] in live and e["size"] > 1 << 30:
            replay.append(("free", live.pop(e["addr"]), 0))
    assert large_pool_peak(replay).segments == history_segments
    from_tokens = large_pool_peak(logits_events([14715, 14683, 14817, 14460], 128256, training=False))
    assert from_tokens.segments == history_segments
    # 7.01 of the 8.74 GiB the run left reserved but unallocated at its peak
    assert from_tokens.unallocated_at_peak_bytes / 2**30 == pytest.approx(7.008, abs=0.001)


def _packed_workload(training: bool) -> Workload:
    return Workload(
        seq_length=4096,
        micro_batch_size=1,
        global_batch_size=32,
        mode="train" if training else "forward",
        max_token_len=16384,
        lengths=SequenceLengths.from_mean_max((512, 1024), (1024, 3072)),
    )


def test_the_cost_model_adds_the_hole_to_forward_only_packed_layouts_without_expandable_segments():
    model = load_model_spec("Llama-3.1-8B")
    parallel = ParallelConfig(num_gpus=1)
    forward = _packed_workload(training=False)
    assert [sum(mb) for mb in packed_batch(parallel, forward).ranks[0]] == [14715, 14683, 14817, 14460]
    hole = packed_logits_fragment(parallel, forward, model.vocab_size)
    assert hole == packed_logits_fragment_bytes((14715, 14683, 14817, 14460), 128256, False)
    plain = memory_per_stage(model, parallel, forward)[-1]
    assert plain.activation_detail["packed_logits_fragment"] == hole
    # not an activation: the allocated peak does not change, the allowance carries it
    assert plain.activations_bytes == max(
        plain.activation_detail["layer_working_set"], plain.activation_detail["logits_working_set"]
    )
    expandable = memory_per_stage(model, parallel, forward, allowance=MemoryAllowance.for_allocator(True))[-1]
    default = MemoryAllowance()
    # beside the logits (the peak), the layers' working set stays reserved (`MemoryAllowance.bytes_for`)
    assert plain.activation_detail["logits_working_set"] > plain.activation_detail["layer_working_set"]
    assert plain.allowance_bytes == pytest.approx(
        default.non_torch_for(parallel, False) * 2**30 + plain.activation_detail["layer_working_set"] + hole
    )
    assert expandable.allowance_bytes < plain.allowance_bytes - hole + 1  # no such hole when segments grow in place
    # training and fixed-length workloads: none
    assert packed_logits_fragment(parallel, _packed_workload(training=True), model.vocab_size) == 0
    fixed = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=8, mode="forward")
    assert packed_logits_fragment(parallel, fixed, model.vocab_size) == 0
