"""`Layout`: one model + parallel layout + workload that `validate` trains (or runs forward) for real.

A layout names its model by preset / config path and may reduce the layer count (`num_layers`):
the prediction it is compared with is then made for the same reduced model (`model_spec()`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, reject_unknown_fields
from ..specs import (
    CudaGraphConfig,
    ModelSpec,
    ParallelConfig,
    RecomputeConfig,
    Workload,
    load_model_spec,
    validate_layout,
)
from ..specs.parallel import (
    ActivationOffloadConfig,
    MoeRouting,
    check_cross_entropy_fusion_impl,
    check_cuda_device_max_connections,
    check_tp_comm_overlap,
    cuda_device_max_connections,
)
from ..specs.pipeline import PipelineLayout
from ..theory.memory import EXPANDABLE_SEGMENTS_BY_DEFAULT

# when the runner began building DDP on a stream of its own, as Megatron-LM does (commit 5f4b146)
DDP_SIDE_STREAM_SINCE = "2026-11-24T02:52:45+00:00"


def ran_with_ddp_side_stream(record: dict[str, Any]) -> bool:
    """Whether a run record's DDP was built on a stream of its own: as its layout says, else by its date (runs from
    before `DDP_SIDE_STREAM_SINCE` built it on the default stream)."""
    stated = (record.get("layout") or {}).get("ddp_side_stream")
    if stated is not None:
        return bool(stated)
    ran = str((record.get("env") or {}).get("date") or "")
    return not (ran and ran < DDP_SIDE_STREAM_SINCE)


def ran_with_expandable_segments(record: dict[str, Any]) -> bool:
    """Whether a run record's allocator had expandable segments: as its layout says, else as the environment it
    recorded (PYTORCH_CUDA_ALLOC_CONF); records older than the field ran PyTorch's default allocator."""
    stated = (record.get("layout") or {}).get("expandable_segments")
    if stated is not None:
        return bool(stated)
    return "expandable_segments:true" in str((record.get("env") or {}).get("pytorch_cuda_alloc_conf") or "").lower()


# the MoE token dispatchers the runner builds (`Layout.moe_token_dispatcher`)
RUNNER_DISPATCHERS = ("alltoall", "allgather")
# `--stand-in all` runs every rank alone, one process after another, each tens of seconds (a build and a few steps):
# 65,536 ranks is already a day or more of runs
STAND_IN_ALL_MAX_RANKS = 65536
# where the runner lets each rank's process run (`Layout.cpu_affinity`)
CPU_AFFINITIES = ("inherit", "gpu_numa")


@dataclass(frozen=True)
class Layout:
    """One validation run. `global_batch_size` None means micro_batch_size x dp; sequence parallel None
    means on when tp > 1. `warmup_steps` untimed steps come before `steps` timed ones."""

    # Fields added after evidence was committed: they enter `layout_id` only when not at their default, so the
    # ids of earlier runs (which could not set them) stay the same.
    ID_FIELDS_ONLY_WHEN_SET = (
        "expandable_segments",
        "memory_history",
        "grad_reduce_in_fp32",
        "fp8_recipe",
        "fp8_param",
        "pipeline_layout",
        "max_token_len",
        "prompt_length",
        "response_length",
        "length_seed",
        "cuda_graph_impl",
        "cuda_graph_scope",
        "cuda_graph_warmup_steps",
        "activation_offload",
        "host_timing",
        "tp_comm_overlap",
        "tp_comm_overlap_cfg",
        "cross_entropy_fusion",
        "gradient_accumulation_fusion",
        "moe_permute_fusion",
        "cross_entropy_fusion_impl",
        "moe_expert_capacity_factor",
        "moe_pad_expert_input_to_capacity",
        "moe_a2a_overlap",
        "delay_wgrad_compute",
        "moe_token_dispatcher",
        "cuda_device_max_connections",
        "cpu_affinity",
        "manual_gc",
    )
    # fields that never enter `layout_id`: the label, and how DDP's stream was built (the historical runs that
    # `from_record` marks with it keep their ids)
    ID_EXCLUDED = ("name", "ddp_side_stream")
    # the value of such a field that leaves it out of `layout_id` where it is not the default today: expandable
    # segments were off by default when the earlier runs were recorded
    ID_BASELINE = {"expandable_segments": False}

    model: str
    seq_length: int
    num_gpus: int = 1
    num_layers: int | None = None
    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    # an uneven pipeline as Megatron's --pipeline-model-parallel-layout string (every form can be written so);
    # fixes vpp
    pipeline_layout: str | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    sequence_parallel: bool | None = None
    cp_comm_type: str = "p2p"
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    recompute: str = "none"
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    recompute_modules: tuple[str, ...] = ("core_attn",)
    mode: str = "train"
    precision: str = "bf16"
    # with precision fp8: Megatron-LM's --fp8-recipe (delayed | tensorwise | blockwise) and --fp8-param-gather
    fp8_recipe: str = "delayed"
    fp8_param: bool = False
    use_distributed_optimizer: bool = True
    # fp32 main grads (Megatron-LM's default); False: --grad-reduce-in-bf16 (bf16 main-grad buffer)
    grad_reduce_in_fp32: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    warmup_steps: int = 3
    steps: int = 5
    profile: bool = False
    use_te: bool = True
    # PyTorch's caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
    # set by the worker before CUDA starts): a segment grows in place instead of a new one being reserved. On unless
    # the layout says otherwise, as the plan assumes (`theory.memory.EXPANDABLE_SEGMENTS_BY_DEFAULT`).
    expandable_segments: bool = EXPANDABLE_SEGMENTS_BY_DEFAULT
    # record the caching allocator's history (torch.cuda.memory._record_memory_history) from before the build to
    # the last step; writes memory/<layout_id>/rank_R.pickle.gz + its replay (`trace.memory_history`). Slows steps.
    memory_history: bool = False
    # packed THD micro-batches (verl's dynamic batching): each micro-batch packs whole sequences up to max_token_len
    # tokens; `global_batch_size` is the number of sequences per iteration. Their lengths: prompt + response, each a
    # [mean, max] pair in tokens (`specs.lengths.SequenceLengths.from_mean_max`, drawn from `length_seed`), and
    # `seq_length` the longest there can be (>= max prompt + max response); without them every sequence is
    # seq_length long. The packing is `specs.lengths.pack_micro_batches`, as the prediction's.
    max_token_len: int | None = None
    prompt_length: tuple[float, int] | None = None
    response_length: tuple[float, int] | None = None
    length_seed: int = 0
    # CUDA graphs as megatron-core runs them (Megatron-LM --cuda-graph-impl / --cuda-graph-modules /
    # --cuda-graph-warmup-steps; `specs.parallel.CudaGraphConfig`): transformer_engine captures per-layer graphs
    # with TECudaGraphHelper after `cuda_graph_warmup_steps` eager steps, local lets megatron-core's schedules
    # capture its own, full_iteration wraps the forward-backward in FullCudaGraphWrapper. The capture needs
    # CUDA; the graphed steps are those after it, so `warmup_steps` must exceed `cuda_graph_warmup_steps`.
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    cuda_graph_warmup_steps: int = 2
    # activation offloading to pinned host memory (`specs.parallel.ActivationOffloadConfig`, the Workload's; in
    # JSON an object of its fields): {"num_layers": N} is Megatron-LM's --cpu-offloading-num-layers N (Transformer
    # Engine's layer-level offload), {"modules": [...]} its --fine-grained-activation-offloading --offload-modules
    # (with "min_tensor_elements", "fraction"). None: off. Needs CUDA and Transformer Engine; fine-grained with
    # TE >= 2.10 needs NVTE_CPU_OFFLOAD_V1=1 in the environment, as Megatron-LM asks (`runner.offload_env_problem`).
    activation_offload: ActivationOffloadConfig | None = None
    # time each decoder layer's host issue in the timed steps (`host_timing.LayerHostTimer`, measured["host_timing"]);
    # the hooks cost a few microseconds per layer. Not under CUDA graphs (a replay issues no layer) nor the all-to-all
    # overlap (its combined step runs each layer's pieces, never the layer's forward): the record's note says why;
    # with full recompute the forwards recomputed in the backward are timed as forwards too.
    host_timing: bool = False
    # What the run executes beyond the split, as the plan assumed it (`costmodel.CostOptions`; Megatron-LM's flags of
    # the same names): TE userbuffers overlap of the TP collectives (needs sequence parallelism; the userbuffers
    # yaml, else TE's defaults), the fused cross-entropy loss, and wgrad accumulation into the fp32 main grads (needs
    # APEX; None: as the runner on this machine has it). The runner refuses what it cannot run.
    tp_comm_overlap: bool = False
    tp_comm_overlap_cfg: str | None = None
    cross_entropy_fusion: bool = False
    cross_entropy_fusion_impl: str = "native"  # with cross_entropy_fusion: megatron-core's (native) or TE's kernel
    gradient_accumulation_fusion: bool | None = None
    moe_permute_fusion: bool = False  # TE's fused MoE token permute (--moe-permute-fusion)
    # token dropping (--moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity); routing stays force-balanced
    moe_expert_capacity_factor: float | None = None
    moe_pad_expert_input_to_capacity: bool = False
    # the EP all-to-all overlap (--overlap-moe-expert-parallel-comm): megatron-core's combined 1F1B step runs one
    # micro-batch's forward beside another's backward; --delay-wgrad-compute defers the experts' weight gradients
    moe_a2a_overlap: bool = False
    delay_wgrad_compute: bool = False
    # --moe-token-dispatcher-type: alltoall or allgather (Megatron-LM's default); the flex dispatchers need DeepEP /
    # HybridEP, which the GPU machine's install lacks
    moe_token_dispatcher: str = "alltoall"
    # CUDA_DEVICE_MAX_CONNECTIONS the run's processes set (the prediction reads it: `CostOptions
    # .cuda_device_max_connections`); None: the all-to-all overlap's, else the environment's (../shared/gpu: 1)
    cuda_device_max_connections: int | None = None
    # the CPUs each rank's process runs on (`affinity`): "inherit" leaves the launcher's, as Megatron-LM's pretrain
    # does outside fine-grained offloading (which binds as "gpu_numa" does); "gpu_numa" binds each rank to its GPU's
    # NUMA node (megatron-core's set_ideal_affinity_for_current_gpu), as NUMA-binding launchers do
    cpu_affinity: str = "inherit"
    # Megatron-LM's --manual-gc: the interpreter's automatic garbage collector off for the steps (gc.disable() after
    # one gc.collect(), megatron/training/training.py @ Megatron-LM d98e8a6), as Megatron-Bridge's performance runs
    # set it (scripts/performance/utils/overrides.py `_set_common_perf_overrides` @ 067f987df: manual_gc True,
    # interval 100); off: Python's collector runs whenever its allocation thresholds trip, as Megatron-LM's default
    manual_gc: bool = False
    # DDP built on a CUDA stream of its own, as Megatron-LM's get_model builds it (`CostOptions.ddp_side_stream`);
    # the runner did so from commit 5f4b146 (2026-11-24T02:52Z), before it on the default stream (`from_record`)
    ddp_side_stream: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.recompute_modules, str):  # a layouts file's "moe" would otherwise read as m, o, e
            raise ConfigError("recompute_modules", f"must be a list of module names, got {self.recompute_modules!r}")
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        if self.moe_token_dispatcher not in RUNNER_DISPATCHERS:  # before anything builds a ParallelConfig of it
            raise ConfigError(
                "moe_token_dispatcher",
                f"must be one of {', '.join(RUNNER_DISPATCHERS)} (the runner has no DeepEP / HybridEP), "
                f"got {self.moe_token_dispatcher!r}",
            )
        if self.cpu_affinity not in CPU_AFFINITIES:
            raise ConfigError("cpu_affinity", f"must be one of {', '.join(CPU_AFFINITIES)}, got {self.cpu_affinity!r}")
        scope = (self.cuda_graph_scope,) if isinstance(self.cuda_graph_scope, str) else tuple(self.cuda_graph_scope)
        object.__setattr__(self, "cuda_graph_scope", scope)
        self._normalise_offload()
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)
        if self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)
        if self.vpp == 1:
            object.__setattr__(self, "vpp", None)
        if self.pipeline_layout is not None and self.vpp is None:
            object.__setattr__(self, "vpp", PipelineLayout.from_string(self.pipeline_layout, self.pp).vpp_or_none)
        for f in dataclasses.fields(self):  # a layouts file's "no" or 1 would otherwise read as true
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ConfigError(f.name, f"must be true or false, got {getattr(self, f.name)!r}")
        for key in ("warmup_steps", "steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < (0 if key == "warmup_steps" else 1):
                raise ConfigError(key, f"must be a {'non-negative' if key == 'warmup_steps' else 'positive'} integer")
        if self.num_layers is not None and (not isinstance(self.num_layers, int) or self.num_layers < 1):
            raise ConfigError("num_layers", f"must be a positive integer, got {self.num_layers!r}")
        check_tp_comm_overlap(self.parallel())  # raises ConfigError on a bad split
        if not self.ddp_side_stream and self.cuda_graph_impl not in (None, "none"):
            raise ConfigError(
                "ddp_side_stream", "CUDA graphs need DDP on a stream of its own (a capture cannot wait on the default)"
            )
        check_cuda_device_max_connections(self.cuda_device_max_connections)
        if self.tp_comm_overlap_cfg is not None and not self.tp_comm_overlap:
            raise ConfigError("tp_comm_overlap_cfg", "a userbuffers yaml goes with tp_comm_overlap")
        graphs = self.workload().cuda_graph
        if graphs.enabled and self.warmup_steps <= graphs.warmup_steps:
            raise ConfigError(
                "warmup_steps",
                f"must exceed cuda_graph_warmup_steps={graphs.warmup_steps}: the timed steps replay the graphs "
                "captured after those eager steps",
            )
        self._check_offload_with_graphs()
        self._check_packing()

    def _normalise_offload(self) -> None:
        """`activation_offload` as an `ActivationOffloadConfig` (from its JSON object), None when off."""
        value = self.activation_offload
        if isinstance(value, dict):
            reject_unknown_fields(ActivationOffloadConfig, value, "activation_offload")
            value = ActivationOffloadConfig(**value)
        if value is not None and not isinstance(value, ActivationOffloadConfig):
            raise ConfigError(
                "activation_offload", f"must be an object of {', '.join(ActivationOffloadConfig.__annotations__)}"
            )
        object.__setattr__(self, "activation_offload", value if value is not None and value.enabled else None)

    def _check_offload_with_graphs(self) -> None:
        offload = self.activation_offload
        if offload is None or self.cuda_graph_impl == "none":
            return
        if offload.layer_level and self.cuda_graph_impl != "full_iteration":
            # megatron-core TransformerConfig.__post_init__: "CUDA graphs not supported with CPU offloading."
            raise ConfigError("cuda_graph_impl", "layer-level CPU offloading works only without CUDA graphs or "
                              "with full_iteration graphs (megatron-core)")  # fmt: skip
        # fine-grained offloading under graphs needs megatron-core's graph-replay hooks (delayed offload, its own
        # stream and events), which this runner does not drive; layer-level under a full-iteration graph neither
        raise ConfigError("activation_offload", "activation offloading with CUDA graphs is not run by mat validate")

    def _check_packing(self) -> None:
        for key in ("prompt_length", "response_length"):
            value = getattr(self, key)
            if value is not None:
                if not isinstance(value, list | tuple) or len(value) != 2:
                    raise ConfigError(key, f"must be [mean, max] in tokens, got {value!r}")
                object.__setattr__(self, key, tuple(value))
        if self.max_token_len is None:
            if self.prompt_length or self.response_length or self.length_seed != 0:
                raise ConfigError("prompt_length", "length distributions need packed sequences (max_token_len)")
            return
        if not self.use_te:
            # megatron-core's local DotProductAttention asserts packed_seq_params is None
            # (megatron/core/transformer/dot_product_attention.py, forward): THD needs TEDotProductAttention
            raise ConfigError("use_te", "packed THD sequences (max_token_len) need Transformer Engine attention")
        if self.micro_batch_size != 1:
            raise ConfigError("micro_batch_size", "must be 1 with packed sequences (one packed row per micro-batch)")
        if (self.prompt_length is None) != (self.response_length is None):
            raise ConfigError("prompt_length", "give both prompt_length and response_length, or neither")
        self.packing_plan()  # raises ConfigError when the batch cannot be packed as asked

    # ------------------------------------------------------------------ derived objects
    def model_spec(self) -> ModelSpec:
        spec = load_model_spec(self.model)
        return spec.with_num_layers(self.num_layers) if self.num_layers else spec

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(
            num_gpus=self.num_gpus,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
            vpp=self.vpp,
            sequence_parallel=bool(self.sequence_parallel),
            use_distributed_optimizer=self.use_distributed_optimizer,
            grad_reduce_in_fp32=self.grad_reduce_in_fp32,
            tp_comm_overlap=self.tp_comm_overlap,
            cp_comm_type=self.cp_comm_type,
            moe_a2a_overlap=self.moe_a2a_overlap,
            delay_wgrad_compute=self.delay_wgrad_compute,
            moe_dispatcher=self.moe_token_dispatcher,
            pipeline_layout=None
            if self.pipeline_layout is None
            else PipelineLayout.from_string(self.pipeline_layout, self.pp),
        )

    def workload(self) -> Workload:
        dp = self.num_gpus // (self.tp * self.pp * self.cp)
        return Workload(
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            global_batch_size=self.global_batch_size or self.micro_batch_size * max(dp, 1),
            recompute=RecomputeConfig(
                granularity=self.recompute,
                method=self.recompute_method,
                num_layers=self.recompute_num_layers,
                modules=self.recompute_modules,
            ),
            precision=self.precision,
            mode=self.mode,
            fp8_recipe=self.fp8_recipe,
            fp8_param=self.fp8_param,
            max_token_len=self.max_token_len,
            lengths=self.sequence_lengths(),
            cuda_graph=self.cuda_graph(),
            activation_offload=self.activation_offload or ActivationOffloadConfig(),
            moe_routing=self.moe_routing(),
        )

    def moe_routing(self) -> MoeRouting:
        """The run's routing: force-balanced, with the layout's expert capacity (token dropping) if it sets one."""
        return MoeRouting(
            capacity_factor=self.moe_expert_capacity_factor, pad_to_capacity=self.moe_pad_expert_input_to_capacity
        )

    def cuda_graph(self) -> CudaGraphConfig:
        return CudaGraphConfig(self.cuda_graph_impl, self.cuda_graph_scope, self.cuda_graph_warmup_steps)

    def sequence_lengths(self):
        """`specs.lengths.SequenceLengths` of the prompt + response lengths; None when not given."""
        if self.prompt_length is None or self.response_length is None:
            return None
        from ..specs.lengths import SequenceLengths

        try:
            return SequenceLengths.from_mean_max(self.prompt_length, self.response_length, seed=self.length_seed)
        except TypeError as exc:
            raise ConfigError("prompt_length", f"must be [mean, max] in tokens ({exc})") from exc

    @property
    def packed(self) -> bool:
        return self.max_token_len is not None

    def packing_plan(self):
        """The packed micro-batches of every DP rank (`testbench.packed.PackingPlan`): verl's packing as the cost
        model has it (`specs.parallel.packed_batch`), sequences padded as megatron-core needs (`thd_alignment`,
        per sequence); None without packing."""
        if self.max_token_len is None:
            return None
        from ..specs.lengths import pack_micro_batches
        from ..specs.parallel import packed_batch, thd_alignment, vpp_micro_batch_group
        from ..testbench.packed import plan_from_packed

        par, work = self.parallel(), self.workload()
        packed = packed_batch(par, work, padded=False)
        if packed is None:  # every sequence seq_length long
            packed = pack_micro_batches(
                [self.seq_length] * work.global_batch_size,
                self.max_token_len,
                dp=par.dp,
                num_batches_divided_by=vpp_micro_batch_group(par),
            )
        return plan_from_packed(packed, thd_alignment(par, work)[0])

    def check(self) -> None:
        """Raise `ConfigError` if megatron-core would refuse the layout for this model, or the runner cannot build it:
        it builds GPTModel with softmax attention (gated DeltaNet needs flash-linear-attention and Mamba layers
        mamba_ssm, neither of which the GPU machine's install has)."""
        self.moe_routing()  # raises for a capacity megatron-core refuses
        check_cross_entropy_fusion_impl(self.cross_entropy_fusion_impl)
        spec = self.model_spec()
        if spec.hybrid_layer_pattern or spec.has_linear_attention:
            what = "Mamba hybrid" if spec.hybrid_layer_pattern else "gated-DeltaNet"
            raise ConfigError(
                "model", f"{spec.name} is a {what} model: mat validate runs GPT models of softmax attention only"
            )
        if spec.vision is not None:
            raise ConfigError(
                "model", f"{spec.name} has a vision tower: mat validate runs GPT language models (no images) only"
            )
        validate_layout(spec, self.parallel(), self.workload())

    @property
    def process_max_connections(self) -> int | None:
        """The CUDA_DEVICE_MAX_CONNECTIONS the run's processes set themselves (`specs.parallel
        .cuda_device_max_connections`) for the all-to-all overlap, or as the layout names them; None keeps the
        environment's."""
        if self.cuda_device_max_connections is not None:
            return self.cuda_device_max_connections
        return cuda_device_max_connections(self.parallel()) if self.moe_a2a_overlap else None

    @property
    def process_settings(self) -> tuple[bool, int]:
        """What a process reads once, when CUDA starts, so the layouts of one job must share it: the allocator's
        expandable segments and the CUDA_DEVICE_MAX_CONNECTIONS it sets (0: the environment's)."""
        return self.expandable_segments, self.process_max_connections or 0

    @property
    def world_size(self) -> int:
        return self.num_gpus

    def stand_in_ranks(self, all_ranks: bool = False) -> list[int]:
        """The ranks a memory stand-in runs: every rank, or by default the first of each pipeline stage (the
        tensor- / context- / data-parallel ranks of a stage hold shards of the same shapes). megatron-core's
        default rank order tp-cp-ep-dp-pp puts the pipeline stage outermost: stage s starts at s x world / pp.
        Raises `ConfigError` for MoE layouts with an expert group of more than one rank: their dispatcher sizes
        buffers from token counts the fake process group does not deliver."""
        par = self.parallel()
        if self.model_spec().num_moe_experts and par.ep * par.etp > 1:
            raise ConfigError(
                "stand_in",
                f"{self.label}: MoE with ep x etp = {par.ep * par.etp} exchanges token counts that a stand-in's fake "
                "process group does not deliver; stand-ins need ep = etp = 1 for MoE layouts",
            )
        if all_ranks:
            if self.world_size > STAND_IN_ALL_MAX_RANKS:
                raise ConfigError(
                    "stand_in",
                    f"--stand-in all runs each of the {self.world_size} ranks alone, one process after another: at "
                    f"most {STAND_IN_ALL_MAX_RANKS} (--stand-in stages runs the first rank of each pipeline stage)",
                )
            return list(range(self.world_size))
        return [stage * (self.world_size // self.pp) for stage in range(self.pp)]

    @property
    def num_microbatches(self) -> int:
        if self.max_token_len is not None:
            return self.packing_plan().num_microbatches
        w = self.workload()
        return w.global_batch_size // (w.micro_batch_size * self.parallel().dp)

    @property
    def layout_id(self) -> str:
        """Stable id: readable prefix + hash of every field but the label (resume keys on it)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        fields = {
            k: v
            for k, v in self.to_dict().items()
            if k not in self.ID_EXCLUDED
            and not (
                k in self.ID_FIELDS_ONLY_WHEN_SET
                and (v == self.ID_BASELINE.get(k, defaults[k]) or (isinstance(v, list) and not v))
            )
        }
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        model = re.sub(r"[^A-Za-z0-9._-]", "_", Path(self.model).name.removesuffix(".json"))
        layers = f".L{self.num_layers}" if self.num_layers else ""
        sizes = f"g{self.num_gpus}.tp{self.tp}.pp{self.pp}.cp{self.cp}.ep{self.ep}.s{self.seq_length}"
        return f"{model}{layers}.{sizes}.b{self.micro_batch_size}.{self.recompute}.{self.mode}.{digest}"

    @property
    def label(self) -> str:
        """Short human name for tables."""
        if self.name:
            return self.name
        parts = [f"tp{self.tp}"]
        if self.sequence_parallel:
            parts.append("sp")
        for key in ("pp", "cp", "ep"):
            if getattr(self, key) > 1:
                parts.append(f"{key}{getattr(self, key)}")
        if self.vpp:
            parts.append(f"vpp{self.vpp}")
        if self.pipeline_layout:
            parts.append(f"layout={self.pipeline_layout}")
        parts.append(f"dp{self.parallel().dp}")
        parts.append(f"mbs{self.micro_batch_size}")
        if self.recompute != "none":
            parts.append(self.recompute)
        if self.mode != "train":
            parts.append(self.mode)
        if not self.grad_reduce_in_fp32:
            parts.append("bf16-grads")
        if self.precision != "bf16":
            parts.append(self.workload().precision_label)
        if self.max_token_len is not None:
            parts.append(f"packed{self.max_token_len}")
        if self.expandable_segments:
            parts.append("expandable")
        if self.cuda_graph_impl != "none":
            graphs = self.cuda_graph()
            parts.append(f"graphs={graphs.impl}" + (f"[{'+'.join(graphs.scope)}]" if graphs.scope else ""))
        if self.activation_offload is not None:
            parts.append(f"offload[{self.activation_offload.label}]")
        if self.tp_comm_overlap:
            parts.append("tp-overlap")
        if self.cross_entropy_fusion:
            parts.append("fused-ce" if self.cross_entropy_fusion_impl == "native" else "te-ce")
        if self.moe_permute_fusion:
            parts.append("fused-permute")
        if self.moe_a2a_overlap:
            parts.append("a2a-overlap" + ("+delay-wgrad" if self.delay_wgrad_compute else ""))
        if self.moe_token_dispatcher != "alltoall":
            parts.append(self.moe_token_dispatcher)
        if self.cuda_device_max_connections is not None:
            parts.append(f"cdmc{self.cuda_device_max_connections}")
        if self.cpu_affinity != "inherit":
            parts.append("numa-bound")
        if self.manual_gc:
            parts.append("manual-gc")
        if self.moe_expert_capacity_factor is not None:
            parts.append(
                f"cap{self.moe_expert_capacity_factor:g}" + ("-pad" if self.moe_pad_expert_input_to_capacity else "")
            )
        return " ".join(parts)

    def replace(self, **changes: Any) -> Layout:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["recompute_modules"] = list(self.recompute_modules)
        data["cuda_graph_scope"] = list(self.cuda_graph_scope)
        if self.activation_offload is not None:
            data["activation_offload"]["modules"] = list(self.activation_offload.modules)
        for key in ("prompt_length", "response_length"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        reject_unknown_fields(cls, data, "layout")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError("layout", str(exc)) from exc

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Layout:
        """The layout of a committed run record as it ran (`ran_with_ddp_side_stream`,
        `ran_with_expandable_segments`)."""
        ran = {"ddp_side_stream": ran_with_ddp_side_stream(record)}
        ran["expandable_segments"] = ran_with_expandable_segments(record)
        return cls.from_dict({**record["layout"], **ran})

    @classmethod
    def from_configs(
        cls,
        model: str,
        parallel: ParallelConfig,
        workload: Workload,
        num_layers: int | None = None,
        options: Any = None,
        **extra: Any,
    ) -> Layout:
        """The layout of a planned candidate (`ParallelConfig` + `Workload`), packed sequences included: the
        token budget (`max_token_len`) and the prompt / response lengths with their seed, so that validating a
        packed plan runs it packed. Whole-sequence histograms have no [mean, max] form: ConfigError. `options`: the
        plan's `CostOptions`, whose run settings (overlaps, fusions, allocator) the layout then carries."""
        _check_runner_runs_moe(parallel, workload)
        rc = workload.recompute
        lengths = workload.lengths
        packing: dict[str, Any] = {"max_token_len": workload.max_token_len}
        if lengths is not None:
            if lengths.sequence is not None or lengths.prompt.is_histogram or lengths.response.is_histogram:
                raise ConfigError(
                    "lengths", "a layout holds prompt and response lengths as [mean, max]; a histogram cannot be run"
                )
            packing.update(
                prompt_length=(lengths.prompt.mean_tokens, lengths.prompt.max_tokens),
                response_length=(lengths.response.mean_tokens, lengths.response.max_tokens),
                length_seed=lengths.seed,
            )
        return cls(
            model=model,
            num_layers=num_layers,
            num_gpus=parallel.num_gpus,
            tp=parallel.tp,
            pp=parallel.pp,
            vpp=parallel.vpp,
            pipeline_layout=None if parallel.pipeline_layout is None else parallel.pipeline_layout.to_string(),
            cp=parallel.cp,
            ep=parallel.ep,
            etp=parallel.etp,
            sequence_parallel=parallel.sequence_parallel,
            cp_comm_type=parallel.cp_comm_type,
            use_distributed_optimizer=parallel.use_distributed_optimizer,
            grad_reduce_in_fp32=parallel.grad_reduce_in_fp32,
            seq_length=workload.seq_length,
            micro_batch_size=workload.micro_batch_size,
            global_batch_size=workload.global_batch_size,
            recompute=rc.granularity,
            recompute_method=rc.method,
            recompute_num_layers=rc.num_layers,
            recompute_modules=rc.modules,
            mode=workload.mode,
            precision=workload.precision,
            fp8_recipe=workload.fp8_recipe,
            fp8_param=workload.fp8_param,
            # the graph warm-up count is the layout's own (it changes no prediction)
            cuda_graph_impl=workload.cuda_graph.impl,
            cuda_graph_scope=workload.cuda_graph.scope,
            activation_offload=workload.activation_offload if workload.activation_offload.enabled else None,
            tp_comm_overlap=parallel.tp_comm_overlap,
            moe_a2a_overlap=parallel.moe_a2a_overlap,
            delay_wgrad_compute=parallel.delay_wgrad_compute,
            moe_token_dispatcher=parallel.moe_dispatcher,
            moe_expert_capacity_factor=workload.moe_routing.capacity_factor,
            moe_pad_expert_input_to_capacity=workload.moe_routing.pad_to_capacity,
            **{**packing, **run_settings(options), **extra},
        )


def _check_runner_runs_moe(parallel: ParallelConfig, workload: Workload) -> None:
    """The runner's MoE layers use the alltoall or allgather dispatcher and whatever routing the data gives: a layout
    predicted with another is refused rather than run as something else."""
    if parallel.moe_dispatcher not in RUNNER_DISPATCHERS:
        raise ConfigError("moe_dispatcher", f"the {parallel.moe_dispatcher} dispatcher is not run by mat validate")
    if workload.moe_routing.load_imbalance != 1.0:
        # the runner forces balanced routing (--moe-router-force-load-balancing)
        raise ConfigError("moe_load_imbalance", "a set routing imbalance is not run by mat validate")


def run_settings(options: Any) -> dict[str, Any]:
    """The Layout fields of what a `CostOptions` assumes the run executes; {} for None."""
    if options is None:
        return {}
    return {
        "overlap_grad_reduce": options.overlap_grad_reduce,
        "overlap_param_gather": options.overlap_param_gather,
        "expandable_segments": options.expandable_segments,
        "cross_entropy_fusion": options.fused_cross_entropy,
        "cross_entropy_fusion_impl": options.cross_entropy_fusion_impl,
        "gradient_accumulation_fusion": options.gradient_accumulation_fusion,
        "moe_permute_fusion": options.moe_permute_fusion,
    }


def load_layouts_file(path: str | Path) -> tuple[list[Layout], dict[str, Any]]:
    """Layouts from JSON: a list of layout objects, or {"defaults": {...}, "layouts": [...]}; also the
    `layouts.json` a run writes (entries {"layout_id": ..., "layout": {...}}), to report on or rerun it.

    Returns the layouts and the file's other top-level keys (e.g. "gpu").
    """
    from ..files import CONFIG_LIMIT_BYTES, read_json_bounded

    p = Path(path)
    data: Any = read_json_bounded(p, "layouts", CONFIG_LIMIT_BYTES)
    extra: dict[str, Any] = {}
    defaults: Any = {}
    if isinstance(data, dict):
        extra = {k: v for k, v in data.items() if k not in ("layouts", "defaults")}
        defaults = data.get("defaults") or {}
        data = data.get("layouts")
    if not isinstance(defaults, dict):
        raise ConfigError("layouts", f"{p}: 'defaults' must be an object of layout fields")
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise ConfigError(str(p), "must hold a list of layout objects (or {'defaults': {...}, 'layouts': [...]})")
    data = [x["layout"] if isinstance(x.get("layout"), dict) else x for x in data]
    layouts = []
    for i, x in enumerate(data):
        try:
            layouts.append(Layout.from_dict({**defaults, **x}))
        except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"layouts[{i}]", f"{p}: malformed layout ({' '.join(str(exc).split())})") from exc
    return layouts, extra
