"""Variable sequence lengths of RLHF batches, and verl's packing of them into micro-batches.

`LengthDistribution`: lengths in tokens, either a histogram (length, count) or, from a (mean, max) pair, a
geometric distribution on {1, 2, ...} clipped at max (the mass above max sits at max, as responses truncated at
`max_response_length` do): P(L > k) = q^k for k < max, so E[L] = (1 - q^max) / (1 - q), solved for q in [0, 1]
so that the mean is exact. Sampling is deterministic: `random.Random(seed)`.

`SequenceLengths`: prompt + response lengths (each a distribution), or whole-sequence lengths from a histogram.

verl's dynamic batching (`use_dynamic_bsz`; verl 0.9.1, verl/utils/seqlen_balancing.py), reproduced by
`micro_batch_partitions` and `pack_micro_batches`:
- `ray_trainer.RayPPOTrainer._balance_batch` (trainer.balance_batch, on by default) first splits the batch over
  the dp ranks with `get_seqlen_balanced_partitions(workloads, k_partitions=dp, equal_size=True)`: every rank gets
  the same number of sequences, balanced by `calculate_workload` = 24576*s + s^2 (a 7B model's linear + attention
  FLOPs up to a factor), then orders each rank's share small / large / small (`partition[::2] + partition[1::2]
  [::-1]` of the sequences sorted by workload).
- `rearrange_micro_batches` on each rank: asserts `max_token_len >= ` the longest sequence (a sequence is never
  split); number of micro-batches n = min(sequences, ceil(total tokens / max_token_len)); with DP the ranks take
  the MAX of their n (all-reduce), rounded up to a multiple of `num_batches_divided_by` (megatron's
  `microbatch_group_size_per_vp_stage` with vpp > 1, verl/workers/engine/megatron/transformer_impl.py); then
  `get_seqlen_balanced_partitions(workloads, n, equal_size=False)` (Karmarkar-Karp largest differencing on the
  workloads, not on the tokens), and while any micro-batch of any rank holds more than max_token_len tokens n
  grows by the divisor (1 without vpp) and the partition is redone (ceil(total / max) is only a lower bound);
  n > the sequences of a rank is an error. Finally (`use_dynamic_bsz_balance`) the micro-batches are sorted by
  workload, largest first, and reordered `[::2][::-1] + [1::2]` (small ones at both ends of the pipeline).
  The older verl (commit b178a3c, January 2026) had no such loop: its micro-batches could exceed max_token_len.

Speed (issue #26: the search packs one step's sample for every candidate layout, token budget and phase), with the
results unchanged (tests/specs/test_lengths.py holds the fast path equal to the straightforward algorithm):
- a partial solution keeps only its non-empty sets, as (sum, count, indices) tuples that sort as verl's sets do,
  and a merge touches only the sets that meet (`_merge`): the straightforward merge of the n one-item partial
  solutions of k sets costs O(n k log k) and took seconds per rank for k ~ n (every sequence at its longest);
- partitions are memoised on (workloads, k), the length sample on (lengths, n, seed), a `PackedBatch`'s sums and
  padded forms per instance; the micro-batch count search stops at the first rank over the budget.
- Karmarkar-Karp (`karmarkar_karp`): one partial solution per item (k sets, one holding the item) or, with
  equal_size, per k consecutive sorted items; repeatedly merge the two partial solutions with the largest spread
  (largest set sum - smallest), pairing the largest set of one with the smallest of the other.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import chain
from operator import mul
from pathlib import Path

from ..errors import ConfigError
from ..files import CONFIG_LIMIT_BYTES, parse_json_text, read_text_bounded
from .hashing import cached_hash

# The weight verl's `calculate_workload` gives a token against its attention term: 24576*s + s^2, derived there
# from 12*h^2*s + 2*h*s^2 FLOPs of a dense layer with h = 4096 (verl/utils/seqlen_balancing.py).
VERL_WORKLOAD_LINEAR_WEIGHT = 24576


# one sequence's tokens: 4x the longest context windows trained on today (1M tokens); a length past it is a typo, and
# a budget built on it would "fit" nothing real
MAX_SEQUENCE_TOKENS = 1 << 22


def _positive_int(field: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(field, f"must be a positive integer, got {value!r}")
    return value


@lru_cache(maxsize=256)
def _geometric_ratio(mean: float, maximum: int) -> float:
    """q with (1 - q^max) / (1 - q) = mean (1 + q + ... + q^(max-1), increasing in q): bisection."""
    if mean <= 1.0:
        return 0.0
    if mean >= maximum:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):
        q = (lo + hi) / 2
        if (1 - q**maximum) / (1 - q) < mean:
            lo = q
        else:
            hi = q
    return (lo + hi) / 2


@dataclass(frozen=True)
class LengthDistribution:
    """Sequence lengths in tokens: a histogram (`values`, `counts`), or clipped geometric with `mean` and `max`."""

    name: str
    mean_tokens: float
    max_tokens: int
    values: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()

    __hash__ = cached_hash  # a histogram can hold 10^5 lengths: hashed once, not at every cache lookup of the search

    def __post_init__(self) -> None:
        _positive_int(f"{self.name}.max", self.max_tokens)
        if self.max_tokens > MAX_SEQUENCE_TOKENS:
            raise ConfigError(
                f"{self.name}.max", f"{self.max_tokens} tokens is above the limit of {MAX_SEQUENCE_TOKENS} per sequence"
            )
        if self.values or self.counts:
            if len(self.values) != len(self.counts):
                raise ConfigError(self.name, "a histogram needs one count per length")
            for v, c in zip(self.values, self.counts, strict=True):
                _positive_int(f"{self.name} length", v)
                if not isinstance(c, int) or isinstance(c, bool) or c < 0:
                    raise ConfigError(self.name, f"counts must be integers >= 0, got {c!r} for length {v}")
            if sum(self.counts) == 0:
                raise ConfigError(self.name, "the histogram has no sequences (every count is 0)")
            return
        mean = self.mean_tokens
        if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean) or mean < 1:
            raise ConfigError(f"{self.name}.mean", f"must be a number >= 1 token, got {mean!r}")
        if mean > self.max_tokens:
            raise ConfigError(self.name, f"mean {mean:g} is above max {self.max_tokens}")

    @classmethod
    def from_mean_max(cls, name: str, mean_tokens: float, max_tokens: int) -> LengthDistribution:
        return cls(name, mean_tokens, max_tokens)

    @classmethod
    def from_histogram(cls, name: str, pairs: Sequence[tuple[int, int]]) -> LengthDistribution:
        """From (length, count) pairs; lengths may repeat (their counts add)."""
        merged: dict[int, int] = {}
        for length, count in pairs:
            _positive_int(f"{name} length", length)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ConfigError(name, f"counts must be integers >= 0, got {count!r} for length {length}")
            merged[length] = merged.get(length, 0) + count
        kept = sorted((v, c) for v, c in merged.items() if c > 0)
        if not kept:
            raise ConfigError(name, "the histogram has no sequences (no row or every count is 0)")
        total = sum(c for _, c in kept)
        mean = sum(v * c for v, c in kept) / total
        return cls(name, mean, kept[-1][0], tuple(v for v, _ in kept), tuple(c for _, c in kept))

    @property
    def is_histogram(self) -> bool:
        return bool(self.values)

    def draw(self, rng: random.Random) -> int:
        """One length: weighted choice from the histogram, or inverse CDF of the clipped geometric,
        L = min(max, 1 + floor(ln U / ln q)) for U uniform in (0, 1]."""
        if self.values:
            return rng.choices(self.values, weights=self.counts)[0]
        q = _geometric_ratio(self.mean_tokens, self.max_tokens)
        if q <= 0.0:
            return 1
        if q >= 1.0:
            return self.max_tokens
        u = 1.0 - rng.random()  # (0, 1]
        return min(self.max_tokens, 1 + int(math.log(u) / math.log(q)))

    def describe(self) -> str:
        if self.values:
            n = sum(self.counts)
            return f"{self.name} histogram ({n} sequences, mean {self.mean_tokens:.0f}, max {self.max_tokens})"
        return f"{self.name} mean {self.mean_tokens:g} max {self.max_tokens}"


@dataclass(frozen=True)
class SequenceLengths:
    """Lengths of the sequences of a batch: prompt + response, or whole sequences (`sequence`, a histogram).
    `image_tokens`: a vision-language model's prompts each hold one image of that many tokens (part of the prompt's
    length; `Workload.image_tokens_per_sequence`)."""

    prompt: LengthDistribution | None = None
    response: LengthDistribution | None = None
    sequence: LengthDistribution | None = None
    seed: int = 0
    image_tokens: int = 0

    __hash__ = cached_hash

    def __post_init__(self) -> None:
        parts = (self.prompt, self.response)
        if self.sequence is None and None in parts:
            raise ConfigError("lengths", "give both prompt and response lengths, or a whole-sequence histogram")
        if self.sequence is not None and parts != (None, None):
            raise ConfigError("lengths", "give prompt and response lengths or a whole-sequence histogram, not both")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError("lengths.seed", f"must be an integer, got {self.seed!r}")
        images, prompt = self.image_tokens, self.prompt if self.prompt is not None else self.sequence
        if isinstance(images, bool) or not isinstance(images, int) or not 0 <= images <= prompt.max_tokens:
            raise ConfigError("image_tokens", f"must be an integer in 0..{prompt.max_tokens} (the longest prompt)")

    @classmethod
    def from_mean_max(cls, prompt: tuple[float, int], response: tuple[float, int], seed: int = 0) -> SequenceLengths:
        return cls(
            LengthDistribution.from_mean_max("prompt_len", *prompt),
            LengthDistribution.from_mean_max("response_len", *response),
            seed=seed,
        )

    @property
    def max_tokens(self) -> int:
        """The longest sequence there can be: max prompt + max response (verl pads the batch to that width)."""
        if self.sequence is not None:
            return self.sequence.max_tokens
        return self.prompt.max_tokens + self.response.max_tokens

    @property
    def mean_tokens(self) -> float:
        if self.sequence is not None:
            return self.sequence.mean_tokens
        return self.prompt.mean_tokens + self.response.mean_tokens

    def sample(self, n: int, seed: int | None = None) -> tuple[int, ...]:
        """`n` sequence lengths (prompt + response), the same for the same seed (default `self.seed`); drawn once
        per (lengths, n, seed) and reused."""
        _positive_int("num_sequences", n)
        return _sample(self, n, self.seed if seed is None else seed)

    def describe(self) -> str:
        if self.sequence is not None:
            return self.sequence.describe()
        return f"{self.prompt.describe()}, {self.response.describe()}"

    def to_dict(self) -> dict:
        out: dict = {"mean_tokens": self.mean_tokens, "max_tokens": self.max_tokens, "seed": self.seed}
        for name in ("prompt", "response", "sequence"):
            d = getattr(self, name)
            if d is not None:
                out[name] = {"mean_tokens": d.mean_tokens, "max_tokens": d.max_tokens}
                if d.values:
                    out[name]["histogram"] = [[v, c] for v, c in zip(d.values, d.counts, strict=True)]
        if self.image_tokens:
            out["image_tokens"] = self.image_tokens
        return out


@lru_cache(maxsize=256)
def _sample(lengths: SequenceLengths, n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    if lengths.sequence is not None:
        return tuple(lengths.sequence.draw(rng) for _ in range(n))
    return tuple(lengths.prompt.draw(rng) + lengths.response.draw(rng) for _ in range(n))


def parse_mean_max(field: str, text: str) -> tuple[float, int]:
    """'MEAN:MAX' (e.g. '512:1024') -> (mean, max); a one-line ConfigError otherwise."""
    mean_text, sep, max_text = str(text).partition(":")
    if not sep:
        raise ConfigError(field, f"must be MEAN:MAX in tokens (e.g. 512:1024), got {text!r}")
    try:
        mean = float(mean_text)
        maximum = int(max_text)
    except ValueError:
        raise ConfigError(field, f"must be MEAN:MAX in tokens (a number and an integer), got {text!r}") from None
    if not math.isfinite(mean) or mean < 1:
        raise ConfigError(field, f"mean must be >= 1 token, got {mean_text!r}")
    if maximum < 1:
        raise ConfigError(field, f"max must be a positive integer, got {max_text!r}")
    if mean > maximum:
        raise ConfigError(field, f"mean {mean:g} is above max {maximum}")
    return mean, maximum


def read_length_histogram(path: str | Path, field: str = "length_histogram", seed: int = 0) -> SequenceLengths:
    """Whole-sequence lengths from a histogram file: JSON (a list of [length, count] pairs, or an object
    {"length": count}) or CSV (lines `length,count`; a header line and `#` comments are skipped)."""
    text = read_text_bounded(path, field, CONFIG_LIMIT_BYTES)
    pairs: list[tuple[int, int]] = []
    if str(path).lower().endswith(".json") or text.lstrip().startswith(("[", "{")):
        data = parse_json_text(text, path, field)
        items = data.items() if isinstance(data, dict) else data
        if not isinstance(items, (list, type({}.items()))):
            raise ConfigError(field, f"{path}: expected a list of [length, count] pairs or a {{length: count}} object")
        for item in items:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ConfigError(field, f"{path}: each entry must be [length, count], got {item!r}")
            pairs.append((_int_cell(field, path, item[0]), _int_cell(field, path, item[1])))
    else:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            cells = [c.strip() for c in line.replace(";", ",").split(",")]
            if len(cells) != 2:
                raise ConfigError(field, f"{path} line {number}: expected length,count, got {line!r}")
            if not pairs and not cells[0].lstrip("-").isdigit():
                continue  # a header
            pairs.append((_int_cell(field, path, cells[0], number), _int_cell(field, path, cells[1], number)))
    if not pairs:
        raise ConfigError(field, f"{path} holds no length,count rows")
    try:
        dist = LengthDistribution.from_histogram("length_histogram", pairs)
    except ConfigError as exc:
        raise ConfigError(field, f"{path}: {exc.rule}") from None
    return SequenceLengths(sequence=dist, seed=seed)


def _int_cell(field: str, path: str | Path, value: object, line: int | None = None) -> int:
    where = f"{path}" + (f" line {line}" if line is not None else "")
    if isinstance(value, bool):
        raise ConfigError(field, f"{where}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(field, f"{where}: expected an integer, got {value!r}") from None


# ---------------------------------------------------------------------------------------------------------------
def verl_workload(length: int) -> int:
    """verl's `calculate_workload`: 24576*s + s^2 (the quantity its partitions balance)."""
    return VERL_WORKLOAD_LINEAR_WEIGHT * length + length * length


def _entry(sets: list[tuple[int, int, list[int]]], k: int) -> tuple:
    """A heap entry of a partial solution whose non-empty `sets` (sum, count, item indices) are sorted smallest
    first, the other k - len(sets) sets being empty: (-spread, -top sum, -top count, -top's first index, sets).
    heapq pops the largest spread first, then the largest top set -- verl's State.__lt__, where sets compare by
    (sum, count, items) and the items of two partial solutions' top sets, being disjoint, differ at their first.
    So two entries never tie and the pops are those of verl's heap, whatever its layout."""
    top = sets[-1]
    spread = top[0] - (sets[0][0] if len(sets) == k else 0)
    return (-spread, -top[0], -top[1], -top[2][0], sets)


def _merge(a: list, b: list, k: int) -> list:
    """Non-empty sets, smallest first, of the merge of partial solutions a and b (their non-empty sets smallest
    first, the rest of the k sets empty; both lists are consumed). verl pairs set i of a with set k-1-i of b,
    counting from the largest: with m = len(a) + len(b) - k > 0 the m smallest of a meet the m smallest of b,
    smallest with largest; every other set meets an empty one and is kept as it is. The result is sorted again (no
    two non-empty sets compare equal: their indices differ), a few sets inserted by binary search into the longer
    sorted run, more appended and sorted: a merge that meets few sets costs a few comparisons, not k."""
    m = len(a) + len(b) - k
    if m > 0:
        met = [(sa[0] + sb[0], sa[1] + sb[1], sa[2] + sb[2]) for sa, sb in zip(reversed(a[:m]), b[:m], strict=True)]
        del a[:m], b[:m]
        base, rest = (a, b + met) if len(a) >= len(b) else (b, a + met)
    else:
        base, rest = (a, b) if len(a) >= len(b) else (b, a)
    if len(rest) <= _INSERT_AT_MOST:
        for s in rest:
            bisect.insort(base, s)
    else:
        base += rest
        base.sort()
    return base


# Up to this many sets are inserted one by one (binary search) into a partial solution's sorted sets; more are
# appended and sorted. Either gives the same order; this only picks the cheaper way (a speed setting, not a model
# constant).
_INSERT_AT_MOST = 8


def karmarkar_karp(values: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    """Indices of `values` (>= 0) in k sets of near-equal sums by the largest differencing method (module
    docstring), with verl's tie-breaks: sets ordered by (sum, item count, item indices), partial solutions by
    spread, then their largest set; sets largest first, as verl returns them. A partial solution keeps only its
    non-empty sets, each a tuple (sum, count, indices) that sorts as verl's Set does, so merging the n one-item
    partial solutions of k sets costs the sets that meet, not k per merge (`_merge`)."""
    _positive_int("k_partitions", k)
    if any(v < 0 for v in values):
        raise ConfigError("values", "workloads must be >= 0")
    order = sorted((v, i) for i, v in enumerate(values))
    if equal_size:
        if len(values) % k:
            raise ConfigError("global_batch_size", f"{len(values)} sequences do not split equally over {k} ranks")
        chunks = (order[start : start + k] for start in range(0, len(order), k))
        heap = [_entry(sorted((v, 1, [i]) for v, i in chunk), k) for chunk in chunks]
    else:
        heap = [_entry([(v, 1, [i])], k) for v, i in order]
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, _entry(_merge(a[-1], b[-1], k), k))
    sets = heap[0][-1]
    return [s[2] for s in reversed(sets)] + [[] for _ in range(k - len(sets))]


def balanced_partitions(values: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    """verl's `get_seqlen_balanced_partitions`: Karmarkar-Karp, each set's indices sorted; none may be empty.
    Memoised on (values, k, equal_size): the search packs one length sample for many token budgets and layouts,
    and their micro-batch counts overlap."""
    if len(values) < k:
        raise ConfigError("max_token_len", f"{len(values)} sequences cannot fill {k} micro-batches")
    return [list(p) for p in _partitions(tuple(values), k, equal_size)]


@lru_cache(maxsize=512)  # a search asks for a few hundred (workloads, k); each holds <= one step's indices
def _partitions(values: tuple[int, ...], k: int, equal_size: bool) -> tuple[tuple[int, ...], ...]:
    if k == 1:  # one set holds every index, whatever the merges' order (dp = 1)
        return (tuple(range(len(values))),)
    parts = tuple(tuple(sorted(p)) for p in karmarkar_karp(values, k, equal_size))
    if any(not p for p in parts):
        raise ConfigError("max_token_len", f"a balanced partition of {len(values)} sequences into {k} is empty")
    return parts


def micro_batch_partitions(
    lengths: Sequence[int],
    max_token_len: int,
    num_batches_divided_by: int | None = None,
    *,
    min_num_micro_batch: int | None = None,
    balance_order: bool = True,
) -> list[list[int]]:
    """verl's `rearrange_micro_batches` on one rank (no DP sync): index lists of the micro-batches, in verl's
    order. `ConfigError` for a sequence longer than `max_token_len` (verl: an assertion)."""
    return _rearrange([list(lengths)], max_token_len, num_batches_divided_by, min_num_micro_batch, balance_order)[0]


def _rearrange(
    ranks: list[list[int]],
    max_token_len: int,
    divided_by: int | None,
    min_count: int | None,
    balance_order: bool,
    budget_lengths: list[list[int]] | None = None,
) -> list[list[list[int]]]:
    """`rearrange_micro_batches` on every DP rank at once, with its all-reduces (MAX of the counts, MIN of
    'every micro-batch within max_token_len'). `budget_lengths`: what each item weighs against `max_token_len`
    when not its length (a sample's item stands for a run of lengths: the longest of them)."""
    _positive_int("max_token_len", max_token_len)
    checked = budget_lengths or ranks
    longest = max(max(r) for r in checked)
    if longest > max_token_len:
        raise ConfigError(
            "max_token_len",
            f"{max_token_len} is below the longest sequence ({longest} tokens): verl never splits a sequence",
        )
    n = max(min(len(r), -(-sum(r) // max_token_len)) for r in ranks)
    if min_count is not None:
        n = max(n, min_count)
    step = divided_by or 1
    n = -(-n // step) * step
    fewest = min(len(r) for r in ranks)
    workloads = [tuple(verl_workload(s) for s in r) for r in ranks]
    while True:
        if n > fewest:
            raise ConfigError(
                "max_token_len",
                f"{n} micro-batches are needed to keep each within {max_token_len} tokens, but a data-parallel "
                f"rank has only {fewest} sequences",
            )
        # rank by rank, up to the first with a micro-batch over the budget: the count then grows either way, and
        # no partition of n <= a rank's sequences can be refused (Karmarkar-Karp leaves no set empty then)
        parts = []
        for r, w in zip(checked, workloads, strict=True):
            ps = balanced_partitions(w, n, equal_size=False)
            if any(sum(r[i] for i in p) > max_token_len for p in ps):
                break
            parts.append(ps)
        else:
            break
        n += step
    if balance_order:
        for w, ps in zip(workloads, parts, strict=True):
            ps[:] = _small_at_both_ends(ps, key=lambda p, w=w: (sum(w[i] for i in p), p[0]))
    return parts


def _small_at_both_ends(items: Iterable, key) -> list:
    """verl's micro-batch order (`use_dynamic_bsz_balance`): largest `key` first, then `[::2][::-1] + [1::2]`, so
    the small ones sit at both ends of the pipeline."""
    ordered = sorted(items, key=key, reverse=True)
    return ordered[::2][::-1] + ordered[1::2]


@dataclass(frozen=True)
class PackedBatch:
    """Sequence lengths of every micro-batch of every data-parallel rank: `ranks[r][m]` (same m on every rank).

    Immutable, so its sums and its padded forms are computed once per instance (the search asks for them for
    every candidate layout and phase that shares the packing)."""

    ranks: tuple[tuple[tuple[int, ...], ...], ...]
    max_token_len: int
    sampled_every: int = 1  # > 1: packed from a sample of one sequence in this many (`_pack_sampled`)

    @property
    def num_micro_batches(self) -> int:
        return len(self.ranks[0])

    @cached_property
    def micro_batches(self) -> tuple[tuple[int, ...], ...]:
        return tuple(chain.from_iterable(self.ranks))

    @cached_property
    def rank_tokens_and_squares(self) -> tuple[tuple[int, int], ...]:
        """(sum s, sum s^2) over each data-parallel rank's sequences."""
        flat = [list(chain.from_iterable(r)) for r in self.ranks]
        return tuple((sum(f), sum(map(mul, f, f))) for f in flat)

    @cached_property
    def total_tokens(self) -> int:
        return sum(t for t, _ in self.rank_tokens_and_squares)

    @cached_property
    def sum_squares(self) -> int:
        """sum over sequences of s^2 (what causal attention work scales with)."""
        return sum(q for _, q in self.rank_tokens_and_squares)

    @cached_property
    def largest_micro_batch_tokens(self) -> int:
        return max(map(sum, self.micro_batches))

    @cached_property
    def _padded_forms(self) -> dict[tuple[int, int], PackedBatch]:
        return {}

    def padded(self, align_tokens: int, total_align_tokens: int = 1) -> PackedBatch:
        """Each sequence rounded up to a multiple of `align_tokens`; the last of each micro-batch further so that
        the micro-batch is a multiple of `total_align_tokens` (verl's fp8 THD padding)."""
        _positive_int("align_tokens", align_tokens)
        key = (align_tokens, total_align_tokens)
        if key in self._padded_forms:
            return self._padded_forms[key]

        # each distinct length's padded form, looked up (tens of thousands of sequences per packing, for every
        # alignment; one table per distinct length, not per length up to the longest: 4M-token sequences took 40 s)
        rounded = {s: -(-s // align_tokens) * align_tokens for s in set(chain.from_iterable(self.micro_batches))}

        def pad(mb: tuple[int, ...]) -> tuple[int, ...]:
            out = tuple(map(rounded.__getitem__, mb))
            if total_align_tokens > 1 and out:
                return (*out[:-1], out[-1] + (-sum(out)) % total_align_tokens)
            return out

        if align_tokens == 1 and total_align_tokens <= 1:
            result = self
        else:
            padded = tuple(tuple(map(pad, r)) for r in self.ranks)
            result = PackedBatch(padded, self.max_token_len, self.sampled_every)
        self._padded_forms[key] = result
        return result


def split_over_ranks(lengths: Sequence[int], dp: int) -> list[list[int]]:
    """verl's `_balance_batch`: equal-size Karmarkar-Karp split over dp ranks by workload, then each rank's
    sequences sorted by workload and ordered small / large / small. Lengths per rank, in that order."""
    _positive_int("dp", dp)
    return [[lengths[i] for i in part] for part in _balanced_rank_split([verl_workload(s) for s in lengths], dp)]


def _balanced_rank_split(work: list[int], dp: int) -> list[list[int]]:
    """`split_over_ranks` on workloads: the indices each rank gets, in verl's small / large / small order."""
    ranks = []
    for part in balanced_partitions(work, dp, equal_size=True):
        part.sort(key=lambda i: (work[i], i))
        ranks.append(part[::2] + part[1::2][::-1])
    return ranks


# Sequences of varying length one step may hold (prompts x responses in RLHF): what `mat plan` and `mat rlhf` answer
# in under 10 s on two cores (benchmarks/search_speed.py; 131,072 took `mat plan` 15 s). verl's recipes take 512-1,024
# prompts x 8-16 responses; past the limit a typo (an extra digit in rollout.n) would sample and pack millions first.
MAX_SAMPLED_SEQUENCES = 1 << 16


# A step whose packing would need many micro-batches per rank is packed from a stratified sample (`_pack_sampled`):
# verl's loop re-partitions every rank once per micro-batch it adds past ceil(tokens / budget), each time over all of
# the rank's sequences, so its cost grows with the square of the step's sequences (8,192 sequences at a 5,120-token
# budget: 9 s on one core; 65,536: minutes). The sample keeps at least this many micro-batches per rank per
# micro-batch group; against the exact packing the count, tokens and memory are within the bounds
# tests/specs/test_lengths.py states. A speed setting bounded by that test, not a model constant.
SAMPLE_MIN_MICRO_BATCHES = 100


def _sample_factor(lengths: Sequence[int], max_token_len: int, dp: int, step: int) -> int:
    """f: the sample takes one sequence of every f; the largest divisor of the sequences per rank that leaves the
    sample at least `SAMPLE_MIN_MICRO_BATCHES` micro-batches per rank per group of `_sample_step` (by the lower
    bound ceil(tokens / budget)), else 1 (exact)."""
    per_rank = len(lengths) // dp
    lower_bound = -(-sum(lengths) // (dp * max_token_len))
    fits = (f for f in range(per_rank, 1, -1) if per_rank % f == 0)
    return next((f for f in fits if lower_bound // f >= SAMPLE_MIN_MICRO_BATCHES * _sample_step(step, f)), 1)


def _sample_step(step: int, every: int) -> int:
    """The micro-batch multiple the sample keeps so that `every` times its count is a multiple of `step`."""
    return step // math.gcd(step, every)


def _strata(lengths: Sequence[int], every: int) -> list[tuple[int, ...]]:
    """The sorted lengths in runs of `every`."""
    ordered = sorted(lengths)
    return [tuple(ordered[j : j + every]) for j in range(0, len(ordered), every)]


def _pack_sampled(
    lengths: Sequence[int], max_token_len: int, dp: int, divided_by: int | None, balance_batch: bool, every: int
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """verl's packing of a stratified sample, expanded back to every sequence. The sorted lengths are cut into runs
    of `every` (strata); each stratum's middle length stands for it in the rank split and the micro-batch
    partition (Karmarkar-Karp on workloads), while the budget is checked against each stratum's longest length;
    each micro-batch of strata then becomes `every` micro-batches, the k-th taking the k-th length of each of its
    strata. So every sequence is packed once, none over the budget, and the sizes vary as the exact packing's do;
    the micro-batches are put in verl's order (largest workload first, then `[::2][::-1] + [1::2]`)."""
    share = len(lengths) // dp
    if balance_batch:
        strata = _strata(lengths, every)
        work = [verl_workload(s[every // 2]) for s in strata]  # `split_over_ranks` on the strata's middles
        ranks = [[strata[i] for i in part] for part in _balanced_rank_split(work, dp)]
    else:
        ranks = [_strata(lengths[r * share : (r + 1) * share], every) for r in range(dp)]
    step = _sample_step(divided_by or 1, every)
    parts = _rearrange([[s[every // 2] for s in r] for r in ranks], max_token_len, step, None, False,
                       budget_lengths=[[s[-1] for s in r] for r in ranks])  # fmt: skip
    out = []
    for r, ps in zip(ranks, parts, strict=True):
        mbs = [mb for p in ps for mb in zip(*(r[i] for i in p), strict=True)]  # k-th: k-th of each stratum
        work = [VERL_WORKLOAD_LINEAR_WEIGHT * sum(mb) + sum(map(mul, mb, mb)) for mb in mbs]  # `verl_workload`
        out.append(tuple(mbs[i] for i in _small_at_both_ends(range(len(mbs)), key=work.__getitem__)))
    return tuple(out)


def pack_micro_batches(
    lengths: Sequence[int],
    max_token_len: int,
    *,
    dp: int = 1,
    num_batches_divided_by: int | None = None,
    balance_batch: bool = True,
) -> PackedBatch:
    """The micro-batches verl makes of one optimizer step's `lengths` on `dp` ranks: `split_over_ranks`
    (`balance_batch`; else consecutive equal shares, verl's dispatch), then `rearrange_micro_batches` on every
    rank with the counts synchronised (module docstring). Where that needs many micro-batches, the packing of a
    stratified sample expanded to every sequence (`_pack_sampled`; `PackedBatch.sampled_every`)."""
    _positive_int("dp", dp)
    if len(lengths) % dp:
        raise ConfigError(
            "global_batch_size", f"{len(lengths)} sequences must be divisible by dp={dp} (verl splits them equally)"
        )
    _positive_int("max_token_len", max_token_len)
    every = _sample_factor(lengths, max_token_len, dp, num_batches_divided_by or 1)
    if every > 1:
        packed = _pack_sampled(lengths, max_token_len, dp, num_batches_divided_by, balance_batch, every)
        return PackedBatch(packed, max_token_len, every)
    if balance_batch:
        ranks = split_over_ranks(lengths, dp)
    else:
        share = len(lengths) // dp
        ranks = [list(lengths[r * share : (r + 1) * share]) for r in range(dp)]
    parts = _rearrange(ranks, max_token_len, num_batches_divided_by, None, True)
    packed = tuple(tuple(tuple(r[i] for i in p) for p in ps) for r, ps in zip(ranks, parts, strict=True))
    return PackedBatch(packed, max_token_len)
