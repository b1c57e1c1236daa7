"""Measure the host floors of eager layers on this machine before validating layouts (`--measure-host-floor`).

Dense layers: the testbench `decoder` of each dense model in the batch, at TP 1 on one GPU, in each precision and
fp8 recipe the layouts use; `dense_host_floor` is the median wall time of its forward and backward calls where
they were host-bound (`testbench.calibration.dense_host_floors_from_records`; other TP sizes add their collectives'
host time, `costmodel.DenseHostFloor.at`).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .layout import Layout

HOST_FLOOR_SEQ_LENGTH = 4096  # 4k tokens, micro-batch 1: host-bound for 128-expert Qwen3-30B-A3B shapes on H100 / H200


def host_floor_cases(layouts: list[Layout], models_dir: Path) -> list[Any]:
    """Testbench cases: a `decoder` (tp 1, micro-batch 1, the layout's sequence length) per dense model, precision
    and fp8 recipe; `moe` cases (tp = ep = 1) for the MoE layouts: per model, precision and fp8 recipe, one case per
    local-expert count the layouts use and one with all the experts. A count other than the model's own runs a
    native ModelSpec copy with that many experts, written under `models_dir`."""
    from ..testbench.cases import Case

    cases: dict[str, Any] = {}
    for lay in layouts:
        spec = lay.model_spec()
        if not lay.use_te:
            continue
        recipe = lay.fp8_recipe if lay.precision == "fp8" else "delayed"
        if not spec.is_moe:
            case = Case(
                model=lay.model, op="decoder", seq_length=lay.seq_length, dtype=lay.precision, fp8_recipe=recipe
            )
            cases.setdefault(case.case_id, case)
            continue
        recipe = lay.fp8_recipe if lay.precision == "fp8" else "delayed"
        for experts in sorted({spec.num_moe_experts, spec.num_moe_experts // lay.ep}):
            if experts < spec.moe_router_topk:
                continue  # fewer experts than each token is routed to: not a model megatron-core builds
            model = lay.model
            if experts != spec.num_moe_experts:
                variant = spec.replace(num_moe_experts=experts, name=f"{spec.name}-E{experts}")
                models_dir.mkdir(parents=True, exist_ok=True)
                path = models_dir / f"{Path(spec.name).name}-E{experts}.json"
                path.write_text(json.dumps(variant.to_dict(), indent=1) + "\n")
                model = str(path)
            case = Case(
                model=model,
                op="moe",
                seq_length=HOST_FLOOR_SEQ_LENGTH,
                dtype=lay.precision,
                fp8_recipe=recipe,
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
) -> Any:
    """Run `host_floor_cases` into `out_dir` (resumable: finished cases are kept), write
    `out_dir/host_floor.calibration.json` and return `calibration` with this machine's `moe_host_floor` (a new
    calibration for `gpu` when none was given). Without MoE layouts, returns `calibration` unchanged."""
    from ..costmodel.calibration import Calibration, calibration_from_dict
    from ..testbench.calibration import calibration_from_records
    from ..testbench.launcher import run_cases
    from ..testbench.results import all_records

    cases = host_floor_cases(layouts, Path(out_dir) / "models")
    if not cases:
        return calibration
    log(f"host floor: {len(cases)} testbench case(s) on one GPU -> {out_dir}")
    # medians of 20 repeats after 5 warm-ups, as the committed leases ran: the host's pace is noisy
    run_cases(cases, out_dir, warmup=5, repeats=20, available_gpus=num_gpus, progress=False)
    try:
        doc = calibration_from_records(all_records(Path(out_dir)))
    except ConfigError as exc:
        raise ConfigError("measure_host_floor", f"the testbench cases gave no result ({exc})") from exc
    (Path(out_dir) / "host_floor.calibration.json").write_text(json.dumps(doc, indent=1) + "\n")
    measured = calibration_from_dict(doc, source=str(Path(out_dir) / "host_floor.calibration.json"))
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
        # only the floors: the testbench's decoder GPU times are cold single layers, not a calibration of the model
        return Calibration(gpu=gpu, source=measured.source, **floors)
    return dataclasses.replace(calibration, **floors)
