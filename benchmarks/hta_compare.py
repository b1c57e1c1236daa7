"""Side by side with Holistic Trace Analysis (PyPI `HolisticTraceAnalysis`, import `hta`) on the shipped traces.

Usage: python benchmarks/hta_compare.py [--out benchmarks/results/hta_comparison.json]

HTA's `get_comm_comp_overlap` reports, per rank, 100 * |comm ∩ compute| / |comm| where a kernel
is communication when its name matches `^nccl.*Kernel`, memory when it starts with Memcpy /
Memset, and computation otherwise. Our `comm_overlap_fraction` is the same ratio with our
classification. On the NCCL traces the two classifications agree, so the numbers must match
(HTA rounds timestamps to whole microseconds, hence tiny differences). On the TE userbuffers
traces HTA finds no communication at all (no NCCL kernel: its ratio is NaN) and counts
`kuserbuffers_*` / `userbuffers_*` kernels as computation, while we count them and the
`Memcpy PtoP` peer copies as communication.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "fixtures" / "traces"
SETUPS = {
    "tp2_nccl": [TRACES / f"h200_te_layer_tp2_nccl_rank{r}.json.gz" for r in (0, 1)],
    "tp2_userbuffers": [TRACES / f"h200_te_layer_tp2_userbuffers_rank{r}.json.gz" for r in (0, 1)],
}


def hta_overlap_pct(paths: list[Path]) -> dict[int, float]:
    """HTA's comm/comp overlap percentage per rank (NaN when HTA finds no communication)."""
    import warnings

    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory(prefix="hta_") as tmp:
        for p in paths:
            shutil.copy(p, tmp)
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = TraceAnalysis(trace_dir=tmp)
            df = analysis.get_comm_comp_overlap(visualize=False)
    logging.disable(logging.NOTSET)
    return {int(r): float(v) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"], strict=True)}


def ours(paths: list[Path]) -> dict[int, dict]:
    sys.path.insert(0, str(ROOT / "src"))
    from megatron_autotuner.trace import Classifier, Rule, load_trace, overlap

    # HTA's rule expressed as ours: only NCCL kernels are communication, Memcpy/Memset neither.
    hta_like = Classifier(
        rules=[
            Rule(r"^nccl.*Kernel", "comm", "nccl", "HTA: ^nccl.*Kernel"),
            Rule(r"^(?:Memcpy|Memset)", "memcpy", None, "HTA: memory"),
            Rule(r"", "other", None, "HTA: everything else is computation"),
        ]
    )
    out = {}
    for p in paths:
        t = load_trace(p)
        s = overlap(t)
        h = overlap(t, classifier=hta_like)
        out[t.rank] = {
            "path": str(p.relative_to(ROOT)),
            "comm_us": s.comm_us,
            "compute_us": s.compute_us,
            "overlap_us": s.overlap_us,
            "comm_overlap_pct": 100 * s.comm_overlap_fraction,
            "overlap_ratio": s.overlap_ratio,
            "comm_by_library_us": {b.name: b.comm_us for b in s.by_library},
            "with_hta_classification": {
                "comm_us": h.comm_us,
                "compute_us": h.compute_us,
                "comm_overlap_pct": 100 * h.comm_overlap_fraction if h.comm_us > 0 else None,
            },
        }
    return out


def compare() -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    from importlib.metadata import version

    from megatron_autotuner import SCHEMA_VERSION, __version__

    setups = {}
    for name, paths in SETUPS.items():
        hta = hta_overlap_pct(paths)
        mine = ours(paths)
        ranks = {}
        for rank, row in mine.items():
            h = hta.get(rank, math.nan)
            ranks[str(rank)] = {
                **row,
                "hta_comm_overlap_pct": None if math.isnan(h) else h,
                "relative_difference": None if math.isnan(h) else abs(row["comm_overlap_pct"] - h) / h,
            }
        setups[name] = ranks
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "hta_version": version("HolisticTraceAnalysis"),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "definition": "comm_overlap_pct = 100 * |comm ∩ compute| / |comm| (HTA's comp_comm_overlap_pctg)",
        "setups": setups,
        "userbuffers_difference": (
            "HTA counts only ^nccl.*Kernel as communication: the userbuffers traces have none, so HTA's ratio is "
            "NaN and the kuserbuffers_*/userbuffers_* kernels count as computation. We classify them (and Memcpy "
            "PtoP peer copies) as communication; with HTA's rule our code also finds 0 us of communication."
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hta_comparison.json"))
    args = parser.parse_args()
    try:
        import hta  # noqa: F401
    except ImportError:
        print("hta is not installed: pip install --no-deps HolisticTraceAnalysis pandas plotly", file=sys.stderr)
        return 1
    result = compare()
    for name, ranks in result["setups"].items():
        for rank, row in ranks.items():
            hta_pct = row["hta_comm_overlap_pct"]
            print(
                f"{name} rank {rank}: ours {row['comm_overlap_pct']:.2f}%  "
                f"HTA {'NaN' if hta_pct is None else f'{hta_pct:.2f}%'}  "
                f"comm by library {', '.join(f'{k} {v:.0f} us' for k, v in row['comm_by_library_us'].items())}"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
