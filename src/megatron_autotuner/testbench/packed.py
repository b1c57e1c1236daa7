"""Packed (THD) micro-batches: the tensors megatron-core's GPTModel takes for verl's packed micro-batches.

Which sequences go into which micro-batch is `specs.lengths` (verl's dynamic batching: `pack_micro_batches`, the
same packing the cost model predicts with, `specs.parallel.packed_batch`); this module lays one micro-batch out.
One micro-batch is one THD batch, built as verl/models/mcore/util.py `preprocess_packed_seqs` does: sequences
concatenated along one row (batch dimension 1), each padded to a multiple of `align` = tp x 2 x cp with context
parallelism (each sequence is cut into 2 cp chunks; rank r keeps chunks r and 2cp-1-r, megatron-core's
load-balanced causal split, megatron/core/utils.py `get_batch_on_this_cp_rank`), else tp (sequence parallelism
scatters the token dimension over the TP ranks). `PackedSeqParams(qkv_format="thd")` gets the padded cumulative
lengths as cu_seqlens_q/kv and cu_seqlens_q/kv_padded, as verl passes them: each sequence's pad tokens sit at its
end, so under the causal mask no real token attends to them, and TE needs no pad-between-sequences handling.
Position ids restart at 0 for every sequence; the loss mask is 0 on the pad tokens.

Everything above `thd_tensors` is plain Python (no torch).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any


def align_of(tp: int, cp: int) -> int:
    """Multiple each packed sequence is padded to: tp x 2 x cp with context parallelism, else tp (verl
    `preprocess_packed_seqs`; megatron-core's causal CP split needs 2 cp equal chunks per sequence, and sequence
    parallelism a token count divisible by tp)."""
    return tp * cp * 2 if cp > 1 else tp


def pad_to(length: int, align: int) -> int:
    return -(-length // align) * align


@dataclass(frozen=True)
class PackedMicroBatch:
    """One THD micro-batch: its sequences' real lengths (in order) and each padded to `align`."""

    lengths: tuple[int, ...]
    align: int

    @property
    def padded_lengths(self) -> tuple[int, ...]:
        return tuple(pad_to(s, self.align) for s in self.lengths)

    @property
    def cu_seqlens(self) -> list[int]:
        out = [0]
        for s in self.lengths:
            out.append(out[-1] + s)
        return out

    @property
    def cu_seqlens_padded(self) -> list[int]:
        out = [0]
        for s in self.padded_lengths:
            out.append(out[-1] + s)
        return out

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padded_tokens(self) -> int:
        return sum(self.padded_lengths)

    def summary(self) -> dict[str, Any]:
        """What a record keeps to check a prediction: tokens (real and padded) and sum of s_i^2 (attention)."""
        return {
            "num_sequences": len(self.lengths),
            "tokens": self.tokens,
            "padded_tokens": self.padded_tokens,
            "sum_sq_tokens": sum(s * s for s in self.lengths),
            "sum_sq_padded_tokens": sum(s * s for s in self.padded_lengths),
            "max_seqlen_padded": max(self.padded_lengths),
        }


@dataclass(frozen=True)
class PackingPlan:
    """The packed micro-batches of every data-parallel rank for one iteration (the same every iteration)."""

    lengths: tuple[int, ...]  # the global batch's sequence lengths
    max_token_len: int
    align: int
    per_rank: tuple[tuple[PackedMicroBatch, ...], ...]  # [dp rank][micro-batch]

    @property
    def num_microbatches(self) -> int:
        return len(self.per_rank[0])

    def summary(self, dp_rank: int | None = None) -> dict[str, Any]:
        ranks = range(len(self.per_rank)) if dp_rank is None else [dp_rank]
        mbs = [mb.summary() for r in ranks for mb in self.per_rank[r]]
        out: dict[str, Any] = {
            "max_token_len": self.max_token_len,
            "align": self.align,
            "num_sequences": len(self.lengths) if dp_rank is None else sum(m["num_sequences"] for m in mbs),
            "mean_seq_length": sum(self.lengths) / len(self.lengths),
            "max_seq_length": max(self.lengths),
            "num_microbatches": self.num_microbatches,
            "tokens": sum(m["tokens"] for m in mbs),
            "padded_tokens": sum(m["padded_tokens"] for m in mbs),
            "sum_sq_tokens": sum(m["sum_sq_tokens"] for m in mbs),
            "sum_sq_padded_tokens": sum(m["sum_sq_padded_tokens"] for m in mbs),
            "micro_batches": mbs,
        }
        if dp_rank is not None:
            out["dp_rank"] = dp_rank
        return out


def plan_from_packed(packed: Any, align: int) -> PackingPlan:
    """A `PackingPlan` of `specs.lengths.PackedBatch` (verl's packing, unpadded lengths), each sequence padded to
    `align` when built."""
    per_rank = tuple(tuple(PackedMicroBatch(tuple(mb), align) for mb in rank) for rank in packed.ranks)
    lengths = tuple(s for rank in packed.ranks for mb in rank for s in mb)
    return PackingPlan(lengths, packed.max_token_len, align, per_rank)


def single_micro_batch(lengths: Any, max_token_len: int, tp: int, cp: int) -> PackedMicroBatch:
    """One micro-batch for an operator measurement: lengths drawn in order from `lengths`
    (`specs.lengths.SequenceLengths`, its seed), kept while the running total stays within `max_token_len` (at
    least one sequence)."""
    pool = lengths.sample(2 * math.ceil(max_token_len / max(lengths.mean_tokens, 1.0)) + 1)
    kept: list[int] = []
    for s in pool:
        if kept and sum(kept) + s > max_token_len:
            break
        kept.append(s)
    return PackedMicroBatch(tuple(kept), align_of(tp, cp))


def cp_shard_indices(padded_lengths: tuple[int, ...], cp: int, cp_rank: int) -> list[int]:
    """Positions (in the packed, padded row) that CP rank `cp_rank` keeps: of every sequence, its chunks cp_rank
    and 2cp-1-cp_rank of 2cp equal chunks (verl `preprocess_packed_seqs`, TE's thd CP layout)."""
    if cp == 1:
        return list(range(sum(padded_lengths)))
    out: list[int] = []
    start = 0
    for p in padded_lengths:
        chunk = p // (2 * cp)
        for c in (cp_rank, 2 * cp - 1 - cp_rank):
            out.extend(range(start + c * chunk, start + (c + 1) * chunk))
        start += p
    return out


def thd_host_arrays(mb: PackedMicroBatch, vocab_size: int, seed: int, cp: int = 1, cp_rank: int = 0):
    """(tokens, labels, position_ids, loss_mask) of one micro-batch as Python lists over this CP rank's part of
    the packed row: random token ids (seeded per micro-batch), labels the next token within the sequence, pad
    positions with token 0 and loss mask 0, position ids restarting at every sequence."""
    rng = random.Random(seed)
    tokens: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    mask: list[float] = []
    for s, p in zip(mb.lengths, mb.padded_lengths, strict=True):
        ids = [rng.randrange(vocab_size) for _ in range(s + 1)]
        tokens += ids[:s] + [0] * (p - s)
        labels += ids[1:] + [0] * (p - s)
        positions += list(range(p))
        mask += [1.0] * s + [0.0] * (p - s)
    keep = cp_shard_indices(mb.padded_lengths, cp, cp_rank)
    return [tokens[i] for i in keep], [labels[i] for i in keep], [positions[i] for i in keep], [mask[i] for i in keep]


def thd_tensors(mb: PackedMicroBatch, vocab_size: int, seed: int, device: str, cp: int = 1, cp_rank: int = 0):
    """The batch dict a forward step feeds GPTModel: tokens / labels / position_ids / loss_mask of shape
    [1, local tokens] and `packed_seq_params` (megatron.core.packed_seq_params.PackedSeqParams, thd)."""
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams

    tokens, labels, positions, mask = thd_host_arrays(mb, vocab_size, seed, cp, cp_rank)
    cu_padded = torch.tensor(mb.cu_seqlens_padded, dtype=torch.int32, device=device)
    max_seqlen = max(mb.padded_lengths)
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_padded,
        cu_seqlens_kv=cu_padded,
        cu_seqlens_q_padded=cu_padded,
        cu_seqlens_kv_padded=cu_padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )
    return {
        "tokens": torch.tensor([tokens], dtype=torch.long, device=device),
        "labels": torch.tensor([labels], dtype=torch.long, device=device),
        "position_ids": torch.tensor([positions], dtype=torch.long, device=device),
        "loss_mask": torch.tensor([mask], dtype=torch.float32, device=device),
        "packed_seq_params": params,
    }
