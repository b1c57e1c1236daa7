"""Loading: metadata, records, streaming over chunk boundaries, and clear errors for bad files."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from megatron_autotuner.errors import AutotunerError
from megatron_autotuner.trace import TraceError, load_trace
from megatron_autotuner.trace.jsonstream import TraceReader

from .helpers import ALL_TRACES, NCCL, UB, cpu, kernel, launch, raw, raw_gpu_events, write_trace


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.name)
def test_load_keeps_every_gpu_event_and_metadata(path):
    doc = raw(path)
    t = load_trace(path)
    expected = sorted((e["name"], e["ts"], e["dur"], e["args"]["stream"]) for e in raw_gpu_events(path))
    assert sorted((e.name, e.ts_us, e.dur_us, e.stream) for e in t.gpu_events) == expected
    dist = doc["distributedInfo"]
    assert (t.metadata.rank, t.metadata.world_size) == (dist["rank"], dist["world_size"])
    assert t.metadata.base_time_ns == doc["baseTimeNanoseconds"]
    assert t.metadata.devices[0].name == "NVIDIA H200"
    assert len(t.metadata.process_groups) == len(dist["pg_config"])
    n_cpu = sum(1 for e in doc["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation"))
    assert len(t.cpu_ranges) == n_cpu
    assert sum(t.event_counts.values()) == len(doc["traceEvents"])
    # every kernel of these traces has a CPU launch (runtime/driver call) with its correlation id
    assert all(e.correlation in t.launches for e in t.gpu_events)


def test_peer_copy_without_device_arg_takes_pid():
    t = load_trace(UB[0])
    ptop = [e for e in t.gpu_events if e.name.startswith("Memcpy PtoP")]
    assert len(ptop) == 4 and {e.device for e in ptop} == {0}


def test_gpu_user_annotations_loaded():
    t = load_trace(NCCL[0])
    names = [g.name for g in t.gpu_ranges]
    assert names.count("nccl:_all_gather_base") == 6 and names.count("nccl:_reduce_scatter_base") == 4
    assert {g.stream for g in t.gpu_ranges} == {7, 17}


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_streaming_over_tiny_chunks_matches_json_load(tmp_path, chunk):
    # plain JSON with numbers, strings and nesting split at every possible place
    doc = raw(NCCL[1])
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps(doc))
    with TraceReader(plain, chunk_chars=chunk) as r:
        events = list(r.events())
        meta = r.metadata
    assert events == doc["traceEvents"]
    assert meta == {k: v for k, v in doc.items() if k != "traceEvents"}


def test_json_and_gz_give_the_same_trace(tmp_path):
    plain = tmp_path / "t.json"
    with gzip.open(NCCL[0], "rt") as f:
        plain.write_text(f.read())
    a, b = load_trace(plain), load_trace(NCCL[0])
    assert a.gpu_events == b.gpu_events and a.cpu_ranges == b.cpu_ranges and a.launches == b.launches


def test_metadata_after_events_and_bare_array(tmp_path):
    p = tmp_path / "late.json"
    p.write_text(json.dumps({"traceEvents": [kernel("k", 1.0, 2.0)], "distributedInfo": {"rank": 3}}))
    t = load_trace(p)
    assert t.metadata.rank == 3 and len(t.gpu_events) == 1
    arr = tmp_path / "array.json"
    arr.write_text(json.dumps([kernel("k", 1.0, 2.0), cpu("op", 0.0, 5.0)]))
    t = load_trace(arr)
    assert len(t.gpu_events) == 1 and len(t.cpu_ranges) == 1 and t.metadata.rank is None


def test_ac2g_flow_gives_launch_when_runtime_event_lacks_correlation(tmp_path):
    events = [
        kernel("k", 10.0, 2.0, corr=5),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 1, "tid": 100, "ts": 3.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 0, "tid": 7, "ts": 10.0, "bp": "e"},
        launch(4.0, 6),
    ]
    t = load_trace(write_trace(tmp_path / "f.json", events))
    assert t.launches[5].ts_us == 3.0 and t.launches[6].ts_us == 4.0


def _bad(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(TraceError) as info:
        load_trace(p)
    msg = str(info.value)
    assert msg.startswith(str(p) + ": ") and "\n" not in msg
    assert isinstance(info.value, AutotunerError)
    return msg


def test_truncated_gzip(tmp_path):
    data = NCCL[0].read_bytes()
    msg = _bad(tmp_path, "cut.json.gz", data[: len(data) // 2])
    assert "truncated gzip" in msg


def test_corrupt_gzip(tmp_path):
    data = bytearray(NCCL[0].read_bytes())
    data[100:140] = b"\x00" * 40
    msg = _bad(tmp_path, "corrupt.json.gz", bytes(data))
    assert "gzip" in msg or "JSON" in msg


def test_truncated_plain_json(tmp_path):
    with gzip.open(NCCL[0], "rb") as f:
        data = f.read()
    msg = _bad(tmp_path, "cut.json", data[: len(data) // 3])
    assert "truncated JSON" in msg


def test_not_json(tmp_path):
    msg = _bad(tmp_path, "notes.json", b"this is not json\n")
    assert "not a JSON trace" in msg
    _bad(tmp_path, "empty.json", b"")
    msg = _bad(tmp_path, "garbage.json", b'{"traceEvents": [{"ph": "X",, }]}')
    assert "not valid JSON" in msg


def test_json_without_trace_events(tmp_path):
    msg = _bad(tmp_path, "config.json", json.dumps({"hidden_size": 4096, "num_layers": 2}).encode())
    assert "no 'traceEvents'" in msg and "hidden_size" in msg
    msg = _bad(tmp_path, "wrong.json", json.dumps({"traceEvents": {"a": 1}}).encode())
    assert "not an array" in msg
    msg = _bad(tmp_path, "ints.json", json.dumps({"traceEvents": [1, 2]}).encode())
    assert "traceEvents[0]" in msg


def test_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"traceEvents": [kernel("k", 1.0, 2.0)]}).encode())
    assert len(load_trace(p).gpu_events) == 1


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="cannot open"):
        load_trace(tmp_path / "nope.json")


def test_suffix_does_not_matter(tmp_path):
    p = tmp_path / "trace.json"  # gzip content under a .json name
    shutil.copy(NCCL[0], p)
    assert len(load_trace(p).gpu_events) == 77
