"""The host's blocking waits on the GPU (`trace.host_waits`, `mat trace syncs`): a hand-built trace, the real TP 2
layer trace, and the CLI."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.trace import TraceError, host_waits, load_trace

from .helpers import NCCL, cpu, kernel, write_trace


def _runtime(name: str, ts: float, dur: float, tid: int = 100) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def _trace(tmp_path):
    events = [
        kernel("gemm_a", 1000, 3000),  # 1.0-4.0 ms
        kernel("ncclDevKernel_AllGather", 3500, 1000, stream=9),
        cpu("aten::item", 1900, 2300),
        cpu("aten::_local_scalar_dense", 1950, 2200),
        _runtime("cudaStreamSynchronize", 2000, 2000),  # 2.0-4.0 ms, inside .item()
        _runtime("cudaEventSynchronize", 5000, 200),  # 0.2 ms, no op around it, nothing on the GPU
        _runtime("cudaLaunchKernel", 900, 10),  # not a wait
    ]
    return load_trace(write_trace(tmp_path / "t.json", events))


def test_hand_built_waits(tmp_path):
    trace = _trace(tmp_path)
    assert [s.name for s in trace.host_syncs] == ["cudaStreamSynchronize", "cudaEventSynchronize"]
    waits = host_waits(trace, min_ms=1.0)
    assert waits.calls == 2 and waits.total_ms == pytest.approx(2.2)
    (wait,) = waits.waits
    assert wait.call == "cudaStreamSynchronize" and wait.inside == "aten::_local_scalar_dense"
    assert wait.start_ms == pytest.approx(1.0) and wait.duration_ms == pytest.approx(2.0)
    assert dict(wait.gpu_during_ms) == pytest.approx({"gemm_a": 2.0, "ncclDevKernel_AllGather": 0.5})
    short = host_waits(trace, min_ms=0.0).waits[1]
    assert short.inside is None and short.gpu_during_ms == ()


def test_real_layer_trace_waits_in_device_syncs():
    waits = host_waits(load_trace(NCCL[0]), min_ms=0.0)
    assert waits.calls == len(waits.waits) >= 1
    assert {w.call for w in waits.waits} == {"cudaDeviceSynchronize"}
    for w in waits.waits:  # what ran during a wait ran inside it
        assert sum(ms for _, ms in w.gpu_during_ms) <= w.duration_ms * 3  # at most one kernel per stream at a time


def test_cli_table_and_json(capsys, tmp_path):
    path = str(_trace(tmp_path).path)
    assert main(["trace", "syncs", path, "--min-ms", "1"]) == 0
    assert "cudaStreamSynchronize" in capsys.readouterr().out
    assert main(["trace", "syncs", path, "--min-ms", "0", "--top", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["waits"]) == 2 and len(doc["waits"][0]["gpu_during_ms"]) == 1


def test_cli_bad_input_is_one_line(capsys, tmp_path):
    assert main(["trace", "syncs", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mat: error: ")


def test_a_trace_without_runtime_calls_measures_nothing(tmp_path, capsys):
    """A trace recorded without CUDA activity has no sync calls to show: an error, not an empty answer."""
    path = write_trace(tmp_path / "cpu_only.json", [cpu("aten::mm", 0, 10)])
    with pytest.raises(TraceError, match="no CUDA runtime or driver calls"):
        host_waits(load_trace(path))
    assert main(["trace", "syncs", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA runtime or driver calls" in err[0]
