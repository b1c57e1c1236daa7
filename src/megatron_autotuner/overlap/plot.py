"""Timeline plot (PNG) of the best candidate vs the NCCL baseline per GEMM range (matplotlib, lazy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def timeline_png(rows: list[dict[str, Any]], path: str | Path, title: str) -> Path | None:
    """rows: {"slot", "label", "gemm": [(s, e) µs], "comm": [(s, e) µs]}; two lanes per row. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(rows) + 1.5))
    ticks, names = [], []
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        ax.broken_barh([(s / 1e3, (e - s) / 1e3) for s, e in row["gemm"]], (y + 0.05, 0.4), color="tab:blue")
        ax.broken_barh([(s / 1e3, (e - s) / 1e3) for s, e in row["comm"]], (y + 0.5, 0.4), color="tab:orange")
        ticks.append(y + 0.5)
        names.append(f"{row['slot']} {row['label']}")
    ax.set_yticks(ticks)
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("ms from the first kernel of the range (blue: GEMM, orange: communication)")
    ax.set_title(title)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110, metadata={"Title": title})  # the title (e.g. SYNTHETIC) is in the file too
    plt.close(fig)
    return p
