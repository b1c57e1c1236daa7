"""GPU evidence under benchmarks/results read by the tests: each run beside the prediction committed before it."""

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results"


def runs_with_prediction_before(folder: str, predicted: str = "predicted_default.json") -> list[tuple[dict, dict]]:
    """(result row, the prediction written for its layout) of benchmarks/results/FOLDER, after checking that the
    prediction was made before the runs (its `predicted_at` before the batch summary's `date`)."""
    path = RESULTS / folder
    doc = json.loads((path / predicted).read_text())
    assert doc["predicted_at"] < json.loads((path / "summary.json").read_text())["date"], folder
    before = {row["layout_id"]: row["predicted"] for row in doc["layouts"]}
    rows = [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines() if line.strip()]
    return [(row, before[row["layout_id"]]) for row in rows]
