"""Text tables of a validation: measured vs predicted side by side."""

from __future__ import annotations

from typing import Any

from .predict import predicted_reserved_gib


def _f(value: Any, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def format_rows(rows: list[dict[str, Any]]) -> str:
    header = (
        "layout",
        "status",
        "step ms meas",
        "pred",
        "err",
        "mem GiB meas",
        "pred",
        "err",
        "MFU meas",
        "pred",
        "tok/s/GPU",
    )
    lines = [header]
    for r in rows:
        m, p, e = r.get("measured") or {}, r.get("predicted") or {}, r.get("error_rel") or {}
        status = r["status"] if r["status"] != "failed" else f"failed:{r.get('failure_kind')}"
        if p.get("fits") is False:
            status += " (pred OOM)"
        mem = (m.get("peak_gib"), p.get("peak_memory_gib"), e.get("peak_memory"))
        if r.get("stand_in"):
            # memory stand-ins: the allocator's reservation (no NCCL buffers, no real step time)
            status += " (stand-in: reserved)"
            mem = (m.get("max_reserved_gib"), predicted_reserved_gib(p), e.get("reserved_memory"))
        lines.append((
            r["label"], status,
            _f(m.get("step_time_s"), ".1f", 1e3), _f(p.get("step_time_s"), ".1f", 1e3), _pct(e.get("step_time")),
            _f(mem[0], ".2f"), _f(mem[1], ".2f"), _pct(mem[2]),
            _f(m.get("mfu"), ".3f"), _f(p.get("mfu"), ".3f"), _f(m.get("tokens_per_s_per_gpu"), ".0f"),
        ))  # fmt: skip
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    errors = [f"  {r['label']}: {r.get('error')}" for r in rows if r["status"] == "failed"]
    notes = [
        f"  {r['label']}: prediction unavailable: {r['predicted']['error']}"
        for r in rows
        if (r.get("predicted") or {}).get("error")
    ]
    out = "\n".join(text)
    if errors:
        out += "\nfailures:\n" + "\n".join(errors)
    if notes:
        out += "\n" + "\n".join(notes)
    return out


def format_agreement(agreement: list[dict[str, Any]]) -> str:
    if not agreement:
        return "rank agreement: fewer than 2 comparable layouts per group"
    lines = ["rank agreement (tokens/s/GPU):"]
    for a in agreement:
        rho = "-" if a["spearman"] is None else f"{a['spearman']:+.2f}"
        verdict = "ok" if a["predicted_best_ok"] else "MISSED"
        lines.append(
            f"  {a['group']}: n={a['n']} spearman={rho}; predicted best '{a['predicted_best_label']}', "
            f"measured best '{a['measured_best_label']}', gap {100 * a['predicted_best_gap']:.1f}% [{verdict}]"
        )
    return "\n".join(lines)


def format_report(report: Any) -> str:
    t = report.summary["targets"]
    tail = (
        f"targets: step time within 10% {t['step_time_within_10pct']}/{t['step_time_compared']}, "
        f"peak memory within 5% {t['peak_memory_within_5pct']}/{t['peak_memory_compared']} "
        f"(allocator's max allocated {t.get('allocated_memory_within_5pct', '-')}/"
        f"{t.get('allocated_memory_compared', '-')}), "
        f"OOM as predicted {t['oom_as_predicted']}/{t['oom_compared']}, "
        f"predicted best within 3% {t['predicted_best_within_3pct']}/{t['groups']}"
    )
    if t.get("stand_in_reserved_memory_compared"):
        tail += (
            f"; stand-ins: reserved memory within 5% {t['stand_in_reserved_memory_within_5pct']}/"
            f"{t['stand_in_reserved_memory_compared']}"
        )
    rows = list(report.rows)
    parts = [format_rows(rows), *format_waits(rows), format_agreement(list(report.agreement)), tail]
    return "\n".join([*parts, f"results: {report.out_dir}"])


def format_waits(rows: list[dict[str, Any]]) -> list[str]:
    """One line per profiled multi-rank layout: the rank that waited longest for the others in its profiled step, in
    all and at which collective (`results.rank_collective_waits`)."""
    lines = []
    for row in rows:
        waits = row.get("collective_waits")
        if not waits:
            continue
        ranks = len(waits[0]["wait_sum_us"])
        totals = [sum(w["wait_sum_us"][r] for w in waits) for r in range(ranks)]
        rank = max(range(ranks), key=totals.__getitem__)
        worst = max(waits, key=lambda w: w["wait_sum_us"][rank])
        label = row.get("label") or row["layout_id"]
        lines.append(
            f"waits (profiled step): {label}: rank {rank} waited {totals[rank] / 1e3:.1f} ms for the other ranks, "
            f"{worst['wait_sum_us'][rank] / 1e3:.1f} ms of it at {worst['collective']} "
            f"({worst['calls']} calls, transfer {worst['transfer_median_us']:.0f} us each)"
        )
    return lines
