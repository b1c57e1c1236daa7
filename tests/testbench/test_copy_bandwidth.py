"""Host <-> device copy bandwidth: sizes, bounds, the calibration table and `Calibration.host_copy_gbps`."""

from __future__ import annotations

import json
import math

import pytest

from megatron_autotuner.costmodel.calibration import calibration_from_dict, load_calibration
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.testbench.copy_bandwidth import (
    GIB,
    MIB,
    copy_sizes,
    host_copy_table,
    interfering_launches,
    max_copy_bytes,
)


def test_sizes_from_one_mib_by_four():
    assert copy_sizes(16 * GIB) == [MIB * 4**k for k in range(8)]
    assert copy_sizes(20 * GIB)[-2:] == [16 * GIB, 20 * GIB]
    assert copy_sizes(MIB // 2) == []


def test_largest_copy_is_bounded_by_host_and_device_memory():
    assert max_copy_bytes(32 * GIB, host_available_bytes=100 * GIB, device_free_bytes=70 * GIB) == 20 * GIB
    assert max_copy_bytes(32 * GIB, 1000 * GIB, 10 * GIB) == 4 * GIB
    assert max_copy_bytes(8 * GIB, 1000 * GIB, 1000 * GIB) == 8 * GIB


def test_interfering_work_outlasts_the_copy():
    n = interfering_launches(copy_s=0.1, launch_s=0.001)
    assert n * 0.001 >= 2 * 0.1
    assert interfering_launches(0.0, 0.001) == 2


def _calibration(rows):
    return calibration_from_dict(
        {"schema_version": 1, "kind": "megatron-autotuner-calibration", "gpu": "H100-SXM", "ops": [], "host_copy": rows}
    )


ROWS = [
    {"direction": "h2d", "pinned": True, "nbytes": MIB, "gbps": 10.0},
    {"direction": "h2d", "pinned": True, "nbytes": 4 * MIB, "gbps": 30.0},
    {"direction": "h2d", "pinned": True, "nbytes": 4 * MIB, "gbps": 34.0, "interference": "hbm_d2d"},
    {"direction": "d2h", "pinned": False, "nbytes": GIB, "gbps": 8.0},
]


def test_host_copy_gbps_interpolates_in_log_size_and_says_none_when_unmeasured():
    cal = _calibration(ROWS)
    assert cal.host_copy_gbps("h2d", True, MIB) == pytest.approx(10.0)
    assert cal.host_copy_gbps("h2d", True, 2 * MIB) == pytest.approx(20.0)  # halfway in log size
    assert cal.host_copy_gbps("h2d", True, 1024) == pytest.approx(10.0)  # clamped below
    assert cal.host_copy_gbps("h2d", True, GIB) == pytest.approx(30.0)  # clamped above
    assert cal.host_copy_gbps("h2d", True, 4 * MIB, interference="hbm_d2d") == pytest.approx(34.0)
    assert cal.host_copy_gbps("d2h", False, 3 * GIB) == pytest.approx(8.0)
    assert cal.host_copy_gbps("d2h", True, GIB) is None
    assert cal.host_copy_gbps("h2d", False, GIB) is None
    assert _calibration([]).host_copy_gbps("h2d", True, MIB) is None
    with pytest.raises(ConfigError):
        cal.host_copy_gbps("up", True, MIB)


@pytest.mark.parametrize(
    "bad",
    [
        {"direction": "sideways", "pinned": True, "nbytes": MIB, "gbps": 1.0},
        {"direction": "h2d", "pinned": "yes", "nbytes": MIB, "gbps": 1.0},
        {"direction": "h2d", "pinned": True, "nbytes": 0, "gbps": 1.0},
        {"direction": "h2d", "pinned": True, "nbytes": MIB, "gbps": -1.0},
        {"direction": "h2d", "pinned": True, "nbytes": MIB, "gbps": 1.0, "interference": "loud"},
    ],
)
def test_bad_host_copy_rows_are_config_errors(bad):
    with pytest.raises(ConfigError, match="host_copy"):
        _calibration([bad])


def _summary():
    rows = [
        {
            "direction": "h2d",
            "pinned": True,
            "nbytes": MIB,
            "interference": "none",
            "interference_detail": {},
            "time_ms": {"median": 0.05, "min": 0.05, "max": 0.06, "n": 3},
            "gbps": MIB / 0.05e-3 / 1e9,
        }
    ]
    env = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-01-01T00:00:00+00:00", "torch": "x"}
    return {"env": env, "world_size": 1, "host_copy": host_copy_table(rows), "interferences_not_run": {}}


def test_host_copy_calibration_new_file_and_merge(tmp_path):
    from megatron_autotuner.testbench.calibration import write_host_copy_calibration

    path = tmp_path / "cal.json"
    write_host_copy_calibration(_summary(), path)
    cal = load_calibration(path)
    assert cal.gpu == "H100-SXM"
    assert math.isclose(cal.host_copy_gbps("h2d", True, MIB), MIB / 0.05e-3 / 1e9)
    # merging keeps the file's other tables
    data = json.loads(path.read_text())
    data["ops"] = [{"op": "gemm", "phase": "fwd", "flops": 1e12, "time_ms": 2.0}]
    path.write_text(json.dumps(data))
    write_host_copy_calibration(_summary(), path)
    merged = load_calibration(path)
    assert len(merged.ops) == 1 and len(merged.host_copies) == 1
    data["gpu"] = "H200"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="H200"):
        write_host_copy_calibration(_summary(), path)


def test_profile_copy_mode_dry_run_and_bad_interference(capsys):
    from megatron_autotuner.cli import main

    assert main(["profile", "--mode", "copy-bandwidth", "--dry-run", "--json", "--max-copy-gib", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sizes_up_to_cap"][-1] == GIB
    assert main(["profile", "--mode", "copy-bandwidth", "--dry-run", "--copy-interference", "loud"]) == 2


@pytest.mark.gpu
def test_copy_bandwidth_on_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from megatron_autotuner.testbench.copy_bandwidth import main

    assert (
        main(["--out-dir", str(tmp_path), "--max-gib", "0.0625", "--repeats", "2", "--interference", "none,hbm_d2d"])
        == 0
    )
    summary = json.loads((tmp_path / "copy_bandwidth" / "summary.json").read_text())
    kinds = {(r["direction"], r["pinned"], r["interference"]) for r in summary["host_copy"]}
    assert len(kinds) == 8
    assert all(r["gbps"] > 0 for r in summary["host_copy"])
    assert "nccl_allreduce" not in summary["interferences"]


def test_interferences_runnable_per_gpu_count():
    from megatron_autotuner.testbench.copy_bandwidth import runnable_interferences

    every = ["hbm_d2d", "nccl_allreduce", "nccl_loopback", "gemm"]
    assert runnable_interferences(every, 1) == ["none", "hbm_d2d", "nccl_loopback", "gemm"]
    assert runnable_interferences(every, 2) == ["none", "hbm_d2d", "nccl_allreduce", "gemm"]
    assert runnable_interferences(["gemm", "none"], 1) == ["none", "gemm"]


@pytest.mark.gpu
def test_copy_bandwidth_beside_nccl_loopback_and_gemm(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from megatron_autotuner.testbench.copy_bandwidth import main

    args = ["--out-dir", str(tmp_path), "--max-gib", "0.0625", "--repeats", "2"]
    assert main([*args, "--interference", "none,nccl_loopback,gemm"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "copy_bandwidth" / "rank_0.jsonl").read_text().splitlines()]
    loopback = [r for r in rows if r["interference"] == "nccl_loopback"]
    assert loopback and all(r["gbps"] > 0 for r in loopback)
    # the loop-back traffic is an NCCL kernel, not a copy-engine memcpy
    assert any("nccl" in k.lower() for k in loopback[0]["interference_detail"]["kernels"])
    assert all(r["interference_detail"]["launches"] >= 2 for r in rows if r["interference"] == "gemm")
