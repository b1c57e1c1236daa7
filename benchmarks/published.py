"""Predicted vs published TFLOP/s per GPU for every row of published_runs.csv.

    python benchmarks/published.py [CSV] [--out benchmarks/results/published_comparison.json]

Defaults come from measurements and physics (`costmodel.defaults`), never fitted to these rows;
settings a row leaves open are chosen as described below.
"""

# Predict the published Megatron training runs of a `published_runs.csv` table (see its README).
#
# Each row gives the model shape, GPU, layout and the published TFLOP/s per GPU (or MFU) under one
# FLOP convention: `hardware_full_attention` (Narayanan et al. 2021, Eq. 3: recompute included,
# full attention), `model_full_attention` (NeMo <= 24.x) or `model_causal_attention`
# (Megatron-Bridge >= 25.09). We predict the step time with the default efficiencies (no
# calibration, nothing fitted to these rows) and convert it to that row's convention.
#
# Settings a row does not state are filled from what the source's software did, never tuned per
# row: Narayanan et al. ran Megatron-LM 2021 (unfused softmax attention, dropout 0.1, full
# recompute, no distributed optimizer, and its default `--DDP-impl local`, whose `train_step`
# all-reduces the fp32 gradients after `forward_backward_func` returns: no overlap with the
# backward); NVIDIA's recipe runs use TE / cuDNN flash attention, the
# distributed optimizer with grad-reduce / param-gather overlap, and sequence parallelism with
# TP communication overlap when tp > 1. NeMo 2.0's performance scripts (the dgxc-benchmarking rows) launch
# with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True on every GPU but B200 (NeMo
# scripts/performance/executors.py), which changes the memory predicted, not the time. Main grads are bf16
# (--grad-reduce-in-bf16) where the source's scripts set `grad_reduce_in_fp32=False`: Megatron-Bridge's
# performance configs for every model (e.g. scripts/performance/configs/qwen/qwen3_llm_pretrain.py,
# `set_qwen3_common_configs`) and NeMo 2.0's for fp8 (scripts/performance/helpers.py, `set_precision_configs`);
# fp32 elsewhere (Megatron-LM's default). fp8 rows of Megatron-Bridge ran its "fp8_cs" precision
# (scripts/performance/utils/precision.py: `bf16_with_fp8_current_scaling_mixed` with the bf16 first / last layers
# turned off): the tensorwise recipe and fp8 parameters (`fp8_param_gather=True`); other fp8 rows use
# Megatron-LM's defaults (delayed scaling, bf16 parameters). An empty micro-batch
# or vpp is searched: the fastest predicted value that fits in memory is used (the sources tuned those).

from __future__ import annotations

import argparse
import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.costmodel.estimate import CostOptions, Estimate, estimate
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.model import ModelSpec

ROOT = Path(__file__).resolve().parent.parent


CONVENTIONS = {
    "hardware_full_attention": ("full", "hardware"),
    "model_full_attention": ("full", "model"),
    "model_causal_attention": ("causal", "model"),
}


@dataclass(frozen=True)
class PublishedComparison:
    """One row: published vs predicted TFLOP/s per GPU under the row's convention."""

    source: str
    model: str
    gpu: str
    num_gpus: int
    layout: str
    convention: str
    published_tflops: float
    predicted_tflops: float
    estimate: Estimate

    @property
    def error(self) -> float:
        """(predicted - published) / published."""
        return self.predicted_tflops / self.published_tflops - 1.0

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "source": self.source,
            "model": self.model,
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "layout": self.layout,
            "flops_convention": self.convention,
            "published_tflops_per_gpu": self.published_tflops,
            "predicted_tflops_per_gpu": self.predicted_tflops,
            "error": self.error,
            "predicted_step_time_s": e.step_time_s,
            "predicted_mfu": e.mfu,
            "micro_batch_size": e.workload.micro_batch_size,
            "vpp": e.parallel.vpp,
            "peak_memory_gib": e.peak_memory_gib,
            "fits": e.fits,
        }


def _model_from_row(row: dict[str, str]) -> ModelSpec:
    name = row["model"]
    try:
        model = load_model_spec(name)
    except Exception:  # noqa: BLE001 - not a preset: build it from the row
        model = None
    if model is not None:
        if model.hidden_size != int(row["hidden"]) or model.num_layers != int(row["layers"]):
            raise ConfigError(f"published row {name}", "preset shape differs from the row")
        return model
    if row["hf_config_family"] != "gpt2":
        raise ConfigError(f"published row {name}", "no preset and not a gpt2-style row")
    # GPT-3-style model of Megatron-LM 2021: LayerNorm, GeLU 4h MLP, biases, learned positions,
    # tied embeddings, dropout 0.1.
    return ModelSpec(
        name=name,
        hidden_size=int(row["hidden"]),
        num_layers=int(row["layers"]),
        num_attention_heads=int(row["heads"]),
        num_query_groups=int(row["query_groups"]),
        kv_channels=int(row["head_dim"]),
        ffn_hidden_size=int(row["ffn"]),
        vocab_size=int(row["vocab"]),
        gated_linear_unit=False,
        activation="gelu",
        normalization="LayerNorm",
        add_bias_linear=True,
        tie_embeddings=True,
        position_embedding_type="learned_absolute",
        max_position_embeddings=int(row["seq_len"]),
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )


# The token dispatcher of the MoE rows whose config names one (the row's own CSV has no column for it): the 26.04
# Qwen3-30B-A3B H100 run is QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (Megatron-Bridge v0.4.0
# scripts/performance/configs/qwen/qwen3_workload_base_configs.py), flex over HybridEP, as the same run's row of
# published_runs_modern.csv records. Others: alltoall, megatron-core's default.
DISPATCHERS = {("Megatron-Bridge performance summary 26.04.01", "Qwen3-30B-A3B"): "hybridep"}


def _dispatcher(row: dict[str, str]) -> str:
    return DISPATCHERS.get((row["source"], row["model"]), "alltoall")


def _candidates(row: dict[str, str], model: ModelSpec) -> list[tuple[ParallelConfig, Workload, CostOptions]]:
    narayanan = row["source"].startswith("Narayanan")
    nemo2_perf_scripts = "NeMo 2.0" in row["source"]
    bridge_perf_configs = row["source"].startswith("Megatron-Bridge")
    bf16_main_grads = bridge_perf_configs or (nemo2_perf_scripts and row["precision"] == "fp8")
    tp, pp, cp, ep = (int(row[k]) for k in ("tp", "pp", "cp", "ep"))
    num_gpus, gbs, seq = int(row["num_gpus"]), int(row["global_batch"]), int(row["seq_len"])
    vpps = [int(row["vpp"])] if row["vpp"] else [None, *[v for v in (2, 3, 4, 5, 8) if pp > 1]]
    mbss = [int(row["micro_batch"])] if row["micro_batch"] else [1, 2, 4, 8]
    recompute = RecomputeConfig("full") if row["recompute"] == "full" else RecomputeConfig()
    convention = CONVENTIONS[row["flops_convention"]][0]
    options = CostOptions(
        flops_convention=convention,
        memory_margin=0.0,  # these runs happened: they fit the whole HBM
        flash_attention=not narayanan,
        fused_cross_entropy=not narayanan,
        overlap_grad_reduce=not narayanan,
        overlap_p2p_comm=not narayanan,
        p2p_scatter_gather=narayanan,
        expandable_segments=nemo2_perf_scripts and row["gpu"] != "B200",
        # NVIDIA's MoE recipes fuse the permute (--moe-permute-fusion): its kernels and its host floor
        moe_permute_fusion=True,
    )
    out = []
    for vpp in vpps:
        for mbs in mbss:
            try:
                parallel = ParallelConfig(
                    num_gpus=num_gpus,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    ep=ep,
                    etp=1 if ep > 1 else None,
                    vpp=vpp,
                    sequence_parallel=tp > 1 and not narayanan,
                    tp_comm_overlap=tp > 1 and not narayanan,
                    use_distributed_optimizer=not narayanan,
                    grad_reduce_in_fp32=not bf16_main_grads,
                    moe_dispatcher=_dispatcher(row),
                )
                fp8_cs = bridge_perf_configs and row["precision"] == "fp8"
                workload = Workload(
                    seq,
                    mbs,
                    gbs,
                    recompute,
                    row["precision"],
                    fp8_recipe="tensorwise" if fp8_cs else "delayed",
                    fp8_param=fp8_cs,
                )
            except ConfigError:
                continue
            out.append((parallel, workload, options))
    return out


def compare_row(row: dict[str, str]) -> PublishedComparison:
    model = _model_from_row(row)
    gpu = get_gpu_spec(row["gpu"])
    best: Estimate | None = None
    for parallel, workload, options in _candidates(row, model):
        try:
            est = estimate(model, parallel, workload, gpu, options)
        except ConfigError:
            continue
        if not est.fits and best is not None and best.fits:
            continue
        if best is None or (est.fits and not best.fits) or est.step_time_s < best.step_time_s:
            best = est
    if best is None:
        raise ConfigError(f"published row {row['model']}", "no valid layout")
    kind = CONVENTIONS[row["flops_convention"]][1]
    predicted = best.hardware_tflops_per_gpu if kind == "hardware" else best.model_tflops_per_gpu
    if row["tflops_per_gpu"]:
        published = float(row["tflops_per_gpu"])
    else:
        published = float(row["mfu_percent"]) / 100.0 * gpu.peak_tflops("bf16")
    p = best.parallel
    layout = f"tp{p.tp} pp{p.pp} cp{p.cp} ep{p.ep} vpp{p.vpp or 1} dp{p.dp} mbs{best.workload.micro_batch_size}"
    return PublishedComparison(
        source=row["source"],
        model=row["model"],
        gpu=gpu.name,
        num_gpus=p.num_gpus,
        layout=layout,
        convention=row["flops_convention"],
        published_tflops=published,
        predicted_tflops=predicted,
        estimate=best,
    )


def compare_published(csv_path: str | Path) -> list[PublishedComparison]:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [compare_row(r) for r in rows]


def summary(results: list[PublishedComparison]) -> dict[str, float]:
    errors = [abs(r.error) for r in results]
    return {"rows": len(results), "median_abs_error": statistics.median(errors), "max_abs_error": max(errors)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv", nargs="?", default=str(ROOT / "tests/fixtures/published_runs.csv"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/published_comparison.json"))
    args = parser.parse_args()
    results = compare_published(args.csv)
    head = ("model", "gpus", "layout", "convention", "published", "predicted", "error")
    print("{:16s} {:>5s} {:38s} {:24s} {:>9s} {:>9s} {:>7s}".format(*head))
    for r in results:
        print(
            f"{r.model:16s} {r.num_gpus:5d} {r.layout:38s} {r.convention:24s} {r.published_tflops:9.1f} "
            f"{r.predicted_tflops:9.1f} {r.error:+7.1%}"
        )
    s = summary(results)
    print(f"median |error| {s['median_abs_error']:.1%}, max |error| {s['max_abs_error']:.1%}")
    Path(args.out).write_text(
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "tool_version": __version__,
                "rows": [r.to_dict() for r in results],
                "summary": s,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
