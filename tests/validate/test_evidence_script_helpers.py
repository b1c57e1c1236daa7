"""The shell helpers the GPU evidence scripts share (benchmarks/validation/common.sh), run for real on CPU:
a script sources common.sh, runs a layouts file with `validate_batch` (megatron-core on gloo, --device cpu),
gathers it with `collect_batch` and ends with `finish`; the evidence folder then holds what the CPU tests of
committed evidence read."""

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from megatron_autotuner.specs import ModelSpec

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.mcore

ROOT = Path(__file__).resolve().parents[2]


def test_validate_batch_collect_batch_finish(tmp_path, fake_gpu_env):
    model = tmp_path / "tiny.json"
    ModelSpec(name="tiny", hidden_size=64, num_layers=2, num_attention_heads=4, num_query_groups=2,
              ffn_hidden_size=128, vocab_size=256, max_position_embeddings=128).save_json(model)  # fmt: skip
    layouts = {
        "gpu": "H200",
        "layouts": [
            {"model": str(model), "seq_length": 32, "global_batch_size": 2, "warmup_steps": 1, "steps": 2,
             "use_te": False, "name": "tiny"},
        ],
    }  # fmt: skip
    (tmp_path / "layouts.json").write_text(json.dumps(layouts))
    script = tmp_path / "script.sh"
    script.write_text(
        f'OUT="{tmp_path}/out"\nsource "{ROOT}/benchmarks/validation/common.sh"\n'
        'echo "env: $MAT_TEST_ENV_SOURCED"\n'
        "record_gpus\n"
        'validate_batch "$HERE/layouts.json" run 120 --device cpu\n'
        'collect_batch run "$OUT/evidence"\n'
        'copy_memory_histories run "$OUT/evidence"\n'
        'finish "$OUT/evidence"\n'
    )
    env = fake_gpu_env | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "env: 1" in done.stdout and "wall time:" in done.stdout
    ev = tmp_path / "out" / "evidence"
    assert (ev / "gpus.txt").read_text().strip() == "Fake GPU, 1 MiB"
    assert "tiny" in (ev / "run.log").read_text()
    summary = json.loads((ev / "summary.json").read_text())
    assert [r["status"] for r in summary["rows"]] == ["ok"]
    assert (ev / "results.jsonl").exists() and (ev / "layouts.json").exists()
    assert (ev / "runs" / "rank_0.jsonl").exists()
    assert not (ev / "memory").exists()  # no layout recorded a history
    with tarfile.open(tmp_path / "out" / "evidence.tgz") as packed:
        assert "evidence/runs/rank_0.jsonl" in packed.getnames()


def test_h200_single_layer_parts_run_their_plumbing_on_cpu(tmp_path, fake_gpu_env):
    """`h200_x1_host_probe.sh issue` on CPU: `mat profile` refuses without a GPU (rc 1 in the log, nothing measured),
    and the part still leaves its log and a packed evidence folder where the lease's copy step looks."""
    env = fake_gpu_env | {"OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs")}
    script = ROOT / "benchmarks/validation/h200_x1_host_probe.sh"
    done = subprocess.run(["bash", str(script), "issue"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "out" / "issue_order" / "issue.log").read_text()
    assert "testbench rc=1" in log and "profile rc=1" in log
    assert (tmp_path / "out" / "issue_order" / "testbench").is_dir()
    with tarfile.open(tmp_path / "out" / "issue_order.tgz") as packed:
        assert "issue_order/issue.log" in packed.getnames()


def test_copy_host_floor_keeps_every_rounds_records(tmp_path, fake_gpu_env):
    """`--measure-host-floor` times each MoE case in `HOST_FLOOR_ROUNDS` processes, the first round's records in
    host_floor/collect and the later ones' in host_floor/roundN/collect: the evidence keeps them all."""
    hf = tmp_path / "out" / "run" / "host_floor"
    for sub in ("collect", "round2/collect", "round3/collect"):
        (hf / sub).mkdir(parents=True)
        (hf / sub / "rank_0.jsonl").write_text(f'{{"round": "{sub}"}}\n')
    (hf / "host_floor.calibration.json").write_text("{}\n")
    (hf / "cases.json").write_text("[]\n")
    script = tmp_path / "script.sh"
    script.write_text(
        f'OUT="{tmp_path}/out"\nsource "{ROOT}/benchmarks/validation/common.sh"\ncopy_host_floor run "$OUT/evidence"\n'
    )
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=fake_gpu_env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    ev = tmp_path / "out" / "evidence" / "host_floor"
    for sub in ("collect", "round2/collect", "round3/collect"):
        assert (ev / sub / "rank_0.jsonl").read_text() == f'{{"round": "{sub}"}}\n'
    assert (ev / "host_floor.calibration.json").exists() and (ev / "cases.json").exists()


def test_copy_rank_traces_keeps_every_ranks_trace_flat(tmp_path, fake_gpu_env):
    """Both ranks' raw traces of every profiled layout, named LAYOUT.rank_R.json.gz (what benchmarks/moe_graphs.py and
    rank_pace.py read); a run that profiled nothing leaves an empty folder."""
    traces = tmp_path / "out" / "run" / "traces"
    for layout in ("a.g2", "b.g2"):
        (traces / layout).mkdir(parents=True)
        for rank in (0, 1):
            (traces / layout / f"rank_{rank}.json.gz").write_bytes(f"{layout}/{rank}".encode())
    script = tmp_path / "script.sh"
    script.write_text(
        f'OUT="{tmp_path}/out"\nsource "{ROOT}/benchmarks/validation/common.sh"\n'
        'copy_rank_traces run "$OUT/raw"\ncopy_rank_traces none "$OUT/empty"\n'
    )
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=fake_gpu_env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    raw = tmp_path / "out" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == [f"{x}.g2.rank_{r}.json.gz" for x in "ab" for r in (0, 1)]
    assert (raw / "b.g2.rank_1.json.gz").read_bytes() == b"b.g2/1"
    assert list((tmp_path / "out" / "empty").iterdir()) == []
