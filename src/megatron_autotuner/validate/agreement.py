"""Rank agreement: does the cost model order layouts as the real runs do?

Layouts are compared within a group of the same model (and layer count), sequence length, global
batch, mode and precision, by throughput per GPU (tokens/s/GPU), so layouts on different GPU
counts compare fairly. Per group: Spearman's rank correlation of predicted vs measured throughput,
and the gap between the measured best and the measured throughput of the predicted best
(`predicted best is measured best, or within 3%`).
"""

from __future__ import annotations

from typing import Any

BEST_TOLERANCE = 0.03


def average_ranks(values: list[float]) -> list[float]:
    """1-based ranks (ascending), ties get the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho (Pearson correlation of average ranks); None with < 2 points or no spread."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    rx, ry = average_ranks(xs), average_ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / (vx * vy) ** 0.5


def group_key(layout: dict[str, Any]) -> str:
    gbs = layout.get("global_batch_size") or "mbs*dp"
    layers = layout.get("num_layers") or "full"
    return (
        f"{layout['model']} L{layers} s{layout['seq_length']} gbs{gbs} {layout.get('mode', 'train')} "
        f"{layout.get('precision', 'bf16')}"
    )


def rank_agreement(rows: list[dict[str, Any]], tolerance: float = BEST_TOLERANCE) -> list[dict[str, Any]]:
    """One entry per group with >= 2 layouts that ran and have a prediction."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        m, p = row.get("measured") or {}, row.get("predicted") or {}
        if row.get("status") != "ok" or not m.get("tokens_per_s_per_gpu") or not p.get("tokens_per_s_per_gpu"):
            continue
        if m.get("memory_history"):  # steps slowed by recording the allocator's history
            continue
        groups.setdefault(group_key(row["layout"]), []).append(row)
    out = []
    for key, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        measured = [r["measured"]["tokens_per_s_per_gpu"] for r in members]
        predicted = [r["predicted"]["tokens_per_s_per_gpu"] for r in members]
        best_measured = max(range(len(members)), key=lambda i: measured[i])
        best_predicted = max(range(len(members)), key=lambda i: predicted[i])
        gap = 1.0 - measured[best_predicted] / measured[best_measured]
        out.append(
            {
                "group": key,
                "n": len(members),
                "spearman": spearman(predicted, measured),
                "measured_best": members[best_measured]["layout_id"],
                "measured_best_label": members[best_measured].get("label"),
                "predicted_best": members[best_predicted]["layout_id"],
                "predicted_best_label": members[best_predicted].get("label"),
                "predicted_best_gap": gap,
                "predicted_best_ok": gap <= tolerance,
            }
        )
    return out
