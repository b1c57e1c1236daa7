"""Reserved-but-unallocated memory of PyTorch's caching allocator over variable-size packed micro-batches.

With packed (THD) micro-batches every micro-batch has its own token count, so each one asks for logits buffers
of its own size: the bf16 logits (tokens x vocab / tp x 2 bytes) and the fp32 copy megatron-core's
`vocab_parallel_cross_entropy` makes of them (`calculate_logits_max`: `logits.float()`, x 4 bytes). When a
micro-batch needs a bigger block than the freed blocks of the micro-batches before it, the allocator cannot
reuse them and reserves another segment. `large_pool_peak` replays those requests through the rules of the large
pool of c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch, commit 001074d25084fdb87a799823e395a50f5ec044d3),
without expandable segments:

- `round_size`: a request is rounded up to a multiple of kMinBlockSize = 512 bytes (no roundup_power2_divisions);
- `get_pool`: requests above kSmallSize = 1 MiB go to the large pool;
- `get_free_block`: best fit, `pool.blocks.lower_bound(size)` over free blocks ordered by (stream, size,
  address): the smallest free block at least as large (max_split_size unlimited by default, so no oversize rule);
- `alloc_block`: without one, cudaMalloc of a new segment of `get_allocation_size(size)`: sizes of 10 MiB
  (kMinLargeAlloc) and up are rounded up to kRoundLarge = 2 MiB (1-10 MiB requests take a kLargeBuffer = 20 MiB
  segment);
- `should_split`: a block is split when more than kSmallSize (1 MiB) would remain; the rest stays a free block of
  the same segment;
- `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours (`prev` / `next`) of the same
  segment; blocks of different segments never merge; segments are not returned to CUDA (no `empty_cache`, and
  `release_cached_blocks` only runs when a cudaMalloc fails).

Reserved memory only grows, so its peak is the sum of the segments at the end; the returned excess is that
minus the largest held sum (what `max_memory_reserved - max_memory_allocated` shows for these buffers).
Size ties of free blocks go to the lower address, i.e. to the later segment (cudaMalloc handed out descending
addresses in the allocator history of benchmarks/results/validation_h100_x1/rlhf_packing/diagnostics).

With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True there is one segment per stream that is mapped further in
place (`try_allocate_expandable_block`), so a larger request extends the freed range instead of needing a new
segment: none of this is modelled there (`MemoryAllowance` keeps its expandable-segments terms).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_LARGE_BUFFER = 20 << 20
K_ROUND_LARGE = 2 << 20


def round_size(size: int) -> int:
    """`round_size`: at least kMinBlockSize, else up to a multiple of it."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * -(-size // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """`get_allocation_size`: the cudaMalloc size of a new segment for a (rounded) request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


@dataclass
class _Block:
    segment: int  # creation order of its segment
    offset: int  # bytes from the segment's start
    size: int
    allocated: bool = False


@dataclass(frozen=True)
class PoolPeak:
    """`reserved_bytes`: the segments at the end (reserved never shrinks here); `held_peak_bytes`: the largest sum
    of live blocks; `segments`: their sizes in order of creation."""

    reserved_bytes: int
    held_peak_bytes: int
    segments: tuple[int, ...]

    @property
    def unallocated_at_peak_bytes(self) -> int:
        return self.reserved_bytes - self.held_peak_bytes


def large_pool_peak(events: Iterable[tuple[str, str, int]], stop_above_bytes: float | None = None) -> PoolPeak:
    """Replay `(action, name, size)` events, action "alloc" (size in bytes, > 1 MiB) or "free" (size ignored),
    through the large pool of the caching allocator (module docstring). Names of live blocks must be unique.
    `stop_above_bytes`: return as soon as the segments reserve more (a caller that only needs to know that).

    The free blocks are kept sorted by (size, address), as the allocator's `pool.blocks` set is, so each request
    finds its block by binary search (re-sorting them per request made an RLHF search's replays take 30 s)."""
    segments: list[int] = []
    blocks: list[list[_Block]] = []  # per segment, ordered by offset
    free = _FreeBlocks()
    live: dict[str, _Block] = {}
    held = held_peak = 0
    for action, name, size in events:
        if action == "alloc":
            if name in live:
                raise ValueError(f"block {name!r} is already live")
            size = round_size(int(size))
            if size <= K_SMALL_SIZE:
                raise ValueError(f"{name!r}: {size} bytes is a small-pool request")
            block = free.take_at_least(size)
            if block is None:
                segments.append(allocation_size(size))
                block = _Block(len(segments) - 1, 0, segments[-1])
                blocks.append([block])
                if stop_above_bytes is not None and sum(segments) > stop_above_bytes:
                    return PoolPeak(sum(segments), max(held_peak, held + size), tuple(segments))
            if block.size - size > K_SMALL_SIZE:  # should_split (large pool, not expandable)
                seg = blocks[block.segment]
                rest = _Block(block.segment, block.offset + size, block.size - size)
                block.size = size
                seg.insert(_position(seg, block) + 1, rest)
                free.add(rest)
            block.allocated = True
            live[name] = block
            held += block.size
            held_peak = max(held_peak, held)
        elif action == "free":
            block = live.pop(name)
            block.allocated = False
            held -= block.size
            seg = blocks[block.segment]
            j = _position(seg, block)
            if j + 1 < len(seg) and not seg[j + 1].allocated:  # try_merge_blocks with next
                nxt = seg.pop(j + 1)
                free.remove(nxt)
                block.size += nxt.size
            if j > 0 and not seg[j - 1].allocated:  # ... and with prev
                prev = seg[j - 1]
                free.remove(prev)
                prev.size += seg.pop(j).size
                block = prev
            free.add(block)
        else:
            raise ValueError(f"unknown action {action!r}")
    return PoolPeak(sum(segments), held_peak, tuple(segments))


def _position(seg: list[_Block], block: _Block) -> int:
    """Index of `block` in its segment's offset-ordered blocks."""
    return bisect.bisect_left([b.offset for b in seg], block.offset)


class _FreeBlocks:
    """Free blocks ordered by size, then address (a later segment sits at a lower address, module docstring):
    `get_free_block`'s `lower_bound` is the first at least as large."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int, int]] = []
        self._blocks: dict[tuple[int, int], _Block] = {}

    @staticmethod
    def _key(b: _Block) -> tuple[int, int, int]:
        return (b.size, -b.segment, b.offset)

    def add(self, b: _Block) -> None:
        bisect.insort(self._keys, self._key(b))
        self._blocks[(b.segment, b.offset)] = b

    def remove(self, b: _Block) -> None:
        del self._keys[bisect.bisect_left(self._keys, self._key(b))]
        del self._blocks[(b.segment, b.offset)]

    def take_at_least(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self._keys, (size,))
        if i == len(self._keys):
            return None
        _, neg_segment, offset = self._keys.pop(i)
        return self._blocks.pop((-neg_segment, offset))


def logits_events(
    micro_batch_tokens: Sequence[int], vocab_per_rank: int, training: bool, steps: int = 2, bf16_bytes: int = 2
) -> list[tuple[str, str, int]]:
    """The logits requests of the micro-batches, in the order they run, for `steps` iterations (the second finds
    the segments the first left). Per micro-batch, as megatron-core runs them (and as the allocator history
    of a forward-only pass shows): the output layer's bf16 logits, then `vocab_parallel_cross_entropy`'s fp32
    copy; forward-only frees the fp32 copy, then the bf16 logits. Training (no pipeline parallelism: each
    micro-batch's backward follows its forward) keeps the fp32 softmax for the backward and frees the bf16 logits
    at the end of the forward; the backward turns the fp32 gradient into a bf16 one (autograd casts a gradient to
    its input's dtype), frees the fp32 one, and the output layer's backward frees the bf16 one."""
    events: list[tuple[str, str, int]] = []
    for step in range(steps):
        for i, tokens in enumerate(micro_batch_tokens):
            bf16 = bf16_bytes * tokens * vocab_per_rank
            fp32 = 4 * tokens * vocab_per_rank
            b, f, g = f"{step}.{i}.logits", f"{step}.{i}.fp32", f"{step}.{i}.grad"
            if training:
                events += [("alloc", b, bf16), ("alloc", f, fp32), ("free", b, 0)]
                events += [("alloc", g, bf16), ("free", f, 0), ("free", g, 0)]
            else:
                events += [("alloc", b, bf16), ("alloc", f, fp32), ("free", f, 0), ("free", b, 0)]
    return events


@lru_cache(maxsize=4096)
def packed_logits_fragment_bytes(
    micro_batch_tokens: tuple[int, ...], vocab_per_rank: int, training: bool, stop_above_bytes: float | None = None
) -> int:
    """Reserved-but-unallocated bytes the logits of variable-size micro-batches leave at the peak (no expandable
    segments): `large_pool_peak` over `logits_events`. 0 when every micro-batch fits the blocks of the first.
    `stop_above_bytes`: the replay ends once the segments reserve more (the device would release them there)."""
    if not micro_batch_tokens or vocab_per_rank <= 0:
        return 0
    events = logits_events(micro_batch_tokens, vocab_per_rank, training)
    return large_pool_peak(events, stop_above_bytes).unallocated_at_peak_bytes
