"""Packed (THD) micro-batches: sequence lengths, verl-style balancing into micro-batches, and the tensors
megatron-core's GPTModel takes for them.

verl's dynamic batching (`use_dynamic_bsz`, verl/utils/seqlen_balancing.py `rearrange_micro_batches`) splits a
rank's sequences into m = min(n, ceil(total tokens / max_token_len)) micro-batches (the count raised to the largest
over the data-parallel ranks, `same_micro_num_in_dp`), balanced by the workload estimate
`calculate_workload(s) = 24576 s + s^2`, then orders them heaviest-in-the-middle (the lighter ones at both ends,
where a pipeline's warm-up and cool-down expose them). Balancing here is largest-first greedy on that workload
(verl's `get_seqlen_balanced_partitions` uses Karmarkar-Karp differencing; both give m balanced groups).

One micro-batch is one THD batch, built as verl/models/mcore/util.py `preprocess_packed_seqs` does: sequences
concatenated along one row (batch dimension 1), each padded to a multiple of `align` = tp x 2 x cp with context
parallelism (each sequence is cut into 2 cp chunks; rank r keeps chunks r and 2cp-1-r, megatron-core's
load-balanced causal split, megatron/core/utils.py `get_batch_on_this_cp_rank`), else tp (sequence parallelism
scatters the token dimension over the TP ranks). `PackedSeqParams(qkv_format="thd")` gets the padded cumulative
lengths as cu_seqlens_q/kv and cu_seqlens_q/kv_padded, as verl passes them: each sequence's pad tokens sit at its
end, so under the causal mask no real token attends to them, and TE needs no pad-between-sequences handling.
Position ids restart at 0 for every sequence; the loss mask is 0 on the pad tokens.

Everything above the `thd_tensors` function is plain Python (no torch): plans can be made and checked anywhere.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

# verl/utils/seqlen_balancing.py `calculate_workload`: FLOPs ~ 12 h^2 s + 2 h s^2 with h = 4096, i.e. 24576 s + s^2
VERL_WORKLOAD_LINEAR = 24576
# shape of the gamma distribution sequence lengths are drawn from (a right tail, like RL prompt + response lengths)
LENGTH_GAMMA_SHAPE = 2.0


def verl_workload(length: int) -> int:
    return VERL_WORKLOAD_LINEAR * length + length * length


def sample_lengths(num_sequences: int, mean_tokens: float, max_tokens: int, seed: int = 0) -> list[int]:
    """`num_sequences` sequence lengths (prompt + response tokens) in [1, max_tokens] whose sample mean is
    `mean_tokens` (to within one token): gamma(shape 2) draws from `random.Random(seed)`, scaled so that after
    rounding and clipping at `max_tokens` the mean is as asked. The same arguments give the same lengths."""
    if not isinstance(num_sequences, int) or num_sequences < 1:
        raise ConfigError("num_sequences", f"must be a positive integer, got {num_sequences!r}")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError("seq_length", f"the longest sequence must be a positive integer, got {max_tokens!r}")
    if not 1 <= mean_tokens <= max_tokens:
        raise ConfigError("mean_seq_length", f"must lie in [1, {max_tokens}] (the longest sequence), got {mean_tokens}")
    if mean_tokens == max_tokens:
        return [max_tokens] * num_sequences
    rng = random.Random(seed)
    draws = [rng.gammavariate(LENGTH_GAMMA_SHAPE, 1.0) for _ in range(num_sequences)]

    def lengths(scale: float) -> list[int]:
        return [min(max_tokens, max(1, round(scale * x))) for x in draws]

    lo, hi = 0.0, 2.0 * max_tokens / min(draws)  # at hi every length is max_tokens
    for _ in range(100):  # the mean grows monotonically with the scale: bisect
        mid = 0.5 * (lo + hi)
        if sum(lengths(mid)) / num_sequences < mean_tokens:
            lo = mid
        else:
            hi = mid
    return lengths(hi)


def _balanced_groups(lengths: list[int], count: int) -> list[list[int]]:
    """`count` non-empty groups of indices into `lengths`, balanced by verl's workload (largest first onto the
    lightest group), each group's indices sorted."""
    order = sorted(range(len(lengths)), key=lambda i: (-verl_workload(lengths[i]), i))
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in order:
        j = min(range(count), key=lambda g: (loads[g], len(groups[g]), g))
        groups[j].append(i)
        loads[j] += verl_workload(lengths[i])
    return [sorted(g) for g in groups]


def micro_batch_count(lengths: list[int], max_token_len: int) -> int:
    """verl's count for one rank: min(sequences, ceil(tokens / max_token_len))."""
    if max(lengths) > max_token_len:
        raise ConfigError(
            "max_token_len", f"{max_token_len} is below the longest sequence ({max(lengths)}): verl asserts it is not"
        )
    return min(len(lengths), -(-sum(lengths) // max_token_len))


def balance_micro_batches(lengths: list[int], count: int) -> list[list[int]]:
    """Indices of each of `count` micro-batches, balanced and ordered as verl's `rearrange_micro_batches` (with
    `use_dynamic_bsz_balance`): sorted by workload, heaviest first, then the even positions reversed followed by
    the odd ones, so the lightest micro-batches come first and last."""
    if not 1 <= count <= len(lengths):
        raise ConfigError("max_token_len", f"{count} micro-batches for {len(lengths)} sequences")
    groups = _balanced_groups(lengths, count)
    groups.sort(key=lambda g: (sum(verl_workload(lengths[i]) for i in g), g[0]), reverse=True)
    return groups[::2][::-1] + groups[1::2]


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


def plan_packing(
    num_sequences: int,
    mean_tokens: float,
    max_tokens: int,
    max_token_len: int,
    dp: int = 1,
    tp: int = 1,
    cp: int = 1,
    seed: int = 0,
    multiple_of: int = 1,
) -> PackingPlan:
    """Sample the global batch's lengths, give each of `dp` ranks an equal contiguous share, and pack each share
    into the same number of balanced micro-batches (verl: the largest count over the DP ranks, rounded up to
    `multiple_of`, e.g. pp for megatron-core's interleaved schedule)."""
    if not isinstance(max_token_len, int) or max_token_len < 1:
        raise ConfigError("max_token_len", f"must be a positive integer, got {max_token_len!r}")
    if num_sequences % dp:
        raise ConfigError("global_batch_size", f"{num_sequences} sequences do not split evenly over dp={dp} ranks")
    lengths = sample_lengths(num_sequences, mean_tokens, max_tokens, seed)
    per = num_sequences // dp
    shares = [lengths[d * per : (d + 1) * per] for d in range(dp)]
    count = max(micro_batch_count(share, max_token_len) for share in shares)
    count = min(per, -(-count // multiple_of) * multiple_of)
    if count % multiple_of:
        raise ConfigError(
            "global_batch_size",
            f"{per} sequences per DP rank cannot fill a multiple of {multiple_of} micro-batches",
        )
    align = align_of(tp, cp)
    per_rank = tuple(
        tuple(PackedMicroBatch(tuple(share[i] for i in idx), align) for idx in balance_micro_batches(share, count))
        for share in shares
    )
    return PackingPlan(tuple(lengths), max_token_len, align, per_rank)


def single_micro_batch(mean_tokens: float, max_tokens: int, max_token_len: int, tp: int, cp: int, seed: int):
    """One micro-batch for an operator measurement: lengths drawn in order from the seeded sampler, kept while
    the running total stays within `max_token_len` (at least one sequence)."""
    pool = sample_lengths(2 * math.ceil(max_token_len / mean_tokens) + 1, mean_tokens, max_tokens, seed)
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
