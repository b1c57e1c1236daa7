"""Packed THD micro-batches (`testbench.packed`): lengths, verl-style balancing, padding, CP shards, tensors."""

from __future__ import annotations

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.testbench.cases import Case
from megatron_autotuner.testbench.packed import (
    PackedMicroBatch,
    align_of,
    cp_shard_indices,
    plan_from_packed,
    thd_host_arrays,
)


def test_padding_cu_seqlens_positions_and_loss_mask():
    mb = PackedMicroBatch((5, 3, 8), align=4)
    assert mb.padded_lengths == (8, 4, 8)
    assert mb.cu_seqlens == [0, 5, 8, 16]
    assert mb.cu_seqlens_padded == [0, 8, 12, 20]
    tokens, labels, positions, mask = thd_host_arrays(mb, vocab_size=50, seed=7)
    assert len(tokens) == len(labels) == len(positions) == len(mask) == 20
    assert positions == [*range(8), *range(4), *range(8)]  # restart at every sequence, pads continue it
    assert mask == [1.0] * 5 + [0.0] * 3 + [1.0] * 3 + [0.0] + [1.0] * 8
    # labels are the next token of the same sequence
    assert labels[0:4] == tokens[1:5] and labels[8:10] == tokens[9:11]
    assert tokens[5:8] == [0, 0, 0]
    assert thd_host_arrays(mb, 50, seed=7) == (tokens, labels, positions, mask)
    summary = mb.summary()
    assert summary["tokens"] == 16 and summary["padded_tokens"] == 20
    assert summary["sum_sq_tokens"] == 25 + 9 + 64 and summary["sum_sq_padded_tokens"] == 64 + 16 + 64


def test_alignment_follows_verl():
    assert align_of(1, 1) == 1
    assert align_of(4, 1) == 4  # sequence parallel: tokens divisible by tp
    assert align_of(2, 2) == 8  # tp x 2 x cp with context parallelism


def test_cp_shards_take_chunks_r_and_2cp_minus_1_minus_r_of_every_sequence():
    padded = (8, 16)
    r0 = cp_shard_indices(padded, cp=2, cp_rank=0)
    r1 = cp_shard_indices(padded, cp=2, cp_rank=1)
    assert r0 == [0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23]
    assert r1 == [2, 3, 4, 5, 12, 13, 14, 15, 16, 17, 18, 19]
    assert sorted(r0 + r1) == list(range(24))


def test_plan_from_verl_packing_keeps_ranks_and_pads_each_sequence():
    from megatron_autotuner.specs.lengths import SequenceLengths, pack_micro_batches

    lengths = SequenceLengths.from_mean_max((256, 512), (1024, 3584), seed=0).sample(32)
    packed = pack_micro_batches(lengths, 8192, dp=2)
    plan = plan_from_packed(packed, align=2)
    assert len(plan.per_rank) == 2 and plan.num_microbatches == packed.num_micro_batches
    assert sorted(plan.lengths) == sorted(lengths)
    assert all(t % 2 == 0 for rank in plan.per_rank for mb in rank for t in mb.padded_lengths)
    assert plan.summary()["tokens"] == sum(lengths)
    assert plan.summary()["sum_sq_tokens"] == packed.sum_squares


def test_thd_tensors_shapes_and_packed_seq_params():
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron_autotuner.testbench.packed import thd_tensors

    mb = PackedMicroBatch((5, 3), align=4)
    batch = thd_tensors(mb, vocab_size=50, seed=1, device="cpu", cp=2, cp_rank=1)
    assert batch["tokens"].shape == (1, 6)  # (8 + 4) / cp
    params = batch["packed_seq_params"]
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.dtype == torch.int32
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv_padded.tolist() == [0, 8, 12]
    assert params.max_seqlen_q == params.max_seqlen_kv == 8


def test_packed_cases_are_checked():
    case = Case(
        model="Qwen3-0.6B",
        op="gpt_chunk",
        seq_length=4096,
        max_token_len=8192,
        prompt_length=(256, 512),
        response_length=(1024, 3584),
    )
    mb = case.packed_micro_batch()
    assert 0 < mb.tokens <= 8192
    assert case.case_id != Case(model="Qwen3-0.6B", op="gpt_chunk", seq_length=4096).case_id
    # ids of unpacked cases do not change with the new fields
    assert Case(model="Qwen3-0.6B", op="decoder", seq_length=4096).case_id.endswith(
        Case.from_dict({"model": "Qwen3-0.6B", "op": "decoder", "seq_length": 4096}).case_id.rsplit(".", 1)[1]
    )
    with pytest.raises(ConfigError, match="use_te"):
        Case(model="Qwen3-0.6B", op="decoder", seq_length=4096, max_token_len=8192, use_te=False)
    with pytest.raises(ConfigError, match="max_token_len"):
        Case(model="Qwen3-0.6B", op="mlp", seq_length=4096, max_token_len=8192)
    with pytest.raises(ConfigError, match="prompt_length"):
        Case(model="Qwen3-0.6B", op="decoder", seq_length=4096, prompt_length=(10, 20), response_length=(10, 20))
    fixed = Case(model="Qwen3-0.6B", op="decoder", seq_length=4096, max_token_len=8192).packed_micro_batch()
    assert fixed.lengths == (4096, 4096)
