"""Multi-rank merge: one process per rank, every GPU event kept, aligned timestamps, atomic output."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from megatron_autotuner.trace import TraceError, load_trace, merge_traces, summarize

from .helpers import NCCL, UB, kernel, raw, raw_gpu_events, write_trace


def _read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)  # must be valid JSON


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_merge_two_tp2_ranks(tmp_path, suffix):
    out = tmp_path / f"merged{suffix}"
    result = merge_traces(NCCL, out)
    doc = _read(out)
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    sort = {
        e["pid"]: e["args"]["sort_index"] for e in events if e.get("ph") == "M" and e["name"] == "process_sort_index"
    }
    assert sort == {0: 0, 1: 1}
    assert {e["pid"] for e in events} == {0, 1}
    for rank, path in enumerate(NCCL):
        src = Counter((e["name"], e["ts"], e["dur"], e["args"]["stream"]) for e in raw_gpu_events(path))
        got = Counter(
            (e["name"], e["ts"], e["dur"], e["args"]["stream"])
            for e in events
            if e["pid"] == rank and e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        )
        assert got == src  # every GPU event kept, same (shared-base) timestamps
        assert result.ranks[rank].gpu_events == sum(src.values())
    threads = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert "GPU 0 / stream 7" in threads and "GPU 0 / stream 17" in threads
    assert any(t.startswith("CPU / thread") for t in threads)
    assert doc["mergedBy"]["schema_version"] == 1
    assert [r["rank"] for r in doc["mergedBy"]["ranks"]] == [0, 1]
    # flow ids stay pairs within one rank
    flows = Counter((e["pid"], e["cat"], e["id"], e["ph"]) for e in events if e.get("ph") in ("s", "f"))
    starts = {(p, c, i) for (p, c, i, ph) in flows if ph == "s"}
    ends = {(p, c, i) for (p, c, i, ph) in flows if ph == "f"}
    ids_by_rank = [{i for p, _, i in starts | ends if p == r} for r in (0, 1)]
    assert not ids_by_rank[0] & ids_by_rank[1]
    assert len(starts & ends) > 50
    assert not list(tmp_path.glob(".*.tmp"))


def test_merged_file_loads_back_and_counts(tmp_path):
    out = tmp_path / "ub.json.gz"
    merge_traces(UB, out)
    t = load_trace(out)
    assert len(t.gpu_events) == sum(len(raw_gpu_events(p)) for p in UB)
    assert summarize(t).unmatched_kernels == ()


def test_offsets_and_base_alignment(tmp_path):
    a = write_trace(
        tmp_path / "a.json", [kernel("k", 100.0, 5.0)], distributedInfo={"rank": 0}, baseTimeNanoseconds=1000
    )
    b = write_trace(
        tmp_path / "b.json", [kernel("k", 100.0, 5.0)], distributedInfo={"rank": 1}, baseTimeNanoseconds=3000
    )
    out = tmp_path / "m.json"
    result = merge_traces([b, a], out, offsets_us={1: 0.5})
    # rank 1's clock starts 2000 ns = 2 us later, plus the 0.5 us offset
    assert [(r.rank, r.shift_us) for r in result.ranks] == [(0, 0.0), (1, 2.5)]
    doc = _read(out)
    ts = {e["pid"]: e["ts"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    assert ts == {0: 100.0, 1: 102.5}
    assert doc["baseTimeNanoseconds"] == 1000


def test_bad_input_names_file_and_writes_nothing(tmp_path):
    data = NCCL[1].read_bytes()
    bad = tmp_path / "rank1.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    out = tmp_path / "merged.json"
    with pytest.raises(TraceError) as info:
        merge_traces([NCCL[0], bad], out)
    assert str(bad) in str(info.value) and "truncated gzip" in str(info.value)
    assert list(tmp_path.iterdir()) == [bad]  # no output, no temp file


def test_bad_input_found_while_streaming_leaves_nothing(tmp_path):
    # header is fine, events break later: the temp file must be removed
    text = json.dumps(raw(NCCL[1]))
    bad = tmp_path / "late.json"
    bad.write_text(text[: int(len(text) * 0.8)])
    out = tmp_path / "merged.json.gz"
    with pytest.raises(TraceError, match="late.json: truncated JSON"):
        merge_traces([NCCL[0], bad], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.json"]


def test_duplicate_ranks_and_unknown_offset(tmp_path):
    with pytest.raises(TraceError, match="rank 0 is also the rank of"):
        merge_traces([NCCL[0], NCCL[0]], tmp_path / "m.json")
    from megatron_autotuner.errors import ConfigError

    with pytest.raises(ConfigError, match="no input has rank 5"):
        merge_traces(NCCL, tmp_path / "m.json", offsets_us={5: 1.0})
