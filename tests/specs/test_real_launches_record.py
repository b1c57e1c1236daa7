"""benchmarks/results/real_launches.json (the table in docs/megatron_launches.md) says what the corpus tests say: the
same launches, and the same ones not predicted (`python benchmarks/real_launches.py` after a change to either)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.rlhf.test_real_verl_launches import VERL_NOT_PREDICTED
from tests.specs.real_launches import fixtures, helpers
from tests.specs.test_real_launches import MEGATRON_NOT_PREDICTED

RECORD = Path(__file__).resolve().parents[2] / "benchmarks/results/real_launches.json"


def test_the_record_holds_the_corpus_and_its_refusals():
    groups = json.loads(RECORD.read_text())["groups"]
    for name, refused in (("megatron", MEGATRON_NOT_PREDICTED), ("verl", VERL_NOT_PREDICTED)):
        rows = groups[name]["rows"]
        assert {r["name"] for r in rows} == {p.name for p in fixtures(name)} - helpers(name)
        assert {r["name"] for r in rows if not r["predicted"]} == set(refused), name
        assert all(r["reason"] and "\n" not in r["reason"] for r in rows if not r["predicted"])
        assert groups[name]["predicted"] == sum(r["predicted"] for r in rows)
