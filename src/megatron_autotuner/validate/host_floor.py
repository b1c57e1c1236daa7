"""Measure the host floors of eager layers on this machine before validating layouts (`--measure-host-floor`).

Dense layers, in the model: each dense model of the batch (at the layouts' layer count) runs a few real steps at each
TP size the layouts use (on that many GPUs), micro-batch 1 and `HOST_PROBE_SEQ_LENGTH` tokens, eager, training and
forward-only, with its layers' host issue times recorded (`Layout.host_timing`, `host_timing.LayerHostTimer`). At
that length the GPU finishes each kernel before the host issues the next, so the times are the host's.
`dense_host_floor` per precision, fp8 recipe and TP size is the median over the probed models
(`dense_floors_from_probes`; TP sizes not probed add their collectives' host time, `costmodel.DenseHostFloor.at`).
The testbench's single layer, timed from an empty launch queue, is not used here: on one H100 lease it took 4.44 ms
to issue the Qwen3-0.6B training forward where the model's layers took 2.86 ms
(benchmarks/results/validation_h100_x1/host_diagnostics).

MoE blocks:

An eager megatron-core MoE block is host-bound at small token counts, and the host's pace differs between machines
and drifts on one (benchmarks/results/validation_h100_x1/moe_host_floor: the default floor, from a 2x H200 host,
predicted 3 of 16 H100 steps within 10%; the floor measured on the machine just before, 12 of 16). This runs the
testbench `moe` operator of each MoE model in the batch, on one GPU, at every local-expert count the layouts use
(a copy of the model with that many experts: the host work grows per local expert, the GPU work does not change),
in each precision and fp8 recipe they use, and fits `moe_host_floor` from it
(`testbench.calibration.moe_host_floors_from_records`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import write_text_atomic
from .layout import Layout

HOST_FLOOR_SEQ_LENGTH = 4096  # 4k tokens, micro-batch 1: host-bound for 128-expert Qwen3-30B-A3B shapes on H100 / H200
# 512 tokens at micro-batch 1: an 8B dense layer's forward is ~0.2 ms of H100 GEMMs (2 x 512 x 218M FLOPs at
# ~600 TFLOP/s) against ~3 ms of host issue (`defaults.DENSE_HOST_FLOOR_FWD_S`), so the host sets the pace
HOST_PROBE_SEQ_LENGTH = 512
# each MoE case runs in this many processes and the floor takes the median of their medians
# (`testbench.results.median_over_rounds`): the line through two expert counts, one process each, drew its slope
# from the processes' pace. On one 2x H200 host, gpt-oss-20b's block backward at 16 local experts took 6.3, 6.6 and
# 9.8 ms in three processes and, in a fourth, 7.5 ms beside 14.1 ms at 32, a slope that put ep 1 14% over its step
# (benchmarks/results/moe_floor_repeat_h200_x2, moe_r5_h200_x2/oss). Three rounds triple the cases' ~15 s each.
HOST_FLOOR_ROUNDS = 3
HOST_PROBE_STEPS = 5
HOST_PROBE_WARMUP_STEPS = 3


def host_probe_layouts(layouts: list[Layout]) -> list[Layout]:
    """The dense probes: per dense model (and layer count), precision, fp8 recipe and TP size (with its sequence
    parallelism) of the batch's Transformer Engine layouts, the model on TP GPUs (no DP, PP or CP), micro-batch 1,
    `HOST_PROBE_SEQ_LENGTH` tokens, eager, in training and forward-only, with host timing. A TP size's probe times
    its layers' collectives' host work too (`DenseHostFloor.at` adds it at sizes not probed)."""
    probes: dict[str, Layout] = {}
    for lay in layouts:
        if not lay.use_te or lay.model_spec().is_moe:
            continue
        short = Path(lay.model).name.removesuffix(".json")
        tp_name = f" tp{lay.tp}" if lay.tp > 1 else ""
        for mode in ("train", "forward"):
            probe = Layout(
                model=lay.model,
                num_layers=lay.num_layers,
                num_gpus=lay.tp,
                tp=lay.tp,
                sequence_parallel=lay.sequence_parallel,
                seq_length=HOST_PROBE_SEQ_LENGTH,
                mode=mode,
                precision=lay.precision,
                fp8_recipe=lay.fp8_recipe,
                warmup_steps=HOST_PROBE_WARMUP_STEPS,
                steps=HOST_PROBE_STEPS,
                host_timing=True,
                name=f"host probe {short} L{lay.model_spec().num_layers}{tp_name} {lay.precision} {mode}",
            )
            probes.setdefault(probe.layout_id, probe)
    return list(probes.values())


def dense_floors_from_probes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`dense_host_floor` entries (calibration JSON) from the probes' report rows: per precision, fp8 recipe and TP
    size, the median over the probed models of their layers' median host times, training forward / backward and
    forward-only (`fwd_no_grad_s`), and of the host time outside the layers (a probe's median step less its layers'
    host time, layers x their median): per micro-batch the forward-only probe's (`microbatch_s`), per step the
    training probe's less that (`step_s`). Rows that failed or were not timed are left out; `probes` keeps what each
    model gave."""
    from ..costmodel.calibration import precision_fields

    groups: dict[tuple[str, str | None, int, bool], list[dict[str, Any]]] = {}
    for row in rows:
        timing = (row.get("measured") or {}).get("host_timing") if row.get("status") == "ok" else None
        if not timing:
            continue
        lay = row["layout"]
        recipe = lay.get("fp8_recipe", "delayed") if lay["precision"] == "fp8" else None
        layers_ms = timing["layers"] * (timing["fwd_ms"] + (timing.get("bwd_ms") or 0.0))
        step_ms = row["measured"]["step_time_s"] * 1e3
        tp = int(lay.get("tp", 1))
        key = (lay["precision"], recipe, tp, bool(lay.get("sequence_parallel")) and tp > 1)
        groups.setdefault(key, []).append(
            {"model": lay["model"], "num_layers": lay.get("num_layers"), "mode": lay["mode"]}
            | {"fwd_ms": timing["fwd_ms"], "bwd_ms": timing.get("bwd_ms")}
            | {"step_ms": step_ms, "outside_layers_ms": max(0.0, step_ms - layers_ms)}
        )
    floors = []
    for key in sorted(groups, key=lambda k: (k[0], k[1] or "", k[2])):
        (precision, recipe, tp, sp), probes = key, groups[key]
        if sp != (tp > 1) and (precision, recipe, tp, not sp) in groups:
            # one entry per precision, fp8 recipe and TP size (a calibration keys them so): probed with and
            # without sequence parallelism, the default one (on at TP > 1) is kept
            continue
        train = [p for p in probes if p["mode"] == "train" and p["bwd_ms"] is not None]
        if not train:
            continue
        entry = precision_fields(precision, recipe) | {
            "tp": tp,
            "sequence_parallel": sp,
            "fwd_s": statistics.median(p["fwd_ms"] for p in train) * 1e-3,
            "bwd_s": statistics.median(p["bwd_ms"] for p in train) * 1e-3,
        }
        forward = [p for p in probes if p["mode"] != "train"]
        if forward:
            entry["fwd_no_grad_s"] = statistics.median(p["fwd_ms"] for p in forward) * 1e-3
            outside = {(p["model"], p["num_layers"]): p["outside_layers_ms"] for p in forward}
            entry["microbatch_s"] = statistics.median(outside.values()) * 1e-3
            # per model: its training probe's host outside the layers less its forward-only probe's
            per_step = [
                max(0.0, p["outside_layers_ms"] - outside[(p["model"], p["num_layers"])])
                for p in train
                if (p["model"], p["num_layers"]) in outside
            ]
            if per_step:
                entry["step_s"] = statistics.median(per_step) * 1e-3
        floors.append(entry | {"probes": probes})
    return floors


def host_floor_cases(layouts: list[Layout], models_dir: Path) -> list[Any]:
    """Testbench cases for the MoE layouts (tp = ep = 1): per model, precision, fp8 recipe and permute path, one `moe`
    case per local-expert count the layouts use and one with all the experts. A count other than the model's own runs
    a native ModelSpec copy with that many experts (no routing groups), written under `models_dir`."""
    from ..testbench.cases import Case

    cases: dict[str, Any] = {}
    for lay in layouts:
        spec = lay.model_spec()
        if not lay.use_te or not spec.is_moe:
            continue
        recipe = lay.fp8_recipe if lay.precision == "fp8" else "delayed"
        for experts in sorted({spec.num_moe_experts, spec.num_moe_experts // lay.ep}):
            if experts < spec.moe_router_topk:
                continue  # fewer experts than each token is routed to: not a model megatron-core builds
            model = lay.model
            if experts != spec.num_moe_experts:
                # a rank's experts stand in for the model's: no routing groups across them (they need not divide)
                variant = spec.replace(
                    num_moe_experts=experts, name=f"{spec.name}-E{experts}", moe_router_num_groups=0,
                    moe_router_group_topk=0,
                )  # fmt: skip
                models_dir.mkdir(parents=True, exist_ok=True)
                path = models_dir / f"{Path(spec.name).name}-E{experts}.json"
                write_text_atomic(path, json.dumps(variant.to_dict(), indent=1) + "\n")
                model = str(path)
            case = Case(
                model=model,
                op="moe",
                seq_length=HOST_FLOOR_SEQ_LENGTH,
                dtype=lay.precision,
                fp8_recipe=recipe,
                moe_permute_fusion=lay.moe_permute_fusion,  # each permute path has its own floor
            )
            cases.setdefault(case.case_id, case)
    return list(cases.values())


def measure_host_floor(
    layouts: list[Layout],
    gpu: str,
    out_dir: Path,
    calibration: Any = None,
    num_gpus: int | None = None,
    log: Callable[[str], None] = print,
    device: str = "cuda",
) -> Any:
    """Run the dense probes (`host_probe_layouts`, into `out_dir/probes`) and the MoE testbench cases
    (`host_floor_cases`, into `out_dir`), both resumable, write `out_dir/host_floor.calibration.json` and return
    `calibration` with this machine's `dense_host_floor` / `moe_host_floor` (a new calibration for `gpu` when none
    was given). With neither dense nor MoE Transformer Engine layouts, returns `calibration` unchanged."""
    from ..costmodel.calibration import Calibration, calibration_from_dict

    out_dir = Path(out_dir)
    probes = host_probe_layouts(layouts)
    cases = host_floor_cases(layouts, out_dir / "models")
    if not probes and not cases:
        return calibration
    doc: dict[str, Any] = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": gpu, "ops": []}
    if cases:
        doc["moe_host_floor"] = _moe_floors(cases, out_dir, num_gpus, log)
    if probes:
        doc["dense_host_floor"] = _dense_floors(probes, out_dir / "probes", num_gpus, log, device)
    write_text_atomic(out_dir / "host_floor.calibration.json", json.dumps(doc, indent=1) + "\n")
    measured = calibration_from_dict(doc, source=str(out_dir / "host_floor.calibration.json"))
    if not measured.moe_host_floors and not measured.dense_host_floors:
        log("host floor: no case gave a host floor here; the default floors stay")
        return calibration
    for floor in (*measured.moe_host_floors, *measured.dense_host_floors):
        log(f"host floor: {type(floor).__name__} {json.dumps(floor.to_dict())}")
    floors: dict[str, Any] = {}
    if measured.moe_host_floors:
        floors["moe_host_floors"] = measured.moe_host_floors
    if measured.dense_host_floors:
        floors["dense_host_floors"] = measured.dense_host_floors
    if calibration is None:
        # only the floors: the testbench's and the probes' GPU times are not a calibration of the model's kernels
        return Calibration(gpu=gpu, source=measured.source, **floors)
    return dataclasses.replace(calibration, **floors)


def _moe_floors(cases: list[Any], out_dir: Path, num_gpus: int | None, log: Callable[[str], None]) -> list[Any]:
    from ..testbench.calibration import calibration_from_records
    from ..testbench.launcher import run_cases
    from ..testbench.results import all_records, median_over_rounds

    log(f"host floor: {len(cases)} testbench case(s) on one GPU, {HOST_FLOOR_ROUNDS} rounds -> {out_dir}")
    rounds = []
    for index in range(HOST_FLOOR_ROUNDS):
        round_dir = out_dir if index == 0 else out_dir / f"round{index + 1}"
        # medians of 20 repeats after 5 warm-ups per process, as the committed leases ran: the host's pace is noisy
        run_cases(cases, round_dir, warmup=5, repeats=20, available_gpus=num_gpus, progress=False)
        rounds.append(all_records(round_dir))
    try:
        return calibration_from_records(median_over_rounds(rounds)).get("moe_host_floor", [])
    except ConfigError as exc:
        raise ConfigError("measure_host_floor", f"the testbench cases gave no result ({exc})") from exc


def _dense_floors(
    probes: list[Layout], out_dir: Path, num_gpus: int | None, log: Callable[[str], None], device: str
) -> list[Any]:
    from .launcher import run_layouts
    from .results import aggregate

    tps = " / ".join(str(tp) for tp in sorted({p.tp for p in probes}))
    log(f"host floor: {len(probes)} in-model probe(s) at {HOST_PROBE_SEQ_LENGTH} tokens, TP {tps} -> {out_dir}")
    run_layouts(probes, out_dir, device=device, available_gpus=num_gpus, log=log)
    ids = {p.layout_id for p in probes}
    rows = [row for lid, row in aggregate(out_dir).items() if lid in ids]
    failed = [row for row in rows if row.get("status") != "ok"]
    for row in failed:
        log(f"host floor: probe {row['layout_id']} {row.get('status')}: {row.get('error')}")
    return dense_floors_from_probes(rows)
