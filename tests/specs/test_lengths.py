"""Variable sequence lengths and verl's packing of them (specs.lengths), checked against verl's own functions and
against a straightforward reference implementation of the same algorithm (the fast path must equal it)."""

import heapq
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.lengths import (
    LengthDistribution,
    SequenceLengths,
    balanced_partitions,
    karmarkar_karp,
    micro_batch_partitions,
    pack_micro_batches,
    parse_mean_max,
    read_length_histogram,
    verl_workload,
)


def test_clipped_geometric_has_the_asked_mean_and_max():
    lengths = SequenceLengths.from_mean_max((300, 1024), (1500, 4096))
    sample = lengths.sample(20000)
    assert lengths.max_tokens == 5120
    assert max(sample) <= 5120 and min(sample) >= 2
    assert sum(sample) / len(sample) == pytest.approx(1800, rel=0.02)
    d = LengthDistribution.from_mean_max("response_len", 3900, 4096)  # most responses truncated at max
    draws = [d.draw(random.Random(i)) for i in range(2000)]
    assert draws.count(4096) > 1500


def test_sampling_is_deterministic_per_seed():
    lengths = SequenceLengths.from_mean_max((512, 1024), (1024, 2048))
    assert lengths.sample(64) == lengths.sample(64) == lengths.sample(64, seed=0)
    assert lengths.sample(64, seed=1) != lengths.sample(64)


def test_degenerate_means():
    assert set(LengthDistribution.from_mean_max("p", 8, 8).draw(random.Random(s)) for s in range(20)) == {8}
    assert set(LengthDistribution.from_mean_max("p", 1, 8).draw(random.Random(s)) for s in range(20)) == {1}


@pytest.mark.parametrize(
    "text, rule",
    [("2048:1024", "above max"), ("0:1024", "mean must be >= 1"), ("512", "MEAN:MAX"), ("a:b", "MEAN:MAX"),
     ("512:0", "max must be")],
)  # fmt: skip
def test_bad_mean_max(text, rule):
    with pytest.raises(ConfigError, match=rule) as exc:
        parse_mean_max("prompt_len", text)
    assert exc.value.field == "prompt_len"


def test_histogram_files(tmp_path):
    js = tmp_path / "h.json"
    js.write_text("[[100, 3], [200, 1], [100, 1]]")
    lengths = read_length_histogram(js)
    assert lengths.max_tokens == 200 and lengths.mean_tokens == pytest.approx(120)
    assert set(lengths.sample(200)) == {100, 200}
    obj = tmp_path / "o.json"
    obj.write_text('{"64": 2, "32": 2}')
    assert read_length_histogram(obj).mean_tokens == 48
    csv = tmp_path / "h.csv"
    csv.write_text("length,count\n# comment\n10,1\n30,1\n")
    assert read_length_histogram(csv).mean_tokens == 20


@pytest.mark.parametrize(
    "content, rule",
    [(b"\xff\xfe10,1\n", "not UTF-8"), (b"10,1,2\n", "expected length,count"), (b"10,x\n", "expected an integer"),
     (b"[[10, -1]]", "counts must be"), (b"[[0, 4]]", "positive integer"), (b"10,0\n", "no sequences"),
     (b"", "no length,count"), (b"[[1,2]", "not valid JSON")],
)  # fmt: skip
def test_bad_histograms_are_one_line_errors(tmp_path, content, rule):
    path = tmp_path / "h.csv"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rule) as exc:
        read_length_histogram(path)
    assert exc.value.field == "length_histogram" and "\n" not in str(exc.value)


def test_packing_keeps_every_sequence_within_budget_with_same_count_on_every_rank():
    lengths = SequenceLengths.from_mean_max((1000, 2048), (3000, 6144)).sample(256)
    packed = pack_micro_batches(lengths, 16384, dp=4, num_batches_divided_by=3)
    assert len(packed.ranks) == 4
    counts = {len(r) for r in packed.ranks}
    assert len(counts) == 1 and packed.num_micro_batches % 3 == 0
    assert sorted(s for mb in packed.micro_batches for s in mb) == sorted(lengths)
    assert packed.largest_micro_batch_tokens <= 16384
    assert all(len(sum(r, ())) == 64 for r in packed.ranks)  # equal shares per rank
    # at least ceil(tokens of the fullest rank / budget) micro-batches
    assert packed.num_micro_batches >= max(-(-sum(sum(r, ())) // 16384) for r in packed.ranks)


def test_sequence_longer_than_budget_is_refused():
    with pytest.raises(ConfigError, match="longest sequence"):
        pack_micro_batches([100, 5000, 20], 4096)


def test_padding_to_alignment():
    packed = pack_micro_batches([5, 17, 32, 1], 64).padded(16)
    assert all(s % 16 == 0 for mb in packed.micro_batches for s in mb)
    assert sorted(s for mb in packed.micro_batches for s in mb) == [16, 16, 32, 32]
    fp8 = pack_micro_batches([5, 17], 64).padded(16, 128)
    assert all(sum(mb) % 128 == 0 for mb in fp8.micro_batches)


def _verl():
    try:
        import torch
        from tensordict import TensorDict
        from verl.utils import seqlen_balancing
    except Exception as exc:  # noqa: BLE001 - any import failure means: not comparable here
        pytest.skip(f"verl.utils.seqlen_balancing does not import: {exc}")
    return torch, TensorDict, seqlen_balancing


def test_micro_batches_equal_verls_rearrange_micro_batches():
    torch, TensorDict, vs = _verl()
    rng = random.Random(7)
    compared = 0
    for _ in range(80):
        n = rng.randint(1, 48)
        lens = [rng.choice([rng.randint(1, 4096), 4096, 1024]) for _ in range(n)]  # ties too
        budget = max(lens) * rng.choice([1, 2, 3, 8])
        divisor = rng.choice([None, 2, 4])
        mask = torch.zeros(n, max(lens), dtype=torch.long)
        for i, s in enumerate(lens):
            mask[i, :s] = 1
        batch = TensorDict({"input_ids": torch.zeros_like(mask), "attention_mask": mask}, batch_size=[n])
        try:
            _, theirs = vs.rearrange_micro_batches(batch, budget, num_batches_divided_by=divisor)
        except (AssertionError, ValueError):
            with pytest.raises(ConfigError):
                micro_batch_partitions(lens, budget, divisor)
            continue
        assert micro_batch_partitions(lens, budget, divisor) == [list(map(int, p)) for p in theirs]
        compared += 1
    assert compared > 40


def test_balanced_partitions_equal_verls():
    _, _, vs = _verl()
    rng = random.Random(3)
    for _ in range(60):
        k = rng.randint(1, 8)
        values = [rng.choice([rng.randint(1, 10**6), 5000]) for _ in range(k * rng.randint(1, 12))]
        assert balanced_partitions(values, k, True) == vs.get_seqlen_balanced_partitions(values, k, True)
        assert balanced_partitions(values, k, False) == vs.get_seqlen_balanced_partitions(values, k, False)


# ---------------------------------------------------------------------------------------------------------------
# The fast path (sparse partial solutions, memoised partitions, rank-by-rank count search) against the
# straightforward algorithm: every partial solution holds all k sets, re-sorted after every merge, as
# verl/utils/seqlen_balancing.py (0.9.1) karmarkar_karp does; rearrange_micro_batches partitions every rank for
# each count before checking the budget.


def _set_key(s):
    return (s[0], len(s[1]), s[1])


class _RefPartial:
    def __init__(self, sets):
        self.sets = sorted(sets, key=_set_key, reverse=True)
        self.spread = self.sets[0][0] - self.sets[-1][0]

    def __lt__(self, other):
        if self.spread != other.spread:
            return self.spread > other.spread
        return _set_key(self.sets[0]) > _set_key(other.sets[0])


def _reference_karmarkar_karp(values, k, equal_size):
    order = sorted((v, i) for i, v in enumerate(values))
    heap = []
    if equal_size:
        for start in range(0, len(order), k):
            heapq.heappush(heap, _RefPartial([(v, [(i, v)]) for v, i in order[start : start + k]]))
    else:
        for v, i in order:
            heapq.heappush(heap, _RefPartial([(v, [(i, v)])] + [(0, [])] * (k - 1)))
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        merged = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a.sets, b.sets[::-1], strict=True)]
        heapq.heappush(heap, _RefPartial(merged))
    return [[i for i, _ in items] for _, items in heap[0].sets]


def _reference_pack(lengths, max_token_len, dp, divided_by):
    """verl's _balance_batch then rearrange_micro_batches on every rank, straightforwardly; None where verl
    refuses (too few sequences for the count)."""
    work = [verl_workload(s) for s in lengths]
    ranks = []
    for part in _reference_karmarkar_karp(work, dp, True):
        part = sorted(part, key=lambda i: (work[i], i))
        ranks.append([lengths[i] for i in part[::2] + part[1::2][::-1]])
    step = divided_by or 1
    n = max(min(len(r), -(-sum(r) // max_token_len)) for r in ranks)
    n = -(-n // step) * step
    while True:
        if n > min(len(r) for r in ranks):
            return None
        parts = [[sorted(p) for p in _reference_karmarkar_karp([verl_workload(s) for s in r], n, False)] for r in ranks]
        if all(sum(r[i] for i in p) <= max_token_len for r, ps in zip(ranks, parts, strict=True) for p in ps):
            break
        n += step
    out = []
    for r, ps in zip(ranks, parts, strict=True):
        ps.sort(key=lambda p, r=r: (sum(verl_workload(r[i]) for i in p), p[0]), reverse=True)
        out.append(tuple(tuple(r[i] for i in p) for p in ps[::2][::-1] + ps[1::2]))
    return tuple(out)


_values = st.lists(st.one_of(st.integers(0, 3), st.sampled_from([5000, 5000, 70]), st.integers(1, 10**7)), max_size=80)


@settings(derandomize=True, max_examples=400, deadline=None)
@given(_values, st.integers(1, 24), st.booleans())
def test_fast_karmarkar_karp_equals_the_straightforward_one(values, k, equal_size):
    """Same sets, same order, same tie-breaks (zeros, equal values, k above the item count)."""
    if not values or (equal_size and len(values) % k):
        return
    assert karmarkar_karp(values, k, equal_size) == _reference_karmarkar_karp(values, k, equal_size)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 48),
    st.sampled_from(["equal", "few", "any"]),
    st.sampled_from([1, 2, 3, 5]),
    st.sampled_from([None, 2, 3]),
    st.data(),
)
def test_fast_packing_equals_the_straightforward_one(dp, per_rank, kind, times, divided_by, data):
    longest = data.draw(st.sampled_from([64, 5120]))
    n = dp * per_rank
    if kind == "equal":  # every sequence at its longest: ties everywhere (mat rlhf without a mean length)
        lengths = [longest] * n
    elif kind == "few":
        lengths = data.draw(st.lists(st.sampled_from([longest, longest // 2, 7]), min_size=n, max_size=n))
    else:
        lengths = data.draw(st.lists(st.integers(1, longest), min_size=n, max_size=n))
    budget = max(lengths) * times
    expected = _reference_pack(lengths, budget, dp, divided_by)
    if expected is None:
        with pytest.raises(ConfigError, match="data-parallel rank has only"):
            pack_micro_batches(lengths, budget, dp=dp, num_batches_divided_by=divided_by)
        return
    packed = pack_micro_batches(lengths, budget, dp=dp, num_batches_divided_by=divided_by)
    assert packed.ranks == expected
    # the cached sums and padded forms are those of the micro-batches
    seqs = [s for r in expected for mb in r for s in mb]
    assert (packed.total_tokens, packed.sum_squares) == (sum(seqs), sum(s * s for s in seqs))
    assert packed.largest_micro_batch_tokens == max(sum(mb) for r in expected for mb in r)
    assert packed.rank_tokens_and_squares == tuple(
        (sum(map(sum, r)), sum(s * s for mb in r for s in mb)) for r in expected
    )
    padded = [[[-(-s // 8) * 8 for s in mb] for mb in r] for r in expected]
    for mb in (mb for r in padded for mb in r):
        mb[-1] += -sum(mb) % 128
    assert packed.padded(8, 128).ranks == tuple(tuple(tuple(mb) for mb in r) for r in padded)
    assert packed.padded(8, 128) is packed.padded(8, 128)  # computed once


def test_negative_workloads_are_refused():
    """The sparse form ranks a non-empty set above an empty one, true for sums >= 0 (verl's workloads are)."""
    with pytest.raises(ConfigError, match=">= 0"):
        karmarkar_karp([5, -1, 3], 2, False)


def test_memoised_partitions_are_fresh_lists():
    """Callers may sort what balanced_partitions returns; the memo must not see it."""
    values = [verl_workload(s) for s in (100, 900, 300, 4000, 20, 20)]
    first = balanced_partitions(values, 3, False)
    expected = [list(p) for p in first]
    first[0].reverse()
    first.reverse()
    assert balanced_partitions(values, 3, False) == expected


def test_a_realistic_step_packs_as_the_straightforward_algorithm_does():
    """256 sequences of Qwen3-8B GRPO lengths (prompt 1k, response 2.5k mean of 4k) on 4 ranks at 10k tokens."""
    lengths = list(SequenceLengths.from_mean_max((1024, 1024), (2500, 4096)).sample(256))
    assert pack_micro_batches(lengths, 10240, dp=4).ranks == _reference_pack(lengths, 10240, 4, None)


def _exact_pack(monkeypatch, lengths, budget, dp, divided_by=None):
    """`pack_micro_batches` with sampling off (every step packed sequence by sequence, as verl does)."""
    import megatron_autotuner.specs.lengths as module

    with monkeypatch.context() as m:
        m.setattr(module, "SAMPLE_MIN_MICRO_BATCHES", 10**9)
        return pack_micro_batches(lengths, budget, dp=dp, num_batches_divided_by=divided_by)


@pytest.mark.parametrize(
    "dp, budget, divided_by",
    [(1, 20480, 2), (2, 5120, None), (2, 10240, 2), (4, 5120, 4)],
)
def test_a_sampled_packing_is_the_exact_one_within_a_percent(monkeypatch, dp, budget, divided_by):
    """4,096 sequences of Qwen3-8B GRPO lengths (prompt 512 of 1k, response 2.5k of 4k), 600-1,300 micro-batches
    per rank: packed from a stratified sample (`_pack_sampled`), every sequence lands in one micro-batch, none
    over the budget, the micro-batch count within 1% of verl's exact packing and the largest micro-batch within
    1% (tokens and squared lengths are then the exact ones: the same sequences)."""
    lengths = list(SequenceLengths.from_mean_max((512, 1024), (2500, 4096)).sample(4096))
    exact = _exact_pack(monkeypatch, lengths, budget, dp, divided_by)
    sampled = pack_micro_batches(lengths, budget, dp=dp, num_batches_divided_by=divided_by)
    assert exact.sampled_every == 1 and sampled.sampled_every > 1
    assert sorted(s for mb in sampled.micro_batches for s in mb) == sorted(lengths)
    assert max(sum(mb) for mb in sampled.micro_batches) <= budget
    assert sampled.num_micro_batches % (divided_by or 1) == 0
    assert sampled.num_micro_batches == pytest.approx(exact.num_micro_batches, rel=0.01)
    assert sampled.largest_micro_batch_tokens == pytest.approx(exact.largest_micro_batch_tokens, rel=0.01)
    assert (sampled.total_tokens, sampled.sum_squares) == (exact.total_tokens, exact.sum_squares)


def test_small_steps_are_packed_exactly():
    """Below `SAMPLE_MIN_MICRO_BATCHES` micro-batches per rank the packing is verl's, sequence by sequence."""
    lengths = list(SequenceLengths.from_mean_max((512, 1024), (2500, 4096)).sample(512))
    assert pack_micro_batches(lengths, 10240, dp=2).sampled_every == 1
