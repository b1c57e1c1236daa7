"""Each rank trace's forward synchronisation spans (`benchmarks/moe_graphs.forward_segments`: per span, the rank's
issue time and its wait for the other ranks) for every profiled layout of a `mat validate` output folder, as one JSON
file: {layout_id: [rank 0's, rank 1's, ...]}. Run on the GPU machine, so that the raw traces need not travel.

    python benchmarks/validation/forward_spans.py OUTPUT_DIR SPANS.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from moe_graphs import forward_segments  # noqa: E402


def main() -> None:
    out_dir, dest = Path(sys.argv[1]), Path(sys.argv[2])
    spans = {}
    for layout_dir in sorted((out_dir / "traces").iterdir()):
        ranks = sorted(layout_dir.glob("rank_*.json.gz"), key=lambda p: int(p.name.split("_")[1].split(".")[0]))
        if ranks:
            spans[layout_dir.name] = [forward_segments(trace) for trace in ranks]
    dest.write_text(json.dumps(spans, indent=1) + "\n")
    print(f"{len(spans)} layouts -> {dest}")


if __name__ == "__main__":
    main()
