"""The launcher and worker run for real on CPU (gloo, megatron-core local spec): resume and failures.

Only ops megatron-core can run without CUDA are used (attention and MoE need CUDA kernels).
"""

import json

import pytest

from megatron_autotuner.specs import ModelSpec
from megatron_autotuner.testbench.cases import expand_cases
from megatron_autotuner.testbench.results import LAUNCHER_FILE, all_records, read_records
from megatron_autotuner.testbench.summary import summary_rows
from tests.proc_helpers import processes_mentioning

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.mcore


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "tiny.json"
    ModelSpec(
        name="tiny",
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=128,
        vocab_size=256,
        max_position_embeddings=128,
    ).save_json(path)
    return str(path)


def test_cpu_run_resume_and_hung_case(tiny, tmp_path, monkeypatch):
    from megatron_autotuner.testbench import launcher

    cases, _ = expand_cases(
        [tiny],
        ["mlp", "lm_head", "column_linear", "row_linear", "norm"],
        [64],
        tps=[1, 2],
        sequence_parallel=False,
        use_te=False,
    )
    out = tmp_path / "run"
    run = launcher.run_cases(cases, out, device="cpu", warmup=1, repeats=2, case_timeout_s=120, progress=False)
    assert run.ran == len(cases) and not run.failed_by_launcher
    rows = summary_rows(all_records(out))
    assert len(rows) == len(cases) and all(r["status"] == "ok" for r in rows)
    rec = read_records(out / "collect" / "rank_1.jsonl")[0]
    assert rec["rank"] == 1 and rec["real"]["fwd_bwd_ms"]["n"] == 2
    # real parameter bytes equal theory's (fp32 on CPU: 4 bytes, theory counts bf16: 2)
    assert all(r["ratio"]["weight_bytes"] == 2.0 for r in read_records(out / "collect" / "rank_0.jsonl"))
    # restart: nothing left to do
    again = launcher.run_cases(cases, out, device="cpu", progress=False)
    assert again.ran == 0 and again.skipped_finished == len(cases)

    # a case that hangs is killed after its timeout, recorded as failed, and the rest still run
    hang_cases, _ = expand_cases([tiny], ["norm", "mlp"], [32], use_te=False)
    monkeypatch.setenv("MAT_TESTBENCH_HANG_OP", "norm")
    out2 = tmp_path / "hang"
    # the timeout counts from the case's start: the job's start-up has its own allowance. 15 s: the tiny mlp case
    # takes about 1 s alone, and passed 5 s on a 2-core machine busy with a parallel test run
    run2 = launcher.run_cases(hang_cases, out2, device="cpu", warmup=1, repeats=1, case_timeout_s=15, progress=False)
    failures = read_records(out2 / "collect" / LAUNCHER_FILE)
    assert [f["case"]["op"] for f in failures] == ["norm"] and "timed out" in failures[0]["error"]
    ok = [r for r in read_records(out2 / "collect" / "rank_0.jsonl") if r["status"] == "ok"]
    assert [r["case"]["op"] for r in ok] == ["mlp"]
    assert run2.failed_by_launcher == [failures[0]["case_id"]]
    assert processes_mentioning(str(out2)) == []  # the hung rank was killed with its torchrun
    json.dumps(summary_rows(all_records(out2)))
