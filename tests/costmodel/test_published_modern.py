"""benchmarks/results/published_modern.json is what benchmarks/published_modern.py produces now: the modern
published runs written as Megatron-LM flags and imported as `mat estimate --megatron-args` does. Regenerate it
(`python benchmarks/published_modern.py`) whenever the cost model or the importer changes a prediction. No accuracy
target is asserted here: the JSON records the errors."""

import hashlib
import json
import math
import statistics
from pathlib import Path

import pytest

from megatron_autotuner.specs.megatron_args import catalog, read_launch
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/published_modern.py"
RESULT = ROOT / "benchmarks/results/published_modern.json"
REL = 1e-6
PREDICTED = ("predicted_tokens_per_s_per_gpu", "predicted_tflops_per_gpu", "predicted_step_time_s",
             "predicted_peak_memory_gib", "error", "tflops_error")  # fmt: skip


def _load_script():
    return load_script("published_modern")


@pytest.fixture(scope="module")
def script():
    return _load_script()


@pytest.fixture(scope="module")
def committed():
    return json.loads(RESULT.read_text())


@pytest.fixture(scope="module")
def fresh(script):
    return script.compare_all(script.CSV_PATH)


def _close(a, b):
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def test_header(committed, script):
    from megatron_autotuner import SCHEMA_VERSION

    assert committed["schema_version"] == SCHEMA_VERSION
    assert committed["tool_version"]
    assert committed["date"]
    digest = hashlib.sha256(script.CSV_PATH.read_bytes()).hexdigest()
    assert committed["inputs"]["csv_sha256"] == digest, "the CSV changed: regenerate the JSON"


def test_committed_json_is_what_the_script_produces_now(committed, fresh):
    records = committed["records"]
    assert len(records) == len(fresh) == 159
    for old, new in zip(records, fresh, strict=True):
        where = f"row {new['index']} {new['model']} ({new['gpu']} x{new['num_gpus']})"
        for key in ("index", "model", "gpu", "num_gpus", "kind", "layout", "precision", "flops_convention"):
            assert old[key] == new[key], f"{where}: {key}"
        assert old["flags"] == new["flags"], f"{where}: flags changed, regenerate the JSON"
        assert old["expressible"] == new["expressible"], f"{where}: expressible {old['reason']!r} -> {new['reason']!r}"
        assert old["reason"] == new["reason"], where
        assert old["not_modelled"] == new["not_modelled"], where
        assert old["fits"] == new["fits"], where
        for key in PREDICTED:
            assert _close(old[key], new[key]), f"{where}: {key} {old[key]} -> {new[key]} (regenerate the JSON)"


def test_expressible_rows_are_real_megatron_lm_flags(committed):
    by_flag = catalog()[1]
    expressible = [r for r in committed["records"] if r["expressible"]]
    assert expressible
    for record in expressible:
        launch = read_launch(record["flags"])  # raises ConfigError for a flag Megatron-LM does not have
        for token in record["flags"].split():
            if token.startswith("--"):
                assert token in by_flag, f"row {record['index']}: {token}"
        assert launch.gave("num_layers") and launch.gave("seq_length"), record["index"]
        assert record["predicted_tokens_per_s_per_gpu"] > 0
        assert record["published_tokens_per_s_per_gpu"] > 0
        expected = record["predicted_tokens_per_s_per_gpu"] / record["published_tokens_per_s_per_gpu"] - 1
        assert _close(record["error"], expected)


def test_rows_that_are_not_expressible_say_why(committed):
    for record in committed["records"]:
        if not record["expressible"]:
            assert record["reason"] and "\n" not in record["reason"], record["index"]
            assert record["predicted_tokens_per_s_per_gpu"] is None and record["error"] is None
        else:
            assert record["reason"] is None


def _group(records):
    done = [r for r in records if r["expressible"]]
    errors = sorted(abs(r["error"]) for r in done)
    return {
        "rows": len(records),
        "expressible": len(done),
        "expressible_fraction": len(done) / len(records) if records else None,
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": errors[-1] if errors else None,
    }


def _assert_group(got, want, where):
    assert got.keys() == want.keys(), where
    for key, value in want.items():
        assert _close(got[key], value) if isinstance(value, float) else got[key] == value, f"{where}: {key}"


def test_summary_is_computed_from_the_records(committed):
    records, summary = committed["records"], committed["summary"]
    _assert_group({k: summary[k] for k in _group(records)}, _group(records), "all")
    assert summary["rows"] == len(records) == sum(g["rows"] for g in summary["by_gpu"].values())
    for gpu, got in summary["by_gpu"].items():
        _assert_group(got, _group([r for r in records if r["gpu"] == gpu]), gpu)
    assert set(summary["by_kind"]) == {"dense", "moe"}
    for kind, got in summary["by_kind"].items():
        _assert_group(got, _group([r for r in records if r["kind"] == kind]), kind)
    done = [r for r in records if r["expressible"]]
    _assert_group(summary["by_not_modelled"]["none"], _group([r for r in done if not r["not_modelled"]]), "none")
    _assert_group(summary["by_not_modelled"]["some"], _group([r for r in done if r["not_modelled"]]), "some")
    assert summary["by_not_modelled"]["none"]["rows"] + summary["by_not_modelled"]["some"]["rows"] == len(done)


def test_moe_rows_signed_median_per_gpu_group(committed):
    """#40's bar on the MoE rows, per GPU group of 5+ expressible rows: the signed median error within +-5%. Met on
    H100 (-4.3%) and GB200 (-2.9%) since every row is priced with its source's dropout (0: `source_dropout`), where
    Megatron-LM's 0.1 had made them -5.1% and -6.8%; not met on B200 (+7.5%, was +2.2%). Its eight dgxc Grok-1 rows
    (tp 4 = etp 4) are read as dgxc's NeMo-1 recipe ran them (grok1_314b.yaml through configure.sh: padded to capacity
    1.0, one GEMM per expert, no permute fusion; `DGXC_NEMO1_GROK_FLAGS`). They came 4-29% under: the unfused padded
    block's host floor, measured on today's megatron-core, paces them (fused, they would be 15-27% over), so the old
    stack's permute is the unknown; each carries a not-modelled flag (one GEMM per expert). The other bar, median
    |error| <= 10% over the MoE rows, is not met (19.2%, `summary.by_kind.moe`)."""
    records, summary = committed["records"], committed["summary"]
    for gpu, got in summary["moe_by_gpu"].items():
        errors = [r["error"] for r in records if r["kind"] == "moe" and r["gpu"] == gpu and r["expressible"]]
        assert got["expressible"] == len(errors) >= 5, gpu
        assert _close(got["median_error"], statistics.median(errors)), gpu
        assert _close(got["median_abs_error"], statistics.median(abs(e) for e in errors)), gpu
        if gpu == "B200":
            assert 0.05 < got["median_error"] < 0.10, gpu
        else:
            assert abs(got["median_error"]) <= 0.05, gpu
    grok_h100 = [r for r in records if r["model"].startswith("Grok 1") and r["gpu"] == "H100"]
    assert len(grok_h100) == 8 and all(-0.30 < r["error"] < -0.04 for r in grok_h100)
    for r in grok_h100:
        flags = r["flags"]
        assert "--moe-pad-expert-input-to-capacity" in flags and "--hidden-dropout 0 " in flags
        assert "--moe-grouped-gemm" not in flags and "--moe-permute-fusion" not in flags
        assert r["not_modelled"] == ["--moe-grouped-gemm off: one GEMM per expert (predicted as grouped GEMMs)"]


def test_rows_carry_their_sources_dropout(committed):
    """The rows' configs set dropout, which the CSV does not carry: 0 in every Megatron-Bridge, NeMo 2 and NeMo 1
    model config the rows ran, but NeMo 1's GPT-3 175B yaml (0.1; `source_dropout`). Megatron-LM's default (0.1)
    would price a cuDNN attention 2.6x slower forward: the importer's note that it was assumed never appears."""
    done = [r for r in committed["records"] if r["expressible"]]
    for r in done:
        want = "0.1" if "nemo_megatron/README_175b.md" in r["source"] else "0"
        assert f"--hidden-dropout {want} \\" in r["flags"] and f"--attention-dropout {want} \\" in r["flags"]
        assert not any("dropout" in note for note in r["importer_notes"]), r["index"]
    assert sum("--attention-dropout 0.1" in r["flags"] for r in done) == 6


def test_script_cli_writes_the_report(tmp_path, script, capsys):
    out = tmp_path / "report.json"
    assert script.main(["--output", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed
    assert printed["summary"]["rows"] == 159


def test_a_row_without_a_shape_is_read_with_the_tools_preset_of_its_model(committed, script):
    """NeMo's published Mixtral-8x7B rows give no shape; the tool ships Mixtral-8x7B (its HF config), so they are read
    with it, said as an assumption. Rows of models the tool does not ship stay inexpressible."""
    import csv

    with open(script.CSV_PATH, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    mixtral = [r for r in committed["records"] if r["model"] == "Mixtral-8x7B"]
    assert len(mixtral) == 2 and all(r["expressible"] for r in mixtral)
    for r in mixtral:
        assert "--num-layers 32 \\\n--hidden-size 4096" in r["flags"] and "--num-experts 8" in r["flags"]
        assert any("the tool's Mixtral-8x7B preset" in a for a in r["assumptions"])
    unknown = next(r for r in rows if r["model"] == "Nemotron_3_Super")
    assert script.with_preset_shape(unknown) is None
    assert script.row_launch(unknown)[2] == "no model shape in the source"
