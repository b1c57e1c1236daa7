"""Step time of one training (or forward-only) iteration: stages, pipeline schedule, overlaps, MFU.

Per pipeline stage and micro-batch: the sum of its layers (`layer.layer_cost`), plus the embedding
(first stage: lookup, its TP collective, the zero-filled dense gradient and its scatter-add, and
its main_grad accumulation, which gradient-accumulation fusion does not cover) and the output layer
(last stage: final norm, logits GEMM in bf16, vocab-parallel cross-entropy streaming
`defaults.CROSS_ENTROPY_BYTES` per local vocab entry per token, its TP collectives; MTP layers).

Pipeline (Narayanan et al. 2021, arXiv 2104.04473, Sec. 2.2): with t_s the time of one
micro-batch on stage s (all its v model chunks), m micro-batches,
    T_pipe = m * max_s t_s + (sum_s t_s - max_s t_s) / v
i.e. (m + pp - 1) * t for 1F1B with equal stages and a bubble of (pp-1)/(m*v) relative to the
work for the interleaved schedule; the heaviest stage (often the last, holding the output layer
and loss, or the first, holding the embedding) decides the step. Pipeline send/recv of the
[s/cp, b, h/x] boundary tensor is exposed once forward and once backward per micro-batch and model
chunk; interleaving with megatron's overlap_p2p_comm hides it except while filling the pipeline.

After the last micro-batch (training): data-parallel gradient reduce-scatter (fp32 main grads, bf16 with
--grad-reduce-in-bf16) and parameter all-gather (bf16; fp8 for TE linear weights with --fp8-param-gather) of
the distributed optimizer (all-reduce without
it), over dp*cp ranks for dense and edp ranks for expert parameters. With --overlap-grad-reduce /
--overlap-param-gather they run under the backward / forward of one micro-batch;
exposed = max(t - window, t * tail) where the tail is the share of the last bucket (40M parameters, or
the word embedding on the stage that holds it: buckets do not split parameters) that cannot overlap. Reported as
"optimizer" (memory-bound, on the compute stream): the in-place 1/(dp*cp) gradient scaling before the
reduce-scatter, grad-norm clipping, the Adam step and the copy into the bf16 weights
(`defaults.OPTIMIZER_BYTES_PER_PARAM`, plus the fp32 cast of a bf16 gradient shard), grad zeroing and
the fp8 weight casts (or, with fp8 parameters, TE's quantization of the updated shard and the transposes
rebuilt after the all-gather); exposed with the DP communication, the tied-embedding gradient all-reduce between
the first and last stage.

Variable lengths (`Workload.lengths`): the micro-batches are verl's packing of the step's sampled sequences
(`specs.parallel.packed_batch`, each sequence padded to the THD alignment). A layer's time is linear in the
tokens (GEMMs, memory-bound work, collectives) and in sum s_i^2 (attention) up to the efficiency curves, so the
sum over a rank's m micro-batches is taken as m x the time of their mean (tokens / m, effective length
sum s^2 / sum s), on the data-parallel rank with the most FLOPs (the others wait for it at the gradient
reduction). Memory is that of the largest micro-batch (`theory.memory`).

MFU = model FLOPs / (num_gpus * step * dense bf16 peak), as NVIDIA's tables report bf16 runs;
fp8 runs also report `mfu_fp8` against the dense fp8 peak. Model FLOPs follow the requested
convention (causal: attention counted as half the square; full: the whole square); hardware FLOPs
add recomputed forward work.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..errors import ConfigError
from ..specs.hardware import ClusterSpec, GPUSpec
from ..specs.model import ModelSpec
from ..specs.parallel import (
    ParallelConfig,
    RecomputeConfig,
    Workload,
    check_cross_entropy_fusion_impl,
    check_cuda_device_max_connections,
    cuda_device_max_connections,
    num_microbatches,
    packed_batch,
    pipeline_layout_of,
    validate_layout,
)
from ..specs.pipeline import PipelineLayout
from ..theory.comm import chained_expert_param_gathers, dp_step_volumes
from ..theory.flops import chunk_layer_kinds, iteration_flops, model_flops_per_token
from ..theory.memory import (
    EXPANDABLE_SEGMENTS_BY_DEFAULT,
    GIB,
    ActivationOptions,
    MemoryAllowance,
    StageMemory,
    fp8_weight_counts,
    memory_per_stage,
    offload_groups,
    offloaded_per_chunk,
    optimizer_shard_parameters,
    param_gather_bytes,
    stage_signature,
)
from ..theory.params import ParameterCounts, stage_parameters
from . import defaults as d
from .activation_offload import (
    D2H,
    H2D,
    backward_units_s,
    fine_grained_layer_time,
    layer_level_exposed_s,
    offload_copy_gbps,
)
from .calibration import DEFAULT_DENSE_HOST_FLOOR, DEFAULT_FUSED_MOE_HOST_FLOOR, DEFAULT_MOE_HOST_FLOOR, Calibration
from .collectives import collective_time_s, hidden_collective_cost_s, p2p_time_s
from .compute import gemm_time_s, memory_bound_time_s
from .layer import (
    E_BF16,
    LayerContext,
    LayerCost,
    dense_host_floor_of,
    experts_activation_syncs_host,
    gemm_shapes,
    layer_cost,
    merge_parts,
    moe_block_host_s,
)
from .moe_overlap import a2a_overlap_saving_s, combined_share, head_drain_s
from .nccl_protocols import architecture
from .queued_frees import QueuedFreeInputs, queued_free_bytes, rank_launches
from .vision import vision_cost

COMPUTE_CLASSES = ("gemm", "attention", "memory_bound", "recompute")
COMM_DIMENSIONS = ("tp", "cp", "ep", "pp", "dp")


# HBM kept free when judging whether a layout fits, the same in `estimate` and `plan` (and their commands): the
# memory model lands within 5% of real megatron-core peaks where it was measured (docs/memory.md), so a layout
# predicted within the last 5% of HBM may not fit.
DEFAULT_MEMORY_MARGIN = 0.05


@dataclass(frozen=True)
class CostOptions:
    """Choices the cost model cannot read from the layout. The defaults are what Megatron-LM runs without the flag
    and what `mat validate`'s runner executes (`validate.predict.cost_options`), so that a plan ranks what runs.

    `overlap_grad_reduce` / `overlap_param_gather`: Megatron's --overlap-grad-reduce and
    --overlap-param-gather (the latter needs the distributed optimizer); `overlap_p2p_comm`:
    interleaved-schedule p2p overlap (off: each model chunk's send/recv is exposed, v per micro-batch and
    pass); `p2p_scatter_gather`: Megatron-LM's --scatter-gather-tensors-in-pipeline of 2021 (on by default
    then; megatron-core has no such path): without sequence parallelism each TP rank sends 1/tp of the
    boundary tensor and the receivers all-gather it over the TP group, exposed (its p2p_communication.py
    waits and calls torch.cuda.synchronize() after every exchange); `flash_attention`: fused attention
    (False: 2021-style unfused softmax); `fused_bias_activation`: fused SwiGLU / GeLU (Megatron-LM default; the
    testbench's layers ran unfused); `fused_cross_entropy`: --cross-entropy-loss-fusion (NeMo / Megatron-Bridge
    recipes turn it on; off by default, as in Megatron-LM: the unfused fp32 vocab-parallel loss);
    `gradient_accumulation_fusion`: wgrad GEMMs accumulate straight into the fp32 main_grad
    (Megatron-LM's default; needs APEX for megatron-core's output layer); off adds a cast-add over
    every local parameter per micro-batch (`defaults.GRAD_ACCUMULATION_BYTES_PER_PARAM`);
    `moe_host_bound`: MoE blocks run eagerly (no CUDA graph over the block, as the `validate` runner and the
    testbench run them): each takes at least the host time measured by the testbench for its permute path
    (`layer.moe_block_host_s`: `defaults.MOE_HOST_FLOOR_*`, `FUSED_MOE_HOST_FLOOR_*`, or the calibration's);
    `moe_permute_fusion`: --moe-permute-fusion, TE's fused token permute (NVIDIA's MoE recipes turn it on; off by
    default, as in Megatron-LM): its kernels and its host floor;
    `host_floor`: a micro-batch takes at least its dense layers' host issue time (eager megatron-core: the
    calibration's `dense_host_floor`, else `defaults.DENSE_HOST_FLOOR_*`; CUDA graphs take the captured share off);
    off gives the GPU's time alone;
    `expandable_segments`: the run sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which leaves far
    less reserved-but-unallocated memory (`MemoryAllowance.for_allocator`); on by default
    (`theory.memory.EXPANDABLE_SEGMENTS_BY_DEFAULT`: what the plan writes into launch_env.sh and the runner sets);
    `ddp_side_stream`: DDP is built on a CUDA stream of its own, as Megatron-LM's get_model does
    (megatron/training/training.py), so each parameter's gradient hook runs there and an unfused weight gradient's
    free waits on that stream (`queued_frees`); off: built on the default stream;
    `memory_margin`: fraction of HBM kept free when deciding `fits` (`DEFAULT_MEMORY_MARGIN`);
    `concurrent_copy_gbps`: host <-> GPU copy bandwidth (GB/s, each way) while kernels run beside it, for activation
    offloading (`activation_offload`); None: the calibration's host-copy table, else the GPU's host link;
    `cuda_device_max_connections`: the CUDA_DEVICE_MAX_CONNECTIONS the run's processes have; None: what the layout
    needs (`specs.parallel.cuda_device_max_connections`, as the plan's launch_env.sh and the runner set it). Before
    Blackwell, more than one holds CP's ring exchange exposed (`cp_ring_hides`).
    """

    flops_convention: str = "causal"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    overlap_p2p_comm: bool = True
    p2p_scatter_gather: bool = False
    flash_attention: bool = True
    fused_bias_activation: bool = True
    fused_cross_entropy: bool = False
    cross_entropy_fusion_impl: str = "native"
    gradient_accumulation_fusion: bool = True
    moe_host_bound: bool = True
    moe_permute_fusion: bool = False
    host_floor: bool = True
    calibration: Calibration | None = None
    allowance: MemoryAllowance | None = None
    expandable_segments: bool = EXPANDABLE_SEGMENTS_BY_DEFAULT
    ddp_side_stream: bool = True
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    concurrent_copy_gbps: float | None = None
    cuda_device_max_connections: int | None = None

    def __post_init__(self) -> None:
        if self.flops_convention not in ("causal", "full"):
            raise ConfigError("flops_convention", f"must be causal or full, got {self.flops_convention!r}")
        if not 0.0 <= self.memory_margin < 1.0:
            raise ConfigError("memory_margin", f"must be in [0, 1), got {self.memory_margin!r}")
        check_cuda_device_max_connections(self.cuda_device_max_connections)
        if self.concurrent_copy_gbps is not None and not self.concurrent_copy_gbps > 0:
            raise ConfigError("concurrent_copy_gbps", f"must be > 0 GB/s, got {self.concurrent_copy_gbps!r}")
        check_cross_entropy_fusion_impl(self.cross_entropy_fusion_impl)

    @property
    def loss_kernel(self) -> str:
        """The cross-entropy kernel the run uses: "unfused", or with --cross-entropy-loss-fusion its impl ("native",
        megatron-core's; "te", Transformer Engine's)."""
        return self.cross_entropy_fusion_impl if self.fused_cross_entropy else "unfused"

    @property
    def memory_allowance(self) -> MemoryAllowance:
        if self.allowance is not None:
            return self.allowance
        measured = None if self.calibration is None else self.calibration.memory_for(self.expandable_segments)
        return measured or MemoryAllowance.for_allocator(self.expandable_segments)


def run_settings(model: ModelSpec, options: CostOptions, tp_comm_overlap: bool) -> dict[str, Any]:
    """What a prediction assumed the run does beyond the layout, as the JSON of `mat estimate` and `mat plan` carries
    it and their 'run settings assumed' line prints it: the allocator, Megatron-LM's overlap and fusion flags, TP
    communication overlap (TE userbuffers), the dropout the model runs with (Megatron-LM's default 0.1 where a launch
    does not pass 0: masks and slower attention kernels) and what paces the host: the default floor (one H100
    machine's host; the hosts measured ran `defaults.HOST_PACE_RANGE` x its time), a calibration's or none."""
    host = "off" if not options.host_floor else "calibration" if _measured_floor(options) else "default"
    return {
        "expandable_segments": options.expandable_segments,
        "overlap_grad_reduce": options.overlap_grad_reduce,
        "overlap_param_gather": options.overlap_param_gather,
        "gradient_accumulation_fusion": options.gradient_accumulation_fusion,
        "fused_cross_entropy": options.fused_cross_entropy,
        "cross_entropy_fusion_impl": options.cross_entropy_fusion_impl if options.fused_cross_entropy else None,
        "moe_permute_fusion": options.moe_permute_fusion if model.is_moe else None,
        "tp_comm_overlap": tp_comm_overlap,
        "hidden_dropout": model.hidden_dropout,
        "attention_dropout": model.attention_dropout,
        "host_floor": host,
        "host_pace_range": list(d.HOST_PACE_RANGE) if host == "default" else None,
    }


@dataclass(frozen=True)
class StageTime:
    """One pipeline rank: seconds per micro-batch (all its chunks) and after the last micro-batch."""

    stage: int
    fwd: dict[str, float]
    bwd: dict[str, float]
    p2p_per_microbatch_s: float
    p2p_fill_s: float
    step_extra: dict[str, float]
    # one micro-batch of each model chunk (forward + backward, with its p2p when exposed): the fill and drain
    chunk_s: tuple[float, ...] = ()
    # the host's issue time of one micro-batch (its layers and the work around them) and its work once per step
    # outside the micro-batches (the optimizer step): the step never takes less than m x the one plus the other
    host_issue_s: float = 0.0
    host_step_s: float = 0.0
    # the host's backward issue time of one micro-batch: the layers' issue time and the eager MoE blocks' floors
    bwd_host_s: float = 0.0

    @property
    def per_microbatch_s(self) -> float:
        return sum(self.fwd.values()) + sum(self.bwd.values()) + self.p2p_per_microbatch_s

    @property
    def step_extra_s(self) -> float:
        return sum(self.step_extra.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "per_microbatch_s": self.per_microbatch_s,
            "fwd_s": dict(self.fwd),
            "bwd_s": dict(self.bwd),
            "p2p_per_microbatch_s": self.p2p_per_microbatch_s,
            "per_chunk_s": list(self.chunk_s),
            "after_last_microbatch_s": dict(self.step_extra),
        }


@dataclass(frozen=True)
class TimeResult:
    step_time_s: float
    pipeline_s: float
    bubble_s: float
    critical_stage: int
    stages: tuple[StageTime, ...]
    breakdown: dict[str, Any]
    num_microbatches: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Estimate:
    """Predicted performance and memory of one layout."""

    model: ModelSpec
    parallel: ParallelConfig
    workload: Workload
    gpu: GPUSpec
    options: CostOptions
    step_time_s: float
    tokens_per_iteration: int
    model_flops: float
    hardware_flops: float
    peak_memory_gib: float
    memory_breakdown_gib: dict[str, float]
    memory_per_stage_gib: tuple[float, ...]
    fits: bool
    time: TimeResult
    notes: tuple[str, ...] = field(default_factory=tuple)
    # flags of a Megatron-LM launch the cost model does not model yet (the estimate stands without them)
    not_modelled: tuple[str, ...] = field(default_factory=tuple)
    # the step on the slowest and fastest hosts measured, where the default dense host floor paces it
    # (`defaults.HOST_PACE_RANGE`); None where the GPU sets the pace or the floor was measured
    step_time_range_s: tuple[float, float] | None = None

    def with_notes(self, notes: tuple[str, ...] = (), not_modelled: tuple[str, ...] = ()) -> Estimate:
        return replace(self, notes=self.notes + tuple(notes), not_modelled=self.not_modelled + tuple(not_modelled))

    @property
    def num_gpus(self) -> int:
        return self.parallel.num_gpus

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_iteration / self.step_time_s / self.num_gpus

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.num_gpus / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        return self.hardware_flops / self.step_time_s / self.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the dense bf16 peak."""
        return self.model_tflops_per_gpu / self.gpu.bf16_tflops

    @property
    def mfu_fp8(self) -> float | None:
        """For fp8 runs: model FLOPs utilisation against the dense fp8 peak."""
        if self.workload.precision != "fp8":
            return None
        return self.model_tflops_per_gpu / self.gpu.fp8_tflops

    @property
    def mfu_at_own_peak(self) -> tuple[float, str]:
        """(MFU, the precision whose dense peak it is against): the fp8 peak for fp8 runs, else bf16."""
        if self.mfu_fp8 is not None:
            return self.mfu_fp8, "fp8"
        return self.mfu, "bf16"

    def mfu_fields(self) -> dict[str, float | None]:
        """The MFU keys of every JSON that reports a layout: against the dense bf16 peak, and for fp8 runs also
        against the dense fp8 peak, each with the peak it divides by."""
        return {
            "mfu": self.mfu,
            "mfu_peak_tflops": self.gpu.bf16_tflops,
            "mfu_fp8": self.mfu_fp8,
            "mfu_fp8_peak_tflops": self.gpu.fp8_tflops if self.workload.precision == "fp8" else None,
        }

    @property
    def run_settings(self) -> dict[str, Any]:
        """What the prediction assumed the run does beyond the layout (`run_settings`)."""
        return run_settings(self.model, self.options, self.parallel.tp_comm_overlap)

    @property
    def usable_memory_gib(self) -> float:
        return self.gpu.hbm_gib * (1.0 - self.options.memory_margin)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool_version": __version__,
            "inputs": {
                "model": self.model.name,
                "gpu": self.gpu.name,
                "num_gpus": self.num_gpus,
                "parallel": self.parallel.to_dict(),
                "workload": self.workload.to_dict(),
                "flops_convention": self.options.flops_convention,
                "overlap_grad_reduce": self.options.overlap_grad_reduce,
                "overlap_p2p_comm": self.options.overlap_p2p_comm,
                "fused_cross_entropy": self.options.fused_cross_entropy,
                "moe_host_bound": self.options.moe_host_bound,
                "moe_permute_fusion": self.options.moe_permute_fusion,
                "host_floor": self.options.host_floor,
                "expandable_segments": self.options.expandable_segments,
                "overlap_param_gather": self.options.overlap_param_gather and self.parallel.use_distributed_optimizer,
                "calibration": self.options.calibration.to_summary() if self.options.calibration else None,
                "memory_margin": self.options.memory_margin,
            },
            "step_time_s": self.step_time_s,
            "tokens_per_iteration": self.tokens_per_iteration,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "flops_convention": self.options.flops_convention,
            **self.mfu_fields(),
            "model_flops_per_iteration": self.model_flops,
            "hardware_flops_per_iteration": self.hardware_flops,
            "num_microbatches": self.time.num_microbatches,
            "peak_memory_gib": self.peak_memory_gib,
            "memory_breakdown_gib": dict(self.memory_breakdown_gib),
            "memory_per_stage_gib": list(self.memory_per_stage_gib),
            "hbm_gib": self.gpu.hbm_gib,
            "usable_memory_gib": self.usable_memory_gib,
            "fits": self.fits,
            "time_breakdown_s": self.time.breakdown,
            "pipeline_s": self.time.pipeline_s,
            "bubble_s": self.time.bubble_s,
            "critical_stage": self.time.critical_stage,
            "stages": [s.to_dict() for s in self.time.stages],
            "notes": list(self.notes) + list(self.time.notes),
            "not_modelled": list(self.not_modelled),
            "step_time_range_s": list(self.step_time_range_s) if self.step_time_range_s else None,
            "run_settings": self.run_settings,
        }


# ---------------------------------------------------------------------------------------------
def padded_vocab(model: ModelSpec, tp: int) -> int:
    """Megatron-LM pads the vocabulary to a multiple of --make-vocab-size-divisible-by (default 128) x tp."""
    return model.padded_vocab_size(tp)


def local_tokens_per_microbatch(parallel: ParallelConfig, workload: Workload) -> float:
    """Average tokens of one micro-batch on one rank (before TP splitting): b*s/cp.

    With dynamic batching (max_token_len) the DP rank's share of the global batch is spread over
    ceil(tokens / max_token_len) micro-batches, so the average micro-batch holds tokens / m.
    """
    if workload.lengths is not None:
        raise ConfigError("lengths", "variable lengths need the model: use packed_microbatch_shape")
    if workload.max_token_len is None:
        return workload.micro_batch_size * workload.seq_length / parallel.cp
    m = num_microbatches(parallel, workload)
    per_dp = workload.global_batch_size * workload.seq_length / parallel.dp
    return per_dp / m / parallel.cp


@lru_cache(maxsize=256)
def _flops_per_token_terms(model: ModelSpec, training: bool) -> tuple[float, float]:
    """(FLOPs per token without attention, attention FLOPs per token per unit of sequence length)."""
    linear = model_flops_per_token(model, 0, "causal", training)
    return linear, model_flops_per_token(model, 1, "causal", training) - linear


def packed_microbatch_shape(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> tuple[float, float]:
    """(local tokens, effective sequence length) of the mean micro-batch of the data-parallel rank with the most
    FLOPs (tokens x linear + sum s^2 x attention per unit length), with variable lengths: tokens = the rank's
    padded tokens / (m * cp), length = its sum s^2 / sum s. Without lengths: b*s/cp (`local_tokens_per_microbatch`)
    and seq_length."""
    packed = packed_batch(parallel, workload)
    if packed is None:
        return local_tokens_per_microbatch(parallel, workload), workload.seq_length
    linear, attention = _flops_per_token_terms(model, workload.is_training)
    ranks = packed.rank_tokens_and_squares  # (sum s, sum s^2) per rank, computed once per packing
    _, tokens, squares = max((t * linear + q * attention, t, q) for t, q in ranks)
    return tokens / (packed.num_micro_batches * parallel.cp), squares / tokens


@lru_cache(maxsize=4096)
def _stage_params(
    model: ModelSpec, tp: int, pp: int, vpp: int | None, layout, ep: int, etp: int, stage: int, padded: int
):
    parallel = ParallelConfig(
        num_gpus=tp * pp * ep * etp, tp=tp, pp=pp, ep=ep, etp=etp, vpp=vpp, pipeline_layout=layout
    )
    return stage_parameters(model, parallel, stage, padded)


def stage_parameter_counts(model: ModelSpec, parallel: ParallelConfig, stage: int, padded: int) -> ParameterCounts:
    """`theory.params.stage_parameters`, cached on what it depends on (tp, pp, vpp, layout, ep, etp)."""
    p = parallel
    return _stage_params(model, p.tp, p.pp, p.vpp, p.pipeline_layout, p.ep, p.etp, stage, padded)


@lru_cache(maxsize=4096)
def _iteration_flops_cached(
    model: ModelSpec,
    pp: int,
    vpp: int | None,
    layout,
    dp: int,
    workload: Workload,
    conv: str,
    pad: int,
    tp: int = 1,
    cp: int = 1,
):
    parallel = ParallelConfig(num_gpus=dp * pp * tp * cp, tp=tp, pp=pp, cp=cp, vpp=vpp, pipeline_layout=layout)
    return iteration_flops(model, parallel, workload, conv, pad)


def cached_iteration_flops(
    model: ModelSpec, parallel: ParallelConfig, workload: Workload, convention: str, padded: int
):
    """`theory.flops.iteration_flops`, cached on what it depends on (pp, vpp, layout, dp, workload; with
    variable lengths also tp and cp, which set the padding of each sequence)."""
    if workload.max_token_len is None:
        workload = workload.replace(micro_batch_size=1)
    p = parallel
    tp_cp = (p.tp, p.cp) if workload.lengths is not None else (1, 1)
    return _iteration_flops_cached(model, p.pp, p.vpp, p.pipeline_layout, p.dp, workload, convention, padded, *tp_cp)


def layer_calibration_scale(model: ModelSpec, ctx: LayerContext, workload: Workload) -> tuple[float, str | None]:
    """measured / predicted time of one layer when the calibration holds a layer of this shape."""
    cal = ctx.calibration
    if cal is None or not cal.layers:
        return 1.0, None
    phase = "fwd+bwd" if workload.is_training else "fwd"
    for entry in cal.layers:
        if (
            entry.model.lower() == model.name.lower()
            and entry.tp == ctx.tp
            and entry.cp == ctx.cp
            and entry.ep == ctx.ep
            and entry.sequence_parallel == ctx.sequence_parallel
            and entry.seq_length == workload.seq_length
            and entry.micro_batch_size == workload.micro_batch_size
            and entry.phase == phase
            and entry.precision == workload.precision
        ):
            cluster = ClusterSpec(ctx.cluster.gpu, entry.num_gpus)
            probe = LayerContext(
                **{**ctx.__dict__, "cluster": cluster, "full_recompute": False, "recompute_modules": ()}
            )
            lc = layer_cost(model, 0, probe)
            predicted = lc.fwd.total + (lc.bwd.total if phase == "fwd+bwd" else 0.0)
            if predicted > 0:
                scale = entry.time_ms * 1e-3 / predicted
                return scale, f"decoder layers scaled by {scale:.3f} (measured layer in {cal.source})"
    return 1.0, None


def step_end_work_s(counts: ParameterCounts, parallel: ParallelConfig, workload: Workload, gpu: GPUSpec) -> float:
    """Memory-bound work once per training step on the compute stream, reported as "optimizer": the optimizer
    kernels over the rank's shard (plus the fp32 cast of a bf16 gradient shard), zeroing the main grads, their
    in-place 1/(dp*cp) scaling before the reduce-scatter, and the fp8 weights' preparation: TE's
    first-micro-batch cast of bf16 weights, or with fp8 parameters the quantization of the updated shard (an
    SM-bound TE kernel, `defaults.FP8_PARAM_CAST_HBM_EFFICIENCY`) and the transposes rebuilt after the fp8
    all-gather. Byte counts in `defaults`."""
    bf16_grads = not parallel.grad_reduce_in_fp32
    shard = optimizer_shard_parameters(counts, parallel)
    opt_bytes = d.OPTIMIZER_BYTES_PER_PARAM + (d.OPTIMIZER_GRAD_CAST_BYTES_PER_PARAM_BF16 if bf16_grads else 0.0)
    work = memory_bound_time_s(opt_bytes * shard, gpu, 10, d.OPTIMIZER_HBM_EFFICIENCY)
    zero_bytes = d.GRAD_ZERO_BYTES_PER_PARAM_BF16 if bf16_grads else d.GRAD_ZERO_BYTES_PER_PARAM
    work += memory_bound_time_s(zero_bytes * counts.total, gpu, 1)
    if parallel.dp * parallel.cp > 1:
        scale_bytes = d.GRAD_SCALE_BYTES_PER_PARAM_BF16 if bf16_grads else d.GRAD_SCALE_BYTES_PER_PARAM
        work += memory_bound_time_s(scale_bytes * counts.total, gpu, 1)
    fp8_counts = fp8_weight_counts(counts)
    fp8_params = fp8_counts.total if workload.precision == "fp8" else 0
    if fp8_params and workload.fp8_param:
        fp8_shard = optimizer_shard_parameters(fp8_counts, parallel)
        work += memory_bound_time_s(d.FP8_PARAM_AMAX_BYTES_PER_PARAM[workload.fp8_recipe] * fp8_shard, gpu)
        cast_bytes = d.FP8_PARAM_CAST_BYTES_PER_PARAM * fp8_shard
        sm_bound = workload.fp8_recipe in d.FP8_PARAM_CAST_SM_BOUND_RECIPES
        work += memory_bound_time_s(cast_bytes, gpu, 1, d.FP8_PARAM_CAST_HBM_EFFICIENCY if sm_bound else None)
        work += memory_bound_time_s(d.FP8_PARAM_TRANSPOSE_BYTES_PER_PARAM * fp8_params, gpu, 1)
    elif fp8_params:
        weight_cast = d.FP8_CAST_BYTES_PER_ELEMENT[workload.fp8_recipe] * fp8_params
        work += memory_bound_time_s(weight_cast, gpu, d.FP8_CAST_KERNELS[workload.fp8_recipe])
    return work


def moe_forward_waits_for_device(model: ModelSpec, workload: Workload, options: CostOptions) -> bool:
    """Whether an eager MoE layer's forward stops the host until the GPU catches up: dropless routing waits for the
    token counts; a block that drops and pads to capacity does not, unless its experts' activation does
    (`experts_activation_syncs_host`)."""
    return not workload.moe_routing.drop_and_pad or experts_activation_syncs_host(model, options.fused_bias_activation)


def stage_time(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    stage: int,
    cluster: ClusterSpec,
    options: CostOptions,
    padded: int,
) -> tuple[StageTime, str | None]:
    """Seconds per micro-batch and after the last micro-batch for pipeline rank `stage`."""
    gpu = cluster.gpu
    training = workload.is_training
    tp, cp, pp = parallel.tp, parallel.cp, parallel.pp
    sp = parallel.sequence_parallel
    x = tp if sp else 1
    tokens, seq_length = packed_microbatch_shape(model, parallel, workload)
    rc = workload.recompute
    eager_moe = options.moe_host_bound and not workload.cuda_graph.captures("moe", moe_layer=True)
    moe_waits = moe_forward_waits_for_device(model, workload, options)
    ctx = LayerContext(
        cluster=cluster,
        tp=tp,
        sequence_parallel=sp,
        cp=cp,
        ep=parallel.ep,
        etp=parallel.etp,
        tokens=tokens,
        seq_length=seq_length,
        precision=workload.precision,
        fp8_recipe=workload.fp8_recipe,
        training=training,
        full_recompute=False,
        recompute_modules=tuple(sorted(rc.modules)) if (training and rc.granularity == "selective") else (),
        tp_comm_overlap=parallel.tp_comm_overlap and sp and tp > 1,
        cp_comm_type=parallel.cp_comm_type,
        flash_attention=options.flash_attention,
        fused_bias_activation=options.fused_bias_activation,
        # a graph over the whole MoE block replays it without the host (router-only graphs leave it eager); a block
        # that drops and pads to capacity has no token-count sync, so its host issues ahead of the GPU like a dense
        # layer's (`layer` module doc): one H200, 2-layer Qwen3-30B-A3B-E16 steps with capacity 1.0 / 1.5 padded ran
        # within 2.5% of their GPU time where the dropless step was host-bound (benchmarks/results/moe_token_drop_h200),
        # unless its experts' activation stops the host (`experts_activation_syncs_host`): then it is host-bound as a
        # dropless block
        moe_host_bound=eager_moe and moe_waits,
        moe_host_issue_ahead=eager_moe and not moe_waits,
        moe_permute_fusion=options.moe_permute_fusion,
        host_floor=options.host_floor,
        calibration=options.calibration,
        main_grad_bytes=parallel.main_grad_bytes,
        cuda_graph_impl=workload.cuda_graph.impl,
        cuda_graph_scope=workload.cuda_graph.scope,
        expert_load=workload.expert_load(parallel.ep),
        moe_dispatcher=parallel.moe_dispatcher,
        cp_ring_hides=cp_ring_hides(parallel, gpu, options),
    )
    mg = parallel.main_grad_bytes
    bf16_grads = not parallel.grad_reduce_in_fp32
    accumulate_bytes = d.GRAD_ACCUMULATION_BYTES_PER_PARAM_BF16 if bf16_grads else d.GRAD_ACCUMULATION_BYTES_PER_PARAM
    scale, note = layer_calibration_scale(model, ctx, workload)
    layout = pipeline_layout_of(model, parallel)
    v = layout.vpp
    layers = layout.rank_layers(stage)
    per_chunk_kinds = chunk_layer_kinds(model, parallel, stage, rc if training else RecomputeConfig())
    # one layer of each kind (MoE or dense, sliding-window or full attention, fully recomputed or not): fwd and bwd
    # (+ recompute) parts
    kind_cost: dict[tuple[bool, bool, bool], tuple[dict[str, float], dict[str, float]]] = {}
    kind_host: dict[tuple[bool, bool, bool], tuple[float, float]] = {}
    # an eager synchronised MoE block's GPU time over its host floor, forward + backward: what an EP all-to-all
    # overlap can take off it at most (`moe_overlap.a2a_overlap_saving_s`)
    kind_host_slack: dict[tuple[bool, bool, bool], float] = {}
    for kinds in per_chunk_kinds:
        for is_moe, full, _n, i in kinds:
            key = (*model.layer_kind(i), full)
            if key in kind_cost:
                continue
            lctx = ctx if not full else replace(ctx, full_recompute=True, recompute_modules=())
            lc: LayerCost = layer_cost(model, i, lctx)
            if scale != 1.0:
                lc = lc.scaled(scale)
            kind_cost[key] = lc.pass_parts()
            kind_host[key] = (lc.host_fwd_s, lc.host_bwd_s)
            if is_moe and ctx.moe_host_bound and training:
                block_host_fwd_s, block_host_bwd_s = moe_block_host_s(model, lctx)
                kind_host_slack[key] = max(0.0, scale * lc.moe_gpu_fwd_s - block_host_fwd_s) + max(
                    0.0, scale * lc.moe_gpu_bwd_s - block_host_bwd_s
                )
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    chunk_s = [0.0] * v  # one micro-batch of each model chunk, forward + backward

    def add(chunk: int, f: dict[str, float], b: dict[str, float], count: float = 1.0) -> None:
        merge_parts(fwd, f, count)
        merge_parts(bwd, b, count)
        chunk_s[chunk] += count * (sum(f.values()) + sum(b.values()))

    host_fwd_issue_s = host_bwd_issue_s = 0.0  # the host's issue time of the stage's layers, one micro-batch
    # the synchronised eager MoE blocks' backward floors (priced in the blocks' own time)
    moe_bwd_host_s = 0.0
    moe_block_bwd_host_s = moe_block_host_s(model, ctx)[1] if ctx.moe_host_bound and training else 0.0
    layers_fwd_gpu_s = 0.0  # the GPU's forward work of those layers
    for c, kinds in enumerate(per_chunk_kinds):
        for moe, full, count, layer in kinds:
            key = (*model.layer_kind(layer), full)
            add(c, *kind_cost[key], count)
            host_fwd_issue_s += count * kind_host[key][0]
            host_bwd_issue_s += count * kind_host[key][1]
            layers_fwd_gpu_s += count * sum(kind_cost[key][0].values())
            if moe:
                moe_bwd_host_s += count * moe_block_bwd_host_s

    if parallel.moe_a2a_overlap and training:
        saved, held_by_host = a2a_overlap_saving_s(
            model, parallel, stage, num_microbatches(parallel, workload), ctx, scale, kind_cost, per_chunk_kinds,
            kind_host_slack,
        )  # fmt: skip
        # what the combined steps hide is EP time (they never overlap two computations): taken off the exposed ep,
        # the backward's first; what the host's issue holds instead is the host's
        hidden = sum(saved) + sum(held_by_host)
        from_bwd = min(hidden, bwd.get("ep", 0.0))
        merge_parts(bwd, {"ep": -from_bwd})
        merge_parts(fwd, {"ep": from_bwd - hidden})
        if held := sum(held_by_host):
            merge_parts(fwd, {"host": held})
        chunk_s = [t - s for t, s in zip(chunk_s, saved, strict=True)]

    h = model.hidden_size
    e = E_BF16
    cal = options.calibration
    if stage == 0:
        emb_f = {"memory_bound": memory_bound_time_s(2 * e * h * tokens, gpu, 1)}
        emb_b: dict[str, float] = {}
        if tp > 1:
            coll = "reduce_scatter" if sp else "all_reduce"
            emb_f["tp"] = collective_time_s(coll, tp, e * tokens * h, cluster, 1)
        if training:
            # dense embedding backward: zero-fill the local table's bf16 gradient, scatter-add into it
            table = padded / tp * h
            fill = memory_bound_time_s(d.EMBEDDING_GRAD_FILL_BYTES_PER_PARAM * table, gpu, 1)
            emb_b["memory_bound"] = fill + memory_bound_time_s(10 * h * tokens, gpu, 1)
            if options.gradient_accumulation_fusion:
                # not a linear layer: its gradient is still added into main_grad by DDP's hook
                add_t = memory_bound_time_s(accumulate_bytes * table, gpu, 1, d.GRAD_ACCUMULATION_HBM_EFFICIENCY)
                emb_b["memory_bound"] += add_t
        add(0, emb_f, emb_b)
        layers_fwd_gpu_s += sum(emb_f.values())  # issued before the layers
        tower = vision_cost(model, parallel, workload, ctx, scale)
        if tower is not None:  # a vision-language model's vision tower, before the embedding's use
            add(0, tower.fwd, tower.bwd)
            layers_fwd_gpu_s += sum(tower.fwd.values())
            host_fwd_issue_s += tower.host_fwd_s
            host_bwd_issue_s += tower.host_bwd_s

    def output_head() -> tuple[dict[str, float], dict[str, float]]:
        """One output head (final norm, logits GEMM, cross-entropy and their TP collectives), one micro-batch."""
        vocab_local = padded / tp
        norm_f = memory_bound_time_s(2 * e * h * tokens / x, gpu, 1)
        norm_b = memory_bound_time_s(3 * e * h * tokens / x, gpu, 1)
        logits_f = gemm_time_s(tokens, vocab_local, h, gpu, "bf16", 1, "logits", "fwd", cal)
        logits_b = gemm_time_s(tokens, h, vocab_local, gpu, "bf16", 1, "logits", "dgrad", cal)
        logits_w = gemm_time_s(h, vocab_local, tokens, gpu, "bf16", 1, "logits", "wgrad", cal, 1.0, mg)
        loss = options.loss_kernel
        ce_fwd_bytes, ce_bwd_bytes = d.CROSS_ENTROPY_BYTES[loss]
        ce_eff = d.CROSS_ENTROPY_HBM_EFFICIENCY[loss]
        ce_f = memory_bound_time_s(ce_fwd_bytes * vocab_local * tokens, gpu, 4, ce_eff)
        ce_b = memory_bound_time_s(ce_bwd_bytes * vocab_local * tokens, gpu, 2, ce_eff)
        f = {"gemm": logits_f, "memory_bound": norm_f + ce_f}
        b = {"gemm": logits_b + logits_w, "memory_bound": norm_b + ce_b} if training else {}
        if tp > 1:
            f["tp"] = 3 * collective_time_s("all_reduce", tp, 4.0 * tokens, cluster, 1)
            if sp:
                f["tp"] += collective_time_s("all_gather", tp, e * tokens * h, cluster, 1)
                if training:
                    rs = collective_time_s("reduce_scatter", tp, e * tokens * h, cluster, 1)
                    b["tp"] = max(0.0, rs - logits_w)
        return f, b

    head_s = 0.0
    if stage == pp - 1:
        head_f, head_b = output_head()
        head_s = sum(head_f.values()) + sum(head_b.values())
        add(v - 1, head_f, head_b)
    mtp_layers = layout.rank_mtp_layers(stage)
    if mtp_layers:
        mtp_chunk = next(c for c in range(v) if "m" in layout.stage(stage, c))
        mtp_ctx = replace(ctx, full_recompute=False, recompute_modules=())
        lc = layer_cost(model, model.num_layers - 1, mtp_ctx)
        norm_f = memory_bound_time_s(2 * e * h * tokens / x, gpu, 1)
        norm_b = memory_bound_time_s(3 * e * h * tokens / x, gpu, 1)
        prec = workload.precision
        eh_f = gemm_time_s(tokens, h / tp, 2 * h, gpu, prec, 1, "eh_proj", "fwd", cal)
        eh_b = gemm_time_s(tokens, 2 * h, h / tp, gpu, prec, 1, "eh_proj", "dgrad", cal) + gemm_time_s(
            2 * h, h / tp, tokens, gpu, prec, 1, "eh_proj", "wgrad", cal, 1.0, mg
        )
        f = dict(lc.fwd.parts)
        merge_parts(f, {"gemm": eh_f, "memory_bound": 2 * norm_f})
        b: dict[str, float] = {}
        if training:
            b = dict(lc.bwd.parts)
            merge_parts(b, {"gemm": eh_b, "memory_bound": 2 * norm_b})
        add(mtp_chunk, f, b, mtp_layers)
        add(mtp_chunk, *output_head(), mtp_layers)  # each MTP layer has its own logits and loss

    counts = stage_parameter_counts(model, parallel, stage, padded)
    if training and not options.gradient_accumulation_fusion:
        accumulate = memory_bound_time_s(
            accumulate_bytes * counts.total,
            gpu,
            8 * len(layers) + 3,  # ~8 weight tensors per layer, plus embedding, final norm, output layer
            d.GRAD_ACCUMULATION_HBM_EFFICIENCY,
        )
        merge_parts(bwd, {"memory_bound": accumulate})
        for c in range(v):  # spread over the chunks by their share of the rank's layers
            chunk_s[c] += accumulate * len(layout.chunk_layers(stage, c)) / max(len(layers), 1)

    # The host issues ahead of the GPU (asynchronous launches, no synchronisation inside a micro-batch): a
    # micro-batch takes the longer of its GPU work and its host's issue time, so the GPU-heavy output layer and loss
    # hide host-bound layers before the host falls behind.
    # Activation offloading: the compute stream's waits for the copies are GPU time (stream waits, no host
    # synchronisation in megatron-core's offload manager or TE's), and each offloaded group of the fine-grained
    # mechanism costs the host its hooks and copy launches (`defaults.FINE_GRAINED_OFFLOAD_HOST_*`).
    off_f = off_b = 0.0
    off_chunks = [0.0] * v
    if training and workload.activation_offload.enabled:
        off_f, off_b, off_chunks, off_groups = _offload_exposed_s(
            model, parallel, workload, stage, ctx, options, kind_cost, per_chunk_kinds, head_s
        )
        host_fwd_issue_s += off_groups * d.FINE_GRAINED_OFFLOAD_HOST_FWD_S_PER_GROUP
        host_bwd_issue_s += off_groups * d.FINE_GRAINED_OFFLOAD_HOST_BWD_S_PER_GROUP
        merge_parts(fwd, {"offload": off_f})
        merge_parts(bwd, {"offload": off_b})
        chunk_s = [t + o for t, o in zip(chunk_s, off_chunks, strict=True)]
    host_outside_s = host_step_s = 0.0
    if options.host_floor:
        # the host's work outside the layers (`DenseHostFloor.microbatch_s` / `step_s`): embedding, output layer,
        # loss and the schedule per micro-batch (inside a full-iteration graph, replayed), the optimizer step per step.
        # Not in the launch-queue ramp, whose split point is the end of the forward layers on both sides.
        microbatch_s, step_s = dense_host_floor_of(ctx).outside_layers_s()
        if workload.cuda_graph.impl != "full_iteration":
            host_outside_s = microbatch_s
        host_step_s = step_s if training else 0.0
    if parallel.moe_a2a_overlap and training and stage == pp - 1 and options.host_floor:
        drain_s = _overlap_head_drain_s(
            model, parallel, layout, stage, num_microbatches(parallel, workload), head_s,
            host_outside_s + moe_block_bwd_host_s, kind_cost, kind_host, kind_host_slack, per_chunk_kinds,
        )  # fmt: skip
        if drain_s:
            merge_parts(fwd, {"host": drain_s})
            chunk_s[v - 1] += drain_s
    gpu_s = sum(fwd.values()) + sum(bwd.values())
    host_issue_s = host_fwd_issue_s + host_bwd_issue_s + host_outside_s
    host_ramp_s = host_issue_ramp_s(host_fwd_issue_s, host_bwd_issue_s, layers_fwd_gpu_s, gpu_s)
    if host_issue_s > gpu_s:
        merge_parts(fwd, {"host": host_issue_s - gpu_s})
        for c in range(v):
            chunk_s[c] = max(chunk_s[c], host_issue_s * len(layout.chunk_layers(stage, c)) / max(len(layers), 1))

    p2p_mb = p2p_fill = 0.0
    if pp > 1:
        stride = tp * cp * parallel.dp
        scatter = options.p2p_scatter_gather and tp > 1 and not sp
        t_p2p = p2p_time_s(e * tokens * h / (tp if scatter else x), cluster, stride)
        if scatter:  # each TP rank sends its 1/tp slice, the receivers all-gather the whole tensor
            t_p2p += collective_time_s("all_gather", tp, e * tokens * h, cluster, 1)
        sends = 2 if training else 1
        if parallel.vpp is not None and options.overlap_p2p_comm:
            p2p_fill = (pp - 1) * sends * t_p2p
        else:  # every model chunk of the stage receives and sends once per micro-batch and pass
            p2p_mb = v * sends * t_p2p
            chunk_s = [t + sends * t_p2p for t in chunk_s]

    extra: dict[str, float] = {}
    if training:
        window_bwd = sum(bwd.values())
        window_fwd = sum(fwd.values())
        dense_stride, expert_stride = tp, parallel.etp * parallel.ep
        bucket = max(d.DDP_BUCKET_PARAMS, 1_000_000 * parallel.dp)
        grad_calls, gather_calls = [], []
        for v in dp_step_volumes(counts, parallel, workload):
            stride = dense_stride if v.dimension == "dp" else expert_stride
            t = collective_time_s(v.collective, v.group_size, v.message_bytes, cluster, stride)
            (gather_calls if v.collective == "all_gather" else grad_calls).append((v, stride, t))
        grad_t = sum(t for _, _, t in grad_calls)
        gather_t = sum(t for _, _, t in gather_calls)
        # A bucket never splits a parameter, so the last gradient bucket of the backward (and the first
        # parameter bucket of the forward) holds at least the word embedding, on the stage that has it:
        # 2x H200, 4-layer Qwen3-8B DP2 (benchmarks/results/validation_h200_x2): its 622 M-parameter
        # embedding (31% of the rank's parameters) left ~16 ms of the fp32 reduce-scatter and bf16
        # all-gather exposed in the trace, where a 40 M bucket would leave 0.3 ms.
        tail = min(1.0, max(bucket, counts.embedding) / max(counts.total, 1))
        exposed = grad_t if not options.overlap_grad_reduce else max(grad_t - window_bwd, grad_t * tail)
        exposed += _hidden_cost_s(grad_calls, grad_t, exposed, cluster)
        if gather_t:
            overlap_gather = options.overlap_param_gather and parallel.use_distributed_optimizer
            gather_exposed = gather_t
            if overlap_gather:
                chained_s = _chained_gathers_s(model, parallel, counts, workload, bucket, cluster, expert_stride)
                gather_exposed = min(gather_t, max(gather_t - window_fwd, gather_t * tail + chained_s))
            exposed += gather_exposed + _hidden_cost_s(gather_calls, gather_t, gather_exposed, cluster)
        if model.tie_embeddings and pp > 1 and stage in (0, pp - 1):
            emb = mg * padded * h / tp
            exposed += collective_time_s("all_reduce", 2, emb, cluster, (pp - 1) * tp * cp * parallel.dp)
        extra["dp"] = exposed
        extra["optimizer"] = step_end_work_s(counts, parallel, workload, gpu)
    if pp == 1 and host_ramp_s > 0.0:
        # paid once per step: the optimizer step waits on the backward (its grad-norm and inf checks read the
        # gradients on the host), so the host's lead does not carry over from one step to the next
        extra["host_ramp"] = host_ramp_s
    bwd_host_s = host_bwd_issue_s + moe_bwd_host_s
    chunks = tuple(chunk_s)
    return StageTime(stage, fwd, bwd, p2p_mb, p2p_fill, extra, chunks, host_issue_s, host_step_s, bwd_host_s), note


def _overlap_head_drain_s(
    model: ModelSpec,
    parallel: ParallelConfig,
    layout: PipelineLayout,
    stage: int,
    microbatches: int,
    head_gpu_s: float,
    host_between_s: float,
    kind_cost: dict,
    kind_host: dict,
    kind_host_slack: dict,
    per_chunk_kinds: list,
) -> float:
    """Seconds per micro-batch the all-to-all overlap's combined steps add to the last pipeline rank by draining the
    output layer's GPU work at the first MoE layer's host wait (`moe_overlap.head_drain_s`), averaged over the rank's
    micro-batches (the warm-up and cool-down ones run alone). `host_between_s`: the host's work issued between the
    output layer and that wait besides any dense layers before it: the work outside the layers and the paired
    backward's MoE block (its experts' backward is issued before the forward's dispatch waits), each at its floor.

    Only the host's time counts: nothing where the last chunk's first MoE layer is not host-bound (no "host" part),
    and at most the drain plus the host's lead over the GPU in the rank's eager MoE blocks (`_moe_host_lead_s`):
    a GPU with more work than the host runs the output layer during the wait."""
    v = len(per_chunk_kinds)
    host_before_s = _host_before_first_moe_s(model, layout, stage, v, kind_cost, kind_host, per_chunk_kinds[-1])
    if host_before_s is None:
        return 0.0
    drain_s = head_drain_s(head_gpu_s, host_between_s + host_before_s)
    lead_s = _moe_host_lead_s(model, kind_cost, kind_host_slack, per_chunk_kinds)
    return combined_share(parallel, stage, microbatches, v) * min(drain_s, max(0.0, drain_s + lead_s))


def _host_before_first_moe_s(
    model: ModelSpec, layout: PipelineLayout, stage: int, chunks: int, kind_cost: dict, kind_host: dict, kinds: tuple
) -> float | None:
    """The host's issue time of the dense layers (forward and backward) before the first MoE layer of rank `stage`'s
    last chunk (`kinds`: that chunk's layer kinds); None where that chunk has no MoE layer or its first one is not
    host-bound. A kind recomputed in part and in full is taken as either: their host is alike."""
    key_of = {tuple(model.layer_kind(i)): (*model.layer_kind(i), full) for _moe, full, _n, i in kinds}
    host_before_s = 0.0
    for layer in layout.chunk_layers(stage, chunks - 1):
        key = key_of[tuple(model.layer_kind(layer))]
        if model.is_moe_layer(layer):
            f, b = kind_cost[key]
            return host_before_s if ("host" in f or "host" in b) else None
        host_before_s += sum(kind_host[key])
    return None


def _moe_host_lead_s(model: ModelSpec, kind_cost: dict, kind_host_slack: dict, per_chunk_kinds: list) -> float:
    """The host's lead over the GPU in a rank's eager MoE blocks, one micro-batch: where a block's pass is host-bound
    the host's excess (its "host" part), less where the GPU's work exceeds the host's floor (`kind_host_slack`)."""
    lead_s = 0.0
    for kinds in per_chunk_kinds:
        for moe, full, count, layer in kinds:
            if moe:
                key = (*model.layer_kind(layer), full)
                f, b = kind_cost[key]
                lead_s += count * (f.get("host", 0.0) + b.get("host", 0.0) - kind_host_slack.get(key, 0.0))
    return lead_s


def _chained_gathers_s(
    model: ModelSpec,
    parallel: ParallelConfig,
    counts: ParameterCounts,
    workload: Workload,
    bucket_params: int,
    cluster: ClusterSpec,
    stride: int,
) -> float:
    """The forward's expert-parameter all-gathers that no compute hides: each bucket boundary inside a grouped
    expert module (`theory.comm.chained_expert_param_gathers`) costs one bucket's all-gather over edp."""
    chained = chained_expert_param_gathers(model, parallel, counts, bucket_params)
    if not chained:
        return 0.0
    bytes_per_param = param_gather_bytes(counts, workload)[1] / counts.experts
    bucket_bytes = min(bucket_params, counts.experts) * bytes_per_param
    return chained * collective_time_s("all_gather", parallel.edp, bucket_bytes, cluster, stride)


def _hidden_cost_s(calls: list, total_s: float, exposed_s: float, cluster: ClusterSpec) -> float:
    """The compute lost beside the hidden share of the step-end collectives `calls` ((volume, stride, seconds)),
    each hidden in proportion to its time (`collectives.hidden_collective_cost_s`)."""
    if total_s <= 0.0:
        return 0.0
    hidden_share = 1.0 - exposed_s / total_s
    return sum(
        hidden_collective_cost_s(v.collective, v.group_size, cluster, stride, t * hidden_share)
        for v, stride, t in calls
    )


def host_issue_ramp_s(host_fwd_s: float, host_bwd_s: float, gpu_fwd_before_s: float, gpu_s: float) -> float:
    """Seconds a step's first micro-batch takes beyond max(host, GPU) when the host issues the forward slower than
    the GPU runs it and the GPU runs the backward slower than the host issues it.

    The host fills a FIFO launch queue that the GPU drains, starting together: the last kernel finishes at
    max over k of (host time to issue items 1..k + GPU time of items k..n) (a queue that never fills: a layer is
    a few hundred launches, the driver queues about a thousand). At layer granularity the maximum sits at one of
    three points: the start (GPU total), the end of the forward layers (host forward + the GPU work after it:
    output layer, loss, whole backward) or the end of the backward (host total + the little GPU work after it).
    The middle one exceeds both ends when the forward is host-bound and the backward GPU-bound: the GPU idles
    during the forward and cannot make that time up. Over m micro-batches without a synchronisation the backward's
    slack lets the host run ahead into the next forward, so only the first micro-batch pays it:
    step = (m - 1) max(H, G) + max(H, G, H_fwd + G_after_fwd). `gpu_fwd_before_s`: the GPU's work issued with the
    forward layers (embedding, layers)."""
    after_forward = host_fwd_s + (gpu_s - gpu_fwd_before_s)
    return max(0.0, after_forward - max(host_fwd_s + host_bwd_s, gpu_s))


def _offload_exposed_s(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    stage: int,
    ctx: LayerContext,
    options: CostOptions,
    kind_cost: dict[tuple[bool, bool, bool], tuple[dict[str, float], dict[str, float]]],
    per_chunk_kinds: tuple,
    head_s: float,
) -> tuple[float, float, list[float], float]:
    """(forward, backward, per-chunk) seconds of one micro-batch on rank `stage` spent waiting for activation
    offloading copies (`costmodel.activation_offload`), and the number of fine-grained groups one micro-batch
    offloads (0 for the layer-level mechanism, whose host cost is not measured)."""
    config = workload.activation_offload
    gpu, cal = ctx.cluster.gpu, options.calibration
    act = ActivationOptions(flash_attention=options.flash_attention, loss_kernel=options.loss_kernel)
    layout = pipeline_layout_of(model, parallel)
    v = layout.vpp

    def bandwidths(nbytes: float) -> tuple[float, float]:
        return (
            offload_copy_gbps(gpu, cal, D2H, nbytes, options.concurrent_copy_gbps)[0],
            offload_copy_gbps(gpu, cal, H2D, nbytes, options.concurrent_copy_gbps)[0],
        )

    if config.layer_level:  # megatron-core: pp = 1, one chunk, no recompute
        layers = layout.rank_layers(stage)
        fwd_s, bwd_s, d2h_s, h2d_s = [], [], [], []
        for i in layers:
            f, b = kind_cost[(*model.layer_kind(i), False)]
            fwd_s.append(sum(f.values()))
            bwd_s.append(sum(b.values()))
            moved = sum(g.copied_bytes for g in offload_groups(model, parallel, workload, i, act))
            d2h_gbps, h2d_gbps = bandwidths(moved)
            d2h_s.append(moved / (d2h_gbps * 1e9))
            h2d_s.append(moved / (h2d_gbps * 1e9))
        f_exp, b_exp = layer_level_exposed_s(fwd_s, bwd_s, d2h_s, h2d_s, config.num_layers, head_s)
        return f_exp, b_exp, [f_exp + b_exp], 0.0

    # fine-grained: a rank whose next backward is the micro-batch it just ran forward has only the forward as the
    # D2H window; elsewhere other micro-batches' backward runs before this one's and the backlog drains there
    immediate = v == 1 and stage == parallel.pp - 1
    offloaded, kept = offloaded_per_chunk(model, parallel, workload, stage, act)
    f_total = b_total = offloaded_groups = 0.0
    chunks = [0.0] * v
    for c, kinds in enumerate(per_chunk_kinds):
        exp_f = exp_b = full = count = 0.0
        for _moe, full_rc, n, i in kinds:
            groups = offload_groups(model, parallel, workload, i, act)
            if not groups:
                continue
            count += n * len(groups)
            f, b = kind_cost[(*model.layer_kind(i), full_rc)]
            window = sum(f.values()) + (0.0 if immediate else sum(b.values()))
            units = backward_units_s(model, i, gemm_shapes(model, i, ctx), b)
            lt = fine_grained_layer_time(groups, window, units, *bandwidths(sum(g.copied_bytes for g in groups)))
            exp_f += n * lt.exposed_fwd_s
            exp_b += n * lt.exposed_bwd_s
            full += n * sum(g.freed_bytes for g in groups)
        if not full:
            continue
        # groups kept on the GPU (fraction; the last of each module where the backward follows at once) move nothing
        moved = offloaded[c] - (kept if immediate and c == v - 1 else 0.0)
        share = max(0.0, moved) / full
        f_total += share * exp_f
        b_total += share * exp_b
        offloaded_groups += share * count  # by bytes: exact where the layers' groups are alike
        chunks[c] = share * (exp_f + exp_b)
    return f_total, b_total, chunks, offloaded_groups


def pipeline_fill_drain_s(stages: tuple[StageTime, ...] | list[StageTime], critical: int) -> float:
    """Time the critical rank waits outside its m micro-batches: before its first forward, the first model chunk
    of every earlier rank runs once (fill) and after its last backward once more (drain); the ranks after it
    delay its first backward by one pass through their last chunk each.

        fill + drain = sum_{r < c} chunk_0(r) + sum_{r > c} chunk_{v-1}(r)

    With equal chunks this is (sum_r t_r - t_c) / v, Narayanan et al.'s bubble; with an uneven layout the light
    first and last chunks (embedding / loss accounting) shorten it, a heavy one lengthens it."""
    fill = 0.0
    for r, st in enumerate(stages):
        if r == critical:
            continue
        chunks = st.chunk_s or (st.per_microbatch_s,)
        fill += chunks[0] if r < critical else chunks[-1]
    return fill


def time_model(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    cluster: ClusterSpec,
    options: CostOptions = CostOptions(),
    padded: int | None = None,
) -> TimeResult:
    """Step time and its breakdown (no validation, no memory): the search's inner loop."""
    padded = padded or padded_vocab(model, parallel.tp)
    # ranks with the same layers, embedding, loss and MTP take the same time (`stage_signature`): one computation
    by_signature: dict[tuple, tuple[StageTime, str | None]] = {}
    results = []
    for s in range(parallel.pp):
        key = stage_signature(model, parallel, s)
        if key not in by_signature:
            by_signature[key] = stage_time(model, parallel, workload, s, cluster, options, padded)
        st, note = by_signature[key]
        results.append((st if st.stage == s else replace(st, stage=s), note))
    stages = tuple(r[0] for r in results)
    notes = tuple(sorted({r[1] for r in results if r[1]}))
    m = num_microbatches(parallel, workload)
    per_mb = [s.per_microbatch_s for s in stages]
    t_max = max(per_mb)
    critical = per_mb.index(t_max)
    p2p_fill = max(s.p2p_fill_s for s in stages)
    pipeline = m * t_max + pipeline_fill_drain_s(stages, critical) + p2p_fill
    bubble = pipeline - m * t_max - p2p_fill
    extras = [s.step_extra_s for s in stages]
    extra_stage = extras.index(max(extras))
    step = pipeline + extras[extra_stage]
    # a rank's step never takes less than its host's issue time: every micro-batch, then the optimizer step
    host_path = max(m * s.host_issue_s + s.host_step_s for s in stages)
    host_step = max(0.0, host_path - step)
    step += host_step
    crit = stages[critical]
    compute = dict.fromkeys(COMPUTE_CLASSES, 0.0)
    comm = dict.fromkeys(COMM_DIMENSIONS, 0.0)
    host = offload = 0.0
    for part in (crit.fwd, crit.bwd):
        for k, val in part.items():
            if k in compute:
                compute[k] += m * val
            elif k == "host":
                host += m * val
            elif k == "offload":
                offload += m * val
            else:
                comm[k] = comm.get(k, 0.0) + m * val
    comm["pp"] += m * crit.p2p_per_microbatch_s + p2p_fill
    comm["dp"] += stages[extra_stage].step_extra.get("dp", 0.0)
    host += stages[extra_stage].step_extra.get("host_ramp", 0.0) + host_step
    breakdown = {
        "compute": compute,
        "exposed_comm": comm,
        "bubble": bubble,
        "host_bound": host,
        **({"offload": offload} if workload.activation_offload.enabled else {}),
        "optimizer": stages[extra_stage].step_extra.get("optimizer", 0.0),
        "total": step,
    }
    return TimeResult(step, pipeline, bubble, critical, stages, breakdown, m, notes)


# A step that waits on the host for less than this share of it is not worth a note.
HOST_BOUND_NOTE_SHARE = 0.05


def _waits_on_host(time: TimeResult) -> bool:
    return time.step_time_s > 0 and time.breakdown.get("host_bound", 0.0) >= HOST_BOUND_NOTE_SHARE * time.step_time_s


def _measured_floor(options: CostOptions) -> bool:
    cal = options.calibration
    return cal is not None and bool(cal.dense_host_floors or cal.moe_host_floors)


def host_paced_by_default(time: TimeResult, options: CostOptions) -> bool:
    """The GPU waits on the host for a noticeable share of the step, and the host's pace is the default floor's."""
    return _waits_on_host(time) and not _measured_floor(options)


def paced(options: CostOptions, gpu: GPUSpec, factor: float) -> Calibration:
    """`options`' calibration (or an empty one) with the default host floors at `factor` x their pace: the dense
    layers' phases and the host's work outside them (`DenseHostFloor`), every TP size alike, and the eager MoE block's
    (`MoeHostFloor`: the same host issues both, so its pace scales both)."""
    floor = DEFAULT_DENSE_HOST_FLOOR
    microbatch, step = floor.outside_layers_s()
    no_grad = floor.at(floor.tp, floor.sequence_parallel, training=False)[0]
    scaled = replace(
        floor,
        fwd_s=floor.fwd_s * factor,
        bwd_s=floor.bwd_s * factor,
        fwd_no_grad_s=no_grad * factor,
        microbatch_s=microbatch * factor,
        step_s=step * factor,
        tp_collective_s=floor.tp_collective_s * factor,
    )
    moe_scaled = tuple(
        replace(
            moe,
            fwd_s=moe.fwd_s * factor,
            bwd_s=moe.bwd_s * factor,
            fwd_per_local_expert_s=moe.fwd_per_local_expert_s * factor,
            bwd_per_local_expert_s=moe.bwd_per_local_expert_s * factor,
        )
        for moe in (DEFAULT_MOE_HOST_FLOOR, DEFAULT_FUSED_MOE_HOST_FLOOR)  # both permute paths' floors
    )
    base = options.calibration or Calibration(gpu=gpu.name)
    return replace(base, dense_host_floors=(scaled,), moe_host_floors=moe_scaled)


def host_sets_pace(time: TimeResult) -> bool:
    """Whether a host time sets any part of this step: a "host" part of a rank's micro-batch (its issue time over its
    GPU time, or an eager MoE block's floor over the block's GPU time), a first micro-batch's ramp
    (`host_issue_ramp_s`), or a rank's host path (m x issue time + step work) reaching the step. Every host time
    enters the step through a maximum with GPU time (`stage_time`, `time_model`), so where none sets it a faster host
    leaves the step as it is."""
    for s in time.stages:
        if s.fwd.get("host", 0.0) > 0.0 or s.bwd.get("host", 0.0) > 0.0 or s.step_extra.get("host_ramp", 0.0) > 0.0:
            return True
        if time.num_microbatches * s.host_issue_s + s.host_step_s >= time.step_time_s:
            return True
    return False


def host_pace_steps(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    gpu: GPUSpec,
    options: CostOptions,
    padded_vocab_size: int | None = None,
) -> tuple[float, float] | None:
    """The step on the fastest and the slowest host measured (`defaults.HOST_PACE_RANGE` x the default host floors);
    None where a calibration gives this machine's own floors (one pace)."""
    if _measured_floor(options):
        return None
    cluster = ClusterSpec(gpu, parallel.num_gpus)
    padded = padded_vocab_size or padded_vocab(model, parallel.tp)
    return tuple(  # type: ignore[return-value]
        time_model(
            model, parallel, workload, cluster, replace(options, calibration=paced(options, gpu, k)), padded
        ).step_time_s
        for k in d.HOST_PACE_RANGE
    )


def cp_ring_hides(parallel: ParallelConfig, gpu: GPUSpec, options: CostOptions) -> bool:
    """Whether CP's ring exchange hides behind the attention chunks issued after it. Megatron-LM asserts
    CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP before Blackwell: one hardware queue starts the kernels in issue order,
    so a transfer issued before its computation gets its SMs first (validate_args, megatron/training/arguments.py @
    Megatron-LM d98e8a6: the requirement "no longer exists since the Blackwell architecture"). With more queues (the
    EP all-to-all overlap's 8 or 32, `specs.parallel.A2A_OVERLAP_MAX_CONNECTIONS`) the ring is held exposed: the upper
    bound of what was measured on 2x H200 (benchmarks/results/connections_h200_x2): at 8 connections CP 2's step at
    32k tokens took 6.6 and 11.4 ms longer on one host, -6.4 and +6.5 on another (4.5 ms on average; the model 10.5),
    its ring more exposed in both ranks' traces. TP 2's gathers / scatters ran 8-19 ms more exposed per rank in the
    trace, but its step did not lengthen (-1 to -3 ms): TP stays hidden as at 1."""
    connections = options.cuda_device_max_connections or cuda_device_max_connections(parallel) or 1
    return connections == 1 or architecture(gpu) == "blackwell"


def overlap_connections_note(parallel: ParallelConfig, gpu: GPUSpec, connections: int | None = None) -> str | None:
    """The EP all-to-all overlap beside TP or CP before Blackwell: the overlap runs with CUDA_DEVICE_MAX_CONNECTIONS
    above 1 (`specs.parallel.cuda_device_max_connections`; `connections`: a launch's own value), where Megatron-LM asks
    for 1 with TP / CP and warns against the pairing on Hopper and before (validate_args,
    megatron/training/arguments.py @ Megatron-LM d98e8a6). What the prediction does with it (`cp_ring_hides`): CP's
    ring exchange exposed above 1, TP's communication as with 1."""
    if not parallel.moe_a2a_overlap or (parallel.tp == 1 and parallel.cp == 1) or architecture(gpu) == "blackwell":
        return None
    connections = connections or cuda_device_max_connections(parallel)
    said = []
    if parallel.cp > 1:
        said.append("CP's ring exchange is predicted " + ("exposed" if connections != 1 else "hidden"))
    if parallel.tp > 1:
        said.append("TP's communication hidden as with 1 (2x H200 at 8: a TP 2 step unchanged)")
    if connections == 1:
        # Megatron-LM's warning: "1 or 32, which depends on which parallelization you want to prioritize"
        said.append("the overlap's own saving is priced as at 8 (not measured at 1, where it has one hardware queue)")
    return (
        f"the EP all-to-all overlap runs with CUDA_DEVICE_MAX_CONNECTIONS={connections} "
        f"on {gpu.name}, where Megatron-LM asks for 1 beside TP / CP and warns against the pairing before Blackwell: "
        + "; ".join(said)
    )


def host_bound_note(
    time: TimeResult, options: CostOptions, step_range: tuple[float, float] | None = None
) -> str | None:
    """Say so when the GPU waits on the host for a noticeable share of the step (`breakdown["host_bound"]`), what
    paced the host (a calibration's floor or the defaults) and, paced by the defaults, the step on the fastest and
    slowest hosts measured (`step_range`, `defaults.HOST_PACE_RANGE`)."""
    if not _waits_on_host(time):
        return None
    host = time.breakdown["host_bound"]
    if _measured_floor(options):
        lo, hi = d.HOST_PROCESS_PACE_RANGE
        pace = (
            f"the host floor of the calibration file (fresh processes of one machine issued at {lo}x to {hi}x their "
            "median pace: a run's step strays with its process's)"
        )
    else:
        lo, hi = d.HOST_PACE_RANGE
        pace = (
            f"the default host floor, measured on one H100 machine's host; single-GPU hosts issued layers in "
            f"{lo}x to {hi}x its time"
        )
        if step_range:
            pace += f", which gives a step of {step_range[0]:.3f} to {step_range[1]:.3f} s"
        pace += ": measure this machine's with `mat validate --measure-host-floor` and pass it with --calibration"
    return (
        f"the GPU waits on the host for {host / time.step_time_s:.0%} of the step ({host:.3f} s), paced by {pace}; "
        "CUDA graphs (Megatron-LM's --cuda-graph-impl transformer_engine; `mat plan --cuda-graphs try`) take the "
        "layers' launches off the host"
    )


# The graph scopes a dropless MoE layer can take (a whole-block "moe" graph needs padded routing), and what they took
# off eager steps on four 2x H200 hosts (Qwen3-30B-A3B shapes at ep 2, 4096 tokens, bf16; benchmarks/results/
# moe_graphs_h200_x2, `python benchmarks/moe_graphs.py`): attn alone 11-39% (three of them), all three 30-35% at 16
# local experts, 7% at 64, where the model credits 0-8% (it takes only the router's and preprocess's shares of the
# block's forward host off, `layer.moe_block_host_s`).
MOE_LAYER_GRAPH_SCOPES = ("attn", "moe_router", "moe_preprocess")


def moe_graphs_note(model: ModelSpec, workload: Workload, options: CostOptions, time: TimeResult) -> str | None:
    """Say what graphs do to a host-paced eager MoE layer that waits for its token counts: the model credits
    `MOE_LAYER_GRAPH_SCOPES` far less than they took on 2x H200, so a graphed prediction is likely slow and an eager
    one's alternative understated. None for other layouts."""
    if not model.is_moe or not workload.is_training or not options.moe_host_bound or not _waits_on_host(time):
        return None
    if not moe_forward_waits_for_device(model, workload, options):
        return None
    graphs = workload.cuda_graph
    graphed = [part for part in MOE_LAYER_GRAPH_SCOPES if graphs.captures(part, moe_layer=True)]
    measured = (
        "on 2x H200 hosts attn alone took 11-39% off eager steps (three hosts) and all three 30-35% at 16 local "
        "experts (four hosts; 7% at 64), where this model credits 0-8% (docs/accuracy.md, 'CUDA graphs over the eager "
        "MoE layer')"
    )
    if not graphed:
        return (
            "the MoE layers wait on the host for their token counts at every forward: CUDA graphs of "
            f"--cuda-graph-scope {' '.join(MOE_LAYER_GRAPH_SCOPES)} (--cuda-graph-impl transformer_engine): {measured}"
        )
    return (
        f"graphs of {' '.join(graphed)} over the eager MoE layers: {measured}; this step is likely slower than the run"
    )


def queued_free_inputs(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    options: CostOptions,
    time: TimeResult,
    memory_stages: list[StageMemory],
) -> dict[int, QueuedFreeInputs]:
    """What `queued_frees` needs of each pipeline rank where something waits at the peak; none with DDP on the
    default stream (measured only with DDP on its own stream: runs of the default stream showed neither the weight
    gradients nor the pipeline buffers waiting, e.g. the 2-GPU pp2 vpp2 run of benchmarks/results/validation_h200_x2
    reserved 1.2-2.3 GiB over its allocation), for forward-only passes, CUDA graphs, on interleaved ranks with dropless
    MoE layers (not measured), and on the later stages of a non-interleaved pipeline: a
    synchronisation after every batched p2p exchange (`batch_p2p_sync`) precedes each of their forwards, where the
    first stage receives nothing and its backward and next forward run with no synchronisation between them
    (`queued_frees.QueuedFreeInputs.sync_every_microbatch`)."""
    if not options.ddp_side_stream or not workload.is_training or workload.cuda_graph.impl != "none":
        return {}
    layout = pipeline_layout_of(model, parallel)
    interleaved = layout.vpp > 1
    synced = parallel.pp > 1 and not interleaved
    tokens, _ = packed_microbatch_shape(model, parallel, workload)
    p2p_tensor_bytes = E_BF16 * tokens * model.hidden_size / (parallel.tp if parallel.sequence_parallel else 1)
    m = num_microbatches(parallel, workload)
    memory = {s.stage: s for s in memory_stages}
    out = {}
    for st in time.stages:
        layers = layout.rank_layers(st.stage)
        # dropless MoE layers, and padded ones whose experts' activation waits, synchronise the host in every forward,
        # never in the backward (`queued_frees`)
        moe_layers = sum(1 for i in layers if model.is_moe_layer(i))
        moe_synced = moe_layers > 0 and moe_forward_waits_for_device(model, workload, options)
        if st.stage not in memory or (moe_synced and interleaved) or (synced and st.stage > 0 and not moe_synced):
            continue
        params = memory[st.stage].parameters.total
        launches = rank_launches(
            len(layers) - moe_layers,
            moe_layers,
            parallel.tp > 1,
            local_experts=model.num_moe_experts // parallel.ep,
            expert_bias=model.add_bias_linear,
            gradient_accumulation_fusion=options.gradient_accumulation_fusion,
        )
        out[st.stage] = QueuedFreeInputs(
            fwd_gpu_s=sum(v for k, v in st.fwd.items() if k != "host"),
            bwd_gpu_s=sum(v for k, v in st.bwd.items() if k != "host"),  # only host-bound MoE blocks have any
            host_issue_s=st.host_issue_s,
            launches=launches,
            wgrad_bytes=0.0 if options.gradient_accumulation_fusion else E_BF16 * params,
            p2p_tensor_bytes=p2p_tensor_bytes,
            chunks=layout.vpp,
            num_microbatches=m,
            interleaved=interleaved,
            sync_every_microbatch=synced,
            moe_synced_forward=moe_synced,
            bwd_host_s=st.bwd_host_s,
        )
    return out


def memory_summary(
    stages: list[StageMemory], queued_free: dict[int, float] | None = None
) -> tuple[float, dict[str, float], tuple[float, ...]]:
    """(peak GiB, breakdown GiB of the peak stage, total GiB per stage). `queued_free`: bytes per stage freed on the
    host but not yet on the GPU at the peak (`queued_frees`), reserved beside the stage's total: part of its
    allowance (not allocated, not reusable)."""
    queued = queued_free or {}
    totals = tuple((s.total_bytes + queued.get(s.stage, 0.0)) / GIB for s in stages)
    peak_stage = stages[totals.index(max(totals))]
    waiting = queued.get(peak_stage.stage, 0.0)
    breakdown = {
        "weights": peak_stage.weights_bytes / GIB,
        "gradients": peak_stage.gradients_bytes / GIB,
        "optimizer": peak_stage.optimizer_bytes / GIB,
        "activations": peak_stage.activations_bytes / GIB,
        "optimizer_step": peak_stage.optimizer_step_bytes / GIB,
        "allowance": (peak_stage.allowance_bytes + waiting) / GIB,
        "non_torch": peak_stage.non_torch_bytes / GIB,  # of the allowance: outside the caching allocator
        "queued_frees": waiting / GIB,  # of the allowance: freed, awaiting the GPU's pass
        "total": max(totals),
        "stage": peak_stage.stage,
    }
    if peak_stage.offloaded_bytes:
        breakdown["offloaded_to_host"] = peak_stage.offloaded_bytes / GIB
    return max(totals), breakdown, totals


def device_allowance(options: CostOptions, gpu: GPUSpec) -> MemoryAllowance:
    """`options.memory_allowance` bounded by the memory a layout may use on `gpu` (HBM less the margin), where
    `theory.memory.released_at_device_limit` puts the allocator's release of cached segments."""
    allowance = options.memory_allowance
    if allowance.device_bytes is not None:
        return allowance
    return replace(allowance, device_bytes=gpu.hbm_gib * (1.0 - options.memory_margin) * GIB)


def estimate(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    gpu: GPUSpec,
    options: CostOptions = CostOptions(),
    memory_stages: list[StageMemory] | None = None,
) -> Estimate:
    """Validate the layout, then predict step time, throughput, MFU and peak memory per GPU."""
    validate_layout(model, parallel, workload)
    if workload.precision == "fp8":
        gpu.peak_tflops("fp8")  # raises for GPUs without fp8
    cluster = ClusterSpec(gpu, parallel.num_gpus)
    padded = padded_vocab(model, parallel.tp)
    time = time_model(model, parallel, workload, cluster, options, padded)
    flops = cached_iteration_flops(model, parallel, workload, options.flops_convention, padded)
    if memory_stages is None:
        memory_stages = memory_per_stage(
            model,
            parallel,
            workload,
            ActivationOptions(flash_attention=options.flash_attention, loss_kernel=options.loss_kernel),
            device_allowance(options, gpu),
            padded,
        )
    queued = {
        stage: queued_free_bytes(inputs)
        for stage, inputs in queued_free_inputs(model, parallel, workload, options, time, memory_stages).items()
    }
    peak, breakdown, per_stage = memory_summary(memory_stages, queued)
    step_range = None
    if host_paced_by_default(time, options):
        step_range = host_pace_steps(model, parallel, workload, gpu, options, padded)
    notes = [note] if (note := host_bound_note(time, options, step_range)) else []
    if (note := moe_graphs_note(model, workload, options, time)) is not None:
        notes.append(note)
    if options.calibration is not None:
        spec = options.calibration.gpu_spec()
        if spec is None or spec.name != gpu.name:
            notes.append(
                f"calibration measured on {options.calibration.gpu}, applied to {gpu.name} as a fraction of peak"
            )
    if parallel.moe_a2a_overlap and not workload.is_training:
        # megatron-core's combined 1F1B step pairs one micro-batch's forward with another's backward
        notes.append("the EP all-to-all overlap (and delayed wgrad) pair forwards with backwards: a forward-only pass "
                     "runs without them, as predicted")  # fmt: skip
    elif (note := overlap_connections_note(parallel, gpu, options.cuda_device_max_connections)) is not None:
        notes.append(note)
    if model.vision is not None and not workload.image_tokens_per_sequence:
        notes.append(
            f"{model.name}'s vision tower is held on the first stage but sees no images: a text-only batch "
            "(mat rlhf --image-tokens prices images)"
        )
    return Estimate(
        model=model,
        parallel=parallel,
        workload=workload,
        gpu=gpu,
        options=options,
        step_time_s=time.step_time_s,
        tokens_per_iteration=flops.tokens_per_iteration,
        model_flops=flops.model_flops,
        hardware_flops=flops.hardware_flops,
        peak_memory_gib=peak,
        memory_breakdown_gib=breakdown,
        memory_per_stage_gib=per_stage,
        fits=peak <= gpu.hbm_gib * (1.0 - options.memory_margin),
        time=time,
        notes=tuple(notes),
        step_time_range_s=step_range,
    )
