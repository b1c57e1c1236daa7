"""`ParallelConfig`, `RecomputeConfig` and `Workload`, and Megatron-Core's rules for combining them.

Names follow megatron-core's `ModelParallelConfig` / `TransformerConfig` and Megatron-LM's arguments.
The rules in `validate_layout` are the ones `megatron.core.parallel_state.initialize_model_parallel`
and Megatron-LM's `arguments.py` enforce; each `ConfigError` names the field and the rule.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..errors import ConfigError
from .hashing import cached_hash
from .lengths import MAX_SAMPLED_SEQUENCES, PackedBatch, SequenceLengths, pack_micro_batches
from .model import ModelSpec
from .pipeline import PipelineLayout, even_layout

RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
# megatron-core TransformerConfig.recompute_modules (0.14+).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
PRECISIONS = ("bf16", "fp8")
# megatron-core TransformerConfig.offload_modules (Megatron-LM --offload-modules), the ones this tool models: each
# offloads the tensors autograd saves inside that submodule's forward (megatron/core/transformer/transformer_config.py
# `__post_init__` allowed_modules; "fused_group_mlp" and "gdp_qkv" are not modelled). Listed in the order a
# decoder layer runs them forward.
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
# megatron-core TransformerConfig.min_offloaded_tensor_size default: 1024 * 1024 elements.
DEFAULT_MIN_OFFLOADED_TENSOR_ELEMENTS = 1024 * 1024
# Megatron-LM's --fp8-recipe values this tool models: Transformer Engine's delayed scaling (scale from the amax
# history of earlier iterations) and per-tensor current scaling ("tensorwise", NVIDIA's FP8-CS recipes: the scale
# of each tensor from its own amax, an extra read of the tensor before the cast) and blockwise scaling
# (DeepSeek-V3 style: TE's Float8BlockScaling, one scale per 1x128 tile of activations and gradients and per 128x128
# tile of weights, blockwise-scaled GEMM kernels on Hopper). mxfp8 (Blackwell only) is not modelled.
FP8_RECIPES = ("delayed", "tensorwise", "blockwise")
MODES = ("train", "forward")
# Megatron-LM --cuda-graph-impl (megatron/core/transformer/transformer_config.py `cuda_graph_impl`, Megatron-LM
# @ d98e8a6 and megatron-core 0.19): no graphs; megatron-core's own per-layer CudaGraphManager; Transformer
# Engine's make_graphed_callables per layer (TECudaGraphHelper); one graph of the whole forward-backward
# (FullCudaGraphWrapper, megatron/core/full_cuda_graph.py).
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
# Megatron-LM --cuda-graph-modules (the renamed --cuda-graph-scope), megatron/core/transformer/enums.py
# `CudaGraphModule`; an empty list captures the whole layer (local / transformer_engine).
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
PER_LAYER_CUDA_GRAPH_IMPLS = ("local", "transformer_engine")


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(name, f"must be a positive integer, got {value!r}")


# Megatron-LM's MoE token dispatchers as `ParallelConfig.moe_dispatcher` names them: its default allgather, alltoall,
# and the flex dispatcher by backend (TransformerConfig.moe_token_dispatcher_type, Megatron-LM d98e8a6)
FLEX_DISPATCHER_BACKENDS = ("deepep", "hybridep")
MOE_DISPATCHERS = ("alltoall", "allgather", *FLEX_DISPATCHER_BACKENDS)


def moe_dispatcher_name(token_dispatcher_type: str, flex_backend: str | None, enable_deepep: bool = False) -> str:
    """`ParallelConfig.moe_dispatcher` of Megatron-LM's --moe-token-dispatcher-type and --moe-flex-dispatcher-backend:
    the flex dispatcher by its backend (megatron-core's default deepep, TransformerConfig.moe_flex_dispatcher_backend
    @ Megatron-LM d98e8a6), else the type's own name. `enable_deepep` (--moe-enable-deepep, deprecated) sets the
    backend to deepep and, as megatron-core's TransformerConfig does (core_v0.13.0 to core_v0.19.0), is refused
    without the flex dispatcher or beside the hybridep backend."""
    if enable_deepep:
        if token_dispatcher_type != "flex":
            raise ConfigError(
                "moe_enable_deepep", "needs --moe-token-dispatcher-type flex: DeepEP runs in the flex dispatcher only"
            )
        if flex_backend == "hybridep":
            raise ConfigError("moe_enable_deepep", "cannot go with --moe-flex-dispatcher-backend hybridep")
        flex_backend = "deepep"
    return (flex_backend or "deepep") if token_dispatcher_type == "flex" else token_dispatcher_type


# Megatron-LM --cross-entropy-fusion-impl: megatron-core's torch-compiled kernels (its default) or Transformer Engine's
CROSS_ENTROPY_FUSION_IMPLS = ("native", "te")


def check_cross_entropy_fusion_impl(impl: str) -> None:
    """One line for a fused cross-entropy kernel Megatron-LM does not have."""
    if impl not in CROSS_ENTROPY_FUSION_IMPLS:
        raise ConfigError("cross_entropy_fusion_impl", f"must be native or te, got {impl!r}")


@dataclass(frozen=True)
class ParallelConfig:
    """How a model is split over `num_gpus` GPUs. dp is derived: num_gpus / (tp * pp * cp).

    `etp` (expert tensor parallel) defaults to tp, as in megatron-core. `vpp` is the number of
    virtual pipeline chunks per rank (interleaved 1F1B); None means plain 1F1B.
    `grad_reduce_in_fp32` (megatron-core `DistributedDataParallelConfig.grad_reduce_in_fp32`): the
    main-grad buffer that accumulates and reduces gradients is fp32 (Megatron-LM's default with bf16);
    False is Megatron-LM's `--grad-reduce-in-bf16` (NVIDIA's fp8 and MoE performance recipes use it).
    `pipeline_layout`: how the layers split over the pp x vpp virtual stages when not evenly
    (`specs.pipeline.PipelineLayout`); None is Megatron's even split (`pipeline_layout_of` resolves it). A layout
    fixes vpp: it is taken from the layout when not given and must agree when given.
    `moe_a2a_overlap` / `delay_wgrad_compute`: Megatron-LM's --overlap-moe-expert-parallel-comm (the forward of one
    micro-batch and the backward of another run combined, each one's EP all-to-all beside the other's computation:
    `costmodel.moe_overlap`) and --delay-wgrad-compute (the experts' weight gradients after the backward dispatch).
    """

    num_gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    vpp: int | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = True
    grad_reduce_in_fp32: bool = True
    tp_comm_overlap: bool = False
    cp_comm_type: str = "p2p"  # p2p (ring) | a2a (Ulysses) | allgather
    pipeline_layout: PipelineLayout | None = None
    moe_a2a_overlap: bool = False
    delay_wgrad_compute: bool = False
    # Megatron-LM's MoE token dispatcher: alltoall, allgather (Megatron-LM's default: every token to every rank of the
    # expert group), or the flex dispatcher over DeepEP / HybridEP (--moe-token-dispatcher-type flex
    # --moe-flex-dispatcher-backend deepep | hybridep), which send a token to each other node once
    moe_dispatcher: str = "alltoall"

    __hash__ = cached_hash  # hashed once: the search's caches look it up constantly

    def __post_init__(self) -> None:
        for name in ("num_gpus", "tp", "pp", "cp", "ep"):
            _positive(name, getattr(self, name))
        layout = self.pipeline_layout
        if layout is not None:
            if not isinstance(layout, PipelineLayout):
                raise ConfigError("pipeline_layout", f"must be a PipelineLayout, got {type(layout).__name__}")
            if layout.pp != self.pp:
                raise ConfigError(
                    "pipeline_model_parallel_layout",
                    f"has {len(layout.stages)} virtual stages for pp={layout.pp}, the layout says pp={self.pp}",
                )
            if self.vpp not in (None, 1) and self.vpp != layout.vpp:
                raise ConfigError(
                    "vpp",
                    f"{self.vpp} conflicts with the pipeline layout's {len(layout.stages)} virtual stages / "
                    f"pp={self.pp} = {layout.vpp}",
                )
            object.__setattr__(self, "vpp", layout.vpp_or_none)
            if layout.form == "even":
                object.__setattr__(self, "pipeline_layout", None)
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        _positive("etp", self.etp)
        if self.vpp is not None:
            _positive("vpp", self.vpp)
            if self.vpp == 1:
                object.__setattr__(self, "vpp", None)
        if self.tp == 1 and self.sequence_parallel:
            # Megatron-LM turns sequence parallelism off when tp == 1 (nothing to split).
            object.__setattr__(self, "sequence_parallel", False)
        flags = ("sequence_parallel", "use_distributed_optimizer", "grad_reduce_in_fp32", "tp_comm_overlap",
                 "moe_a2a_overlap", "delay_wgrad_compute")  # fmt: skip
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        self._check_moe_a2a_overlap()
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            allowed = ", ".join(MOE_DISPATCHERS)
            raise ConfigError("moe_dispatcher", f"must be one of {allowed}, got {self.moe_dispatcher!r}")
        if self.cp_comm_type not in ("p2p", "a2a", "allgather"):
            raise ConfigError("cp_comm_type", f"must be p2p, a2a or allgather, got {self.cp_comm_type!r}")
        model_parallel = self.tp * self.pp * self.cp
        if self.num_gpus % model_parallel:
            raise ConfigError(
                "num_gpus",
                f"{self.num_gpus} is not divisible by tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {model_parallel}",
            )
        if self.vpp is not None and self.pp < 2:
            raise ConfigError("vpp", "an interleaved (virtual) pipeline needs pp >= 2")
        expert_span = self.etp * self.ep * self.pp
        if self.num_gpus % expert_span:
            raise ConfigError(
                "ep",
                f"num_gpus={self.num_gpus} must be divisible by etp*ep*pp = {self.etp}*{self.ep}*{self.pp}",
            )

    def _check_moe_a2a_overlap(self) -> None:
        """megatron-core TransformerConfig.__post_init__ (Megatron-LM d98e8a6): the EP all-to-all overlap needs
        expert parallelism, the alltoall or flex dispatcher and, with a pipeline, virtual stages; delayed wgrad needs
        the overlap."""
        if self.delay_wgrad_compute and not self.moe_a2a_overlap:
            raise ConfigError("delay_wgrad_compute", "needs moe_a2a_overlap (--overlap-moe-expert-parallel-comm)")
        if self.moe_a2a_overlap and self.ep < 2:
            raise ConfigError("moe_a2a_overlap", "needs expert parallelism (ep > 1)")
        if self.moe_a2a_overlap and self.pp > 1 and self.vpp is None:
            raise ConfigError("moe_a2a_overlap", "needs virtual pipeline stages (vpp) when pp > 1")
        if self.moe_a2a_overlap and self.moe_dispatcher == "allgather":
            raise ConfigError("moe_a2a_overlap", "needs the alltoall or flex dispatcher, not allgather")

    @property
    def dp(self) -> int:
        return self.num_gpus // (self.tp * self.pp * self.cp)

    @property
    def edp(self) -> int:
        """Expert data-parallel size: num_gpus / (etp * ep * pp) (megatron-core's expert grid)."""
        return self.num_gpus // (self.etp * self.ep * self.pp)

    @property
    def main_grad_bytes(self) -> int:
        """Bytes per element of the main-grad buffer: 4 (fp32) or 2 (bf16)."""
        return 4 if self.grad_reduce_in_fp32 else 2

    @property
    def virtual_stages(self) -> int:
        return self.vpp or 1

    def replace(self, **changes: Any) -> ParallelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["pipeline_layout"] = None if self.pipeline_layout is None else self.pipeline_layout.to_dict()
        return {**data, "dp": self.dp, "edp": self.edp}


@dataclass(frozen=True)
class RecomputeConfig:
    """Activation recomputation (megatron-core `recompute_granularity`, `_method`, `_num_layers`, `_modules`).

    granularity 'selective' recomputes `modules` (default: core_attn); 'full' checkpoints whole
    layers: method 'uniform' keeps the input of every group of `num_layers` layers, 'block'
    recomputes the first `num_layers` layers of each pipeline (virtual) stage.
    """

    granularity: str = "none"
    method: str = "uniform"
    num_layers: int = 1
    modules: tuple[str, ...] = ("core_attn",)

    def __post_init__(self) -> None:
        if self.granularity not in RECOMPUTE_GRANULARITIES:
            raise ConfigError(
                "recompute", f"must be one of {', '.join(RECOMPUTE_GRANULARITIES)}, got {self.granularity!r}"
            )
        if self.method not in RECOMPUTE_METHODS:
            raise ConfigError("recompute_method", f"must be uniform or block, got {self.method!r}")
        if not isinstance(self.num_layers, int) or self.num_layers < (0 if self.method == "block" else 1):
            raise ConfigError("recompute_num_layers", f"must be >= 1 (>= 0 for block), got {self.num_layers!r}")
        modules = tuple(self.modules)
        object.__setattr__(self, "modules", modules)
        bad = [m for m in modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise ConfigError(
                "recompute_modules", f"unknown module {bad[0]!r}; allowed: {', '.join(RECOMPUTE_MODULES)}"
            )

    @property
    def is_full(self) -> bool:
        return self.granularity == "full"

    def recomputes(self, module: str) -> bool:
        return self.granularity == "selective" and module in self.modules


def needs_nccl_graph_register_off(cuda_graph_impl: str, expandable_segments: bool) -> bool:
    """Whether a run needs NCCL_GRAPH_REGISTER=0: Megatron-LM refuses transformer_engine CUDA graphs beside
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True without it, "to avoid illegal memory access"
    (megatron/core/transformer/cuda_graphs.py, megatron/training/arguments.py)."""
    return cuda_graph_impl == "transformer_engine" and expandable_segments


# CUDA_DEVICE_MAX_CONNECTIONS beside the EP all-to-all overlap: the hardware queues that let the combined 1F1B step's
# communication and computation streams run side by side. Megatron-Bridge's performance scripts set 8 on Hopper with
# the alltoall dispatcher and 32 with DeepEP / HybridEP (scripts/performance/utils/overrides.py,
# `_apply_flat_cli_environment_compatibility`); Megatron-LM warns that the overlap "requires setting a larger
# CUDA_DEVICE_MAX_CONNECTIONS" (megatron/training/arguments.py @ d98e8a6).
A2A_OVERLAP_MAX_CONNECTIONS = {"alltoall": 8, "deepep": 32, "hybridep": 32}  # the dispatchers the overlap runs with


def check_cuda_device_max_connections(connections: object) -> None:
    """One line for a CUDA_DEVICE_MAX_CONNECTIONS outside CUDA's range (an integer 1-32); None passes (unset)."""
    if connections is not None and (
        isinstance(connections, bool) or not isinstance(connections, int) or not 1 <= connections <= 32
    ):
        raise ConfigError("cuda_device_max_connections", f"must be an integer 1-32 (CUDA's range), got {connections!r}")


def cuda_device_max_connections(parallel: ParallelConfig) -> int | None:
    """CUDA_DEVICE_MAX_CONNECTIONS a run of `parallel` needs: the all-to-all overlap's (`A2A_OVERLAP_MAX_CONNECTIONS`),
    else 1 with TP or CP (Megatron-LM's validate_args asserts it before Blackwell: one hardware queue keeps the TP / CP
    communication kernels in issue order), else None (the driver's default)."""
    if parallel.moe_a2a_overlap:
        return A2A_OVERLAP_MAX_CONNECTIONS[parallel.moe_dispatcher]
    if parallel.tp > 1 or parallel.cp > 1:
        return 1
    return None


@dataclass(frozen=True)
class CudaGraphConfig:
    """CUDA graphs of a megatron-core run (Megatron-LM `--cuda-graph-impl`, `--cuda-graph-modules` and
    `--cuda-graph-warmup-steps`; Megatron-Bridge `model.cuda_graph_impl` / `model.cuda_graph_scope`).

    `impl`: none | local | transformer_engine | full_iteration. `scope`: the per-layer capture modules
    (`CUDA_GRAPH_MODULES`); empty captures the whole layer with local / transformer_engine, and must be empty with
    full_iteration (megatron-core TransformerConfig.__post_init__, megatron/core/transformer/transformer_config.py
    @ d98e8a6). With impl none the scope has no effect and is dropped, as Megatron-LM warns. Normalised as
    megatron-core does: duplicates dropped, the deprecated "full" means the whole layer, and the local impl
    captures moe_router and moe_preprocess together ("local impl doesn't currently distinguish" them).
    `warmup_steps`: eager iterations before capture (Megatron-LM default 3; megatron/training/training.py captures
    at iteration start + warmup steps)."""

    impl: str = "none"
    scope: tuple[str, ...] = ()
    # changes when the graphs exist, not what a step costs: left out of equality (a layout and a plan compare equal)
    warmup_steps: int = field(default=3, compare=False)

    def __post_init__(self) -> None:
        if self.impl not in CUDA_GRAPH_IMPLS:
            raise ConfigError("cuda_graph_impl", f"must be one of {', '.join(CUDA_GRAPH_IMPLS)}, got {self.impl!r}")
        scope = (self.scope,) if isinstance(self.scope, str) else tuple(self.scope)
        if scope == ("full",):  # deprecated spelling of the whole layer (normalize_cuda_graph_modules)
            scope = ()
        if "full" in scope:
            raise ConfigError("cuda_graph_scope", "full cannot be used with other modules (megatron-core)")
        bad = [m for m in scope if m not in CUDA_GRAPH_MODULES]
        if bad:
            raise ConfigError(
                "cuda_graph_scope", f"unknown module {bad[0]!r}; allowed: {', '.join(CUDA_GRAPH_MODULES)}"
            )
        if self.impl == "none":
            scope = ()
        if self.impl == "full_iteration" and scope:
            raise ConfigError("cuda_graph_scope", "must be empty with cuda_graph_impl full_iteration (megatron-core)")
        if self.impl == "local" and {"moe_router", "moe_preprocess"} & set(scope):
            scope = (*scope, "moe_router", "moe_preprocess")
        scope = tuple(m for m in CUDA_GRAPH_MODULES if m in scope)
        object.__setattr__(self, "scope", scope)
        if "moe" in scope and "moe_router" in scope:
            raise ConfigError("cuda_graph_scope", "must not contain both moe and moe_router (megatron-core)")
        if "moe_preprocess" in scope and "moe_router" not in scope:
            raise ConfigError("cuda_graph_scope", "moe_preprocess needs moe_router (megatron-core)")
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise ConfigError("cuda_graph_warmup_steps", f"must be a non-negative integer, got {self.warmup_steps!r}")

    @property
    def enabled(self) -> bool:
        return self.impl != "none"

    @property
    def per_layer(self) -> bool:
        return self.impl in PER_LAYER_CUDA_GRAPH_IMPLS

    def captures(self, part: str, moe_layer: bool = False) -> bool:
        """Whether a graph covers `part` of a decoder layer: "attn", "mlp" (a dense layer's MLP), "moe" (a whole
        MoE block: router, dispatch, experts, combine), "moe_router" (the router and the shared experts) or
        "moe_preprocess". Per-layer graphs cover what megatron-core's TransformerLayer puts under them
        (`_get_submodules_under_cudagraphs`, megatron/core/transformer/transformer_layer.py @ core_r0.19.0): the
        whole layer with an empty scope, else the named modules; full_iteration covers everything."""
        if self.impl == "none":
            return False
        if self.impl == "full_iteration" or not self.scope:
            return True
        if part == "attn":
            return "attn" in self.scope
        if part == "mlp":
            return not moe_layer and "mlp" in self.scope
        if part == "moe":
            return moe_layer and "moe" in self.scope
        if part in ("moe_router", "moe_preprocess"):
            return moe_layer and (part in self.scope or "moe" in self.scope)
        raise ValueError(f"unknown layer part {part!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"impl": self.impl, "scope": list(self.scope), "warmup_steps": self.warmup_steps}


@dataclass(frozen=True)
class ActivationOffloadConfig:
    """Activation offloading to host memory: megatron-core's two mutually exclusive mechanisms.

    Layer-level (`num_layers` > 0: Megatron-LM --cpu-offloading-num-layers, which sets `cpu_offloading`;
    megatron/training/arguments.py): megatron-core wraps every decoder layer's forward in Transformer Engine's
    offload context (megatron/core/transformer/transformer_block.py `get_cpu_offload_context(cpu_offloading,
    cpu_offloading_num_layers, num_layers, ...)`), which moves every tensor a layer saves for backward (>= 256Ki
    elements, not parameters) of the model's first `num_layers` layers to pinned host memory
    (transformer_engine/pytorch/cpu_offload.py `DefaultOffloadSynchronizer`).

    Fine-grained (`modules` given: --fine-grained-activation-offloading --offload-modules ...): megatron-core's own
    manager (megatron/core/pipeline_parallel/fine_grained_activation_offload.py) moves, per decoder layer, the tensors
    saved inside each listed submodule with at least `min_tensor_elements` elements (--min-offloaded-tensor-size);
    `fraction` (--activation-offload-fraction) keeps the later groups of each model chunk on the GPU.
    """

    num_layers: int = 0
    modules: tuple[str, ...] = ()
    min_tensor_elements: int = DEFAULT_MIN_OFFLOADED_TENSOR_ELEMENTS
    fraction: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.num_layers, int) or isinstance(self.num_layers, bool) or self.num_layers < 0:
            raise ConfigError("cpu_offloading_num_layers", f"must be an integer >= 0, got {self.num_layers!r}")
        modules = tuple(self.modules)
        object.__setattr__(self, "modules", modules)
        bad = [m for m in modules if m not in OFFLOAD_MODULES]
        if bad:
            raise ConfigError("offload_modules", f"unknown module {bad[0]!r}; allowed: {', '.join(OFFLOAD_MODULES)}")
        if len(set(modules)) != len(modules):
            raise ConfigError("offload_modules", "lists a module twice")
        if self.num_layers and modules:
            # transformer_config.py: "fine_grained_activation_offloading cannot be enabled with cpu_offloading."
            raise ConfigError(
                "offload_modules", "fine-grained offloading cannot be combined with --cpu-offloading-num-layers"
            )
        if "attn_proj" in modules and "core_attn" not in modules:
            # transformer_config.py: the input of attn_proj is core_attn's output, which core_attn's backward needs
            raise ConfigError("offload_modules", "attn_proj cannot be offloaded without core_attn (megatron-core)")
        if not isinstance(self.min_tensor_elements, int) or self.min_tensor_elements < 0:
            raise ConfigError("min_offloaded_tensor_size", f"must be >= 0, got {self.min_tensor_elements!r}")
        if not isinstance(self.fraction, (int, float)) or not 0.0 <= self.fraction <= 1.0:
            raise ConfigError("activation_offload_fraction", f"must be in [0, 1], got {self.fraction!r}")

    @property
    def layer_level(self) -> bool:
        return self.num_layers > 0

    @property
    def fine_grained(self) -> bool:
        return bool(self.modules)

    @property
    def enabled(self) -> bool:
        return self.layer_level or self.fine_grained

    @property
    def label(self) -> str:
        """'none', 'layers=N' or 'modules=a,b'."""
        if self.layer_level:
            return f"layers={self.num_layers}"
        return "modules=" + ",".join(self.modules) if self.modules else "none"


@dataclass(frozen=True)
class MoeRouting:
    """How a MoE model's routed tokens spread over the expert-parallel ranks.

    `load_imbalance`: the busiest rank's routed tokens over the mean (1.0: balanced, as NVIDIA's MoE benchmarks force
    it with --moe-router-force-load-balancing). `capacity_factor` / `pad_to_capacity`: Megatron-LM's
    --moe-expert-capacity-factor / --moe-pad-expert-input-to-capacity (tokens past an expert's capacity are dropped;
    padded, every expert computes its whole capacity)."""

    load_imbalance: float = 1.0
    capacity_factor: float | None = None
    pad_to_capacity: bool = False

    def __post_init__(self) -> None:
        r, c = self.load_imbalance, self.capacity_factor
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 1.0 <= r < math.inf:
            raise ConfigError("moe_load_imbalance", f"must be a number >= 1 (busiest rank / mean), got {r!r}")
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 < c < math.inf):
            raise ConfigError("moe_expert_capacity_factor", f"must be a number > 0 (none: dropless), got {c!r}")
        if self.pad_to_capacity and c is None:
            # megatron-core TransformerConfig: padding to capacity needs a capacity factor
            raise ConfigError("moe_pad_expert_input_to_capacity", "needs --moe-expert-capacity-factor")

    @property
    def drop_and_pad(self) -> bool:
        """Every expert computes exactly its capacity: megatron-core's alltoall dispatcher then knows every split on
        the host and never waits for the GPU's token counts (token_dispatcher.py `preprocess`: drop_and_pad fills the
        counts with torch.full; dropless and plain dropping sync them to the host)."""
        return self.capacity_factor is not None and self.pad_to_capacity

    def expert_load(self, ep: int) -> float:
        """The busiest of `ep` expert-parallel ranks' routed tokens over the balanced mean: padded to capacity, the
        capacity factor c (every expert computes c x its mean share: megatron-core moe_utils.get_capacity); dropping,
        min(imbalance, c); dropless, the imbalance. One rank (ep = 1) holds every expert: no imbalance between ranks.
        It scales that rank's expert GEMMs, all-to-all and expert activations (an assumption: a rank's imbalance
        bounded by its experts' capacity)."""
        c = self.capacity_factor
        if c is not None and self.pad_to_capacity:
            return float(c)
        imbalance = self.load_imbalance if ep > 1 else 1.0
        return float(min(imbalance, c) if c is not None else imbalance)


@dataclass(frozen=True)
class Workload:
    """What one training (or forward-only) iteration processes.

    `max_token_len`, when set, is verl's dynamic batching: each micro-batch packs up to that many
    tokens per GPU (sequences of `seq_length` each at most), replacing the fixed micro-batch.
    `lengths` (with `max_token_len`): the sequences vary in length (`specs.lengths.SequenceLengths`); the
    `global_batch_size` sequences of a step are sampled from it and packed as verl packs them (`packed_batch`),
    and `seq_length` is the longest sequence there can be (>= `lengths.max_tokens`). Without `lengths`, every
    sequence is `seq_length` tokens long.
    `activation_offload`: activations moved to host memory during training (`ActivationOffloadConfig`).
    With precision fp8: `fp8_recipe` is Megatron-LM's `--fp8-recipe` (delayed | tensorwise | blockwise) and
    `fp8_param` its `--fp8-param-gather` (megatron-core `TransformerConfig.fp8_param` + DDP `fp8_param_gather`): the TE
    linear weights are stored in fp8 and all-gathered in fp8 instead of bf16.
    `cuda_graph`: the run's CUDA graphs (`CudaGraphConfig`; none by default).
    `image_tokens_per_sequence`: a vision-language model's data, one image per sequence of that many image tokens
    (part of the sequence's length; `theory.vision`); 0: text only.
    `moe_routing`: how a MoE model's tokens spread over the experts (`MoeRouting`; balanced and dropless by default).
    """

    seq_length: int
    micro_batch_size: int = 1
    global_batch_size: int = 1
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    precision: str = "bf16"
    mode: str = "train"
    max_token_len: int | None = None
    fp8_recipe: str = "delayed"
    fp8_param: bool = False
    lengths: SequenceLengths | None = None
    cuda_graph: CudaGraphConfig = field(default_factory=CudaGraphConfig)
    activation_offload: ActivationOffloadConfig = field(default_factory=ActivationOffloadConfig)
    image_tokens_per_sequence: int = 0
    moe_routing: MoeRouting = field(default_factory=MoeRouting)

    __hash__ = cached_hash  # hashed once: the search's caches look it up constantly

    def __post_init__(self) -> None:
        if not isinstance(self.cuda_graph, CudaGraphConfig):
            raise ConfigError("cuda_graph", f"must be a CudaGraphConfig, got {type(self.cuda_graph).__name__}")
        for name in ("seq_length", "micro_batch_size", "global_batch_size"):
            _positive(name, getattr(self, name))
        if not isinstance(self.moe_routing, MoeRouting):
            raise ConfigError("moe_routing", f"must be a MoeRouting, got {type(self.moe_routing).__name__}")
        images = self.image_tokens_per_sequence
        if isinstance(images, bool) or not isinstance(images, int) or not 0 <= images <= self.seq_length:
            raise ConfigError("image_tokens", f"must be an integer in 0..seq_length={self.seq_length}, got {images!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError("precision", f"must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(
                "fp8_recipe",
                f"must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r} (mxfp8 is not modelled)",
            )
        if self.fp8_recipe != "delayed" and self.precision != "fp8":
            raise ConfigError("fp8_recipe", f"{self.fp8_recipe!r} needs precision fp8, got {self.precision!r}")
        if not isinstance(self.fp8_param, bool):
            raise ConfigError("fp8_param", f"must be true or false, got {self.fp8_param!r}")
        if self.fp8_param and self.precision != "fp8":
            # megatron-core TransformerConfig: "fp8_param must be used together with fp8 mode."
            raise ConfigError("fp8_param", f"needs precision fp8, got {self.precision!r}")
        if self.mode not in MODES:
            raise ConfigError("mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.lengths is not None and self.global_batch_size > MAX_SAMPLED_SEQUENCES:
            raise ConfigError(
                "global_batch_size",
                f"{self.global_batch_size} sequences of varying length per step; at most {MAX_SAMPLED_SEQUENCES} "
                "are sampled and packed",
            )
        if self.max_token_len is not None:
            _positive("max_token_len", self.max_token_len)
            if self.max_token_len < self.seq_length:
                raise ConfigError(
                    "max_token_len",
                    f"{self.max_token_len} is below seq_length={self.seq_length}: a micro-batch holds whole "
                    "sequences (verl never splits one), so give max_token_len >= seq_length",
                )
        if self.mode == "forward" and self.recompute.granularity != "none":
            raise ConfigError("recompute", "must be none in forward mode (nothing is kept for a backward pass)")
        if not isinstance(self.activation_offload, ActivationOffloadConfig):
            raise ConfigError(
                "activation_offload", f"must be an ActivationOffloadConfig, got {self.activation_offload!r}"
            )
        if self.mode == "forward" and self.activation_offload.enabled:
            raise ConfigError("activation_offload", "must be off in forward mode (nothing is kept for a backward pass)")
        if self.activation_offload.layer_level and self.recompute.granularity != "none":
            # transformer_config.py: "CPU offloading does not work when activation recomputation is enabled"
            raise ConfigError(
                "cpu_offloading_num_layers", "does not work with activation recomputation (megatron-core)"
            )
        if self.activation_offload.fine_grained and self.recompute.is_full:
            raise ConfigError(
                "offload_modules",
                "fine-grained offloading with full recompute is not modelled (use selective recompute)",
            )
        if self.activation_offload.fine_grained and self.recompute.recomputes("moe"):
            moe_parts = {"expert_fc1", "moe_act"} & set(self.activation_offload.modules)
            if moe_parts:
                # transformer_config.py: 'moe' recompute checkpoints the whole MoE forward
                raise ConfigError(
                    "offload_modules", f"cannot offload {', '.join(sorted(moe_parts))} while recomputing the MoE layer"
                )
        if self.lengths is not None:
            if not isinstance(self.lengths, SequenceLengths):
                raise ConfigError("lengths", f"must be a SequenceLengths, got {type(self.lengths).__name__}")
            if self.max_token_len is None:
                raise ConfigError("lengths", "variable sequence lengths need max_token_len (verl's dynamic batching)")
            if self.seq_length < self.lengths.max_tokens:
                raise ConfigError(
                    "seq_length",
                    f"{self.seq_length} is below the longest sequence of the lengths ({self.lengths.max_tokens})",
                )

    def expert_load(self, ep: int) -> float:
        """The busiest of `ep` expert-parallel ranks' routed tokens over the mean (`MoeRouting.expert_load`)."""
        return self.moe_routing.expert_load(ep)

    @property
    def tokens_per_micro_batch(self) -> int:
        """Tokens in one micro-batch (on one data-parallel rank, before CP/TP splitting)."""
        if self.max_token_len is not None:
            return self.max_token_len
        return self.micro_batch_size * self.seq_length

    @property
    def is_training(self) -> bool:
        return self.mode == "train"

    @property
    def precision_label(self) -> str:
        """'bf16', 'fp8' (delayed scaling), 'fp8-tensorwise'; ' fp8-params' appended with fp8 parameters."""
        label = self.precision if self.fp8_recipe == "delayed" else f"{self.precision}-{self.fp8_recipe}"
        return label + (" fp8-params" if self.fp8_param else "")

    def replace(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        skip = ("lengths", "activation_offload", "moe_routing")
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        data["recompute"] = dataclasses.asdict(self.recompute)
        data["cuda_graph"] = self.cuda_graph.to_dict()
        if self.activation_offload.enabled:
            data["activation_offload"] = dataclasses.asdict(self.activation_offload)
        if self.moe_routing != MoeRouting():
            data["moe_routing"] = dataclasses.asdict(self.moe_routing)
        if self.lengths is not None:
            data["lengths"] = self.lengths.to_dict()
        return data


def thd_alignment(parallel: ParallelConfig, workload: Workload) -> tuple[int, int]:
    """(per-sequence, per-micro-batch) token multiples a packed (THD) micro-batch is padded to.

    verl pads each sequence to a multiple of tp*cp*2 with CP (each CP rank takes 2 of 2cp chunks, load-balanced
    for causal masks) and of tp without (sequence parallelism splits the packed tokens over TP)
    (verl/models/mcore/util.py `preprocess_packed_seqs` / `preprocess_thd_engine`; megatron-core pads the same
    way: megatron/core/models/multimodal/context_parallel.py `get_padding`, tp*cp*2 with CP + SP). With fp8
    (`use_fp8_padding`) each sequence goes to a multiple of lcm(16, that) and the micro-batch to one of that x 128
    (`_compute_fp8_thd_align_size`, for Transformer Engine's fp8 GEMMs).
    """
    tp, cp = parallel.tp, parallel.cp
    align = tp * cp * 2 if cp > 1 else tp
    if workload.precision == "fp8":
        return math.lcm(16, align), align * 128
    return align, 1


def vpp_micro_batch_group(parallel: ParallelConfig) -> int | None:
    """verl rounds the micro-batch count up to a multiple of megatron-core's `microbatch_group_size_per_vp_stage`
    (default pp: megatron/core/model_parallel_config.py) with an interleaved pipeline, else leaves it."""
    return parallel.pp if parallel.vpp is not None else None


@lru_cache(maxsize=1024)
def _packed(lengths: SequenceLengths, sequences: int, max_token_len: int, dp: int, group: int | None) -> PackedBatch:
    return pack_micro_batches(lengths.sample(sequences), max_token_len, dp=dp, num_batches_divided_by=group)


def packed_batch(parallel: ParallelConfig, workload: Workload, padded: bool = True) -> PackedBatch | None:
    """The micro-batches of one step with variable lengths (None without `workload.lengths`): the
    `global_batch_size` sampled sequences packed over the dp ranks as verl does (`specs.lengths`), each sequence
    padded to `thd_alignment` when `padded`."""
    if workload.lengths is None:
        return None
    return _packed_batch(parallel, workload, padded)


@lru_cache(maxsize=8192)  # a search asks for each layout's packing ~30 times (memory per stage and layer, time)
def _packed_batch(parallel: ParallelConfig, workload: Workload, padded: bool) -> PackedBatch:
    if workload.global_batch_size % parallel.dp:
        raise ConfigError(
            "global_batch_size",
            f"{workload.global_batch_size} must be divisible by dp={parallel.dp} (verl splits the sequences equally)",
        )
    batch = _packed(
        workload.lengths,
        workload.global_batch_size,
        workload.max_token_len,
        parallel.dp,
        vpp_micro_batch_group(parallel),
    )
    return batch.padded(*thd_alignment(parallel, workload)) if padded else batch


def num_microbatches(parallel: ParallelConfig, workload: Workload) -> int:
    """Micro-batches per iteration per data-parallel rank: global / (micro x dp).

    With `max_token_len` the count is the tokens of the global batch on one DP rank divided by the
    tokens one micro-batch packs, rounded up; with `lengths`, the count verl's packing makes (`packed_batch`).
    """
    if workload.lengths is not None:
        return packed_batch(parallel, workload, padded=False).num_micro_batches
    if workload.max_token_len is not None:
        tokens_per_dp_rank = workload.global_batch_size * workload.seq_length // parallel.dp
        return max(1, -(-tokens_per_dp_rank // workload.max_token_len))
    return workload.global_batch_size // (workload.micro_batch_size * parallel.dp)


def pipeline_layout_of(model: ModelSpec, parallel: ParallelConfig) -> PipelineLayout:
    """The layout `parallel` names, else Megatron's even split of the model's layers (raises `ConfigError` when
    num_layers is not divisible by pp x vpp)."""
    if parallel.pipeline_layout is not None:
        return parallel.pipeline_layout
    return even_layout(model.num_layers, parallel.pp, parallel.vpp, model.mtp_num_layers)


def layers_per_stage(model: ModelSpec, parallel: ParallelConfig) -> list[int]:
    """Decoder layers held by each pipeline rank (all its virtual stages)."""
    layout = pipeline_layout_of(model, parallel)
    return [len(layout.rank_layers(r)) for r in range(parallel.pp)]


def check_moe_a2a_overlap(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> None:
    """What megatron-core asserts of the EP all-to-all overlap beyond the layout (TransformerConfig.__post_init__,
    Megatron-LM d98e8a6): no full recompute and no recomputed MoE block, at most one MTP layer (a MoE model: the
    expert parallelism it needs is checked with the layout)."""
    if not parallel.moe_a2a_overlap:
        return
    rc = workload.recompute
    if workload.is_training and (rc.is_full or (rc.granularity == "selective" and "moe" in rc.modules)):
        raise ConfigError("moe_a2a_overlap", "is refused with full recompute or the moe module recomputed")
    if model.mtp_num_layers > 1:
        raise ConfigError("moe_a2a_overlap", "supports at most one MTP layer")


def check_tp_comm_overlap(parallel: ParallelConfig) -> None:
    """TE userbuffers overlap the sequence-parallel collectives: `tp_comm_overlap` needs sequence parallelism."""
    if parallel.tp_comm_overlap and not parallel.sequence_parallel:
        raise ConfigError("tp_comm_overlap", "needs sequence_parallel (TE userbuffers overlap the SP collectives)")


def cp_comm_type_for(model: ModelSpec, cp: int) -> str:
    """The context-parallel exchange a model's attention runs with: a2a (Ulysses) for sliding windows and attention
    sinks, which TE's ring (p2p) does not run (`check_cp_attention`; Megatron-Bridge's MistralBridge sets a2a for
    the same reason); p2p, Megatron's default, otherwise."""
    if cp > 1 and (model.window_size or model.softmax_type != "vanilla"):
        return "a2a"
    return "p2p"


def check_cp_attention(model: ModelSpec, parallel: ParallelConfig) -> None:
    """TE's context parallelism runs a sliding window only with a2a or all-gather, and a softmax other than vanilla
    (attention sinks) only with a2a; a2a splits the heads of each TP rank over cp
    (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py @ d0067d0:
    `assert not sliding_window_attn or cp_comm_type in ["a2a", "all_gather"]`,
    `assert softmax_type == "vanilla" or cp_comm_type == "a2a"`, heads % cp_size for a2a)."""
    cp, kind = parallel.cp, parallel.cp_comm_type
    if cp == 1:
        return
    if model.window_size and kind not in ("a2a", "allgather"):
        raise ConfigError("cp_comm_type", f"{kind}: sliding-window attention with cp > 1 runs with a2a or allgather")
    if model.softmax_type != "vanilla" and kind != "a2a":
        raise ConfigError("cp_comm_type", f"{kind}: softmax_type {model.softmax_type} with cp > 1 runs with a2a only")
    heads = model.num_attention_heads // parallel.tp
    if kind == "a2a" and heads % cp:
        raise ConfigError(
            "cp", f"a2a context parallelism splits the {heads} heads of a TP rank: cp={cp} must divide them"
        )


def _check_moe_routing(model: ModelSpec, ep: int, routing: MoeRouting) -> None:
    """The routing's bounds on this model and EP size: the busiest of ep > 1 ranks takes at most every routed token,
    ep x the mean (one rank has no imbalance between ranks: `MoeRouting.expert_load`); padded, an expert's capacity
    (capacity factor x T x top-k / experts rows, megatron-core moe_utils.get_capacity) past the micro-batch's T tokens
    holds padding only, which the tool refuses as a likely mistake (megatron-core would pad to it)."""
    if ep > 1 and routing.load_imbalance > ep:
        raise ConfigError(
            "moe_load_imbalance", f"must be <= ep ({ep}): the busiest of ep ranks takes at most ep x the mean"
        )
    bound = model.num_moe_experts / model.moe_router_topk
    if routing.drop_and_pad and routing.capacity_factor > bound:
        raise ConfigError(
            "moe_expert_capacity_factor",
            f"must be <= num_moe_experts / moe_router_topk = {bound:g} when padded: past it each expert's capacity "
            "exceeds the micro-batch's tokens",
        )


def validate_layout(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> None:
    """Raise `ConfigError` if megatron-core would refuse this model / layout / workload combination."""
    tp, pp, cp, ep, etp = parallel.tp, parallel.pp, parallel.cp, parallel.ep, parallel.etp
    if model.num_attention_heads % tp:
        raise ConfigError("tp", f"num_attention_heads={model.num_attention_heads} must be divisible by tp={tp}")
    g = model.num_query_groups
    if g % tp and tp % g and not model.multi_latent_attention:
        # megatron-core TransformerConfig.__post_init__: "must be a multiple or divisor of tensor_model_parallel_size"
        raise ConfigError("tp", f"num_query_groups={g} must be a multiple or a divisor of tp={tp}")
    if model.has_linear_attention:
        # Megatron-LM d98e8a6 TransformerConfig: gated-DeltaNet key and value heads split over tp x cp
        for name in ("linear_num_key_heads", "linear_num_value_heads"):
            if getattr(model, name) % (tp * cp):
                raise ConfigError("tp", f"{name}={getattr(model, name)} must be divisible by tp*cp = {tp}*{cp}")
    if "M" in model.hybrid_layer_pattern:
        # megatron-core MambaMixer: heads and groups split over tp; MambaContextParallel: the heads of a TP rank over
        # cp, its groups over cp or cp a multiple of them
        heads, groups = model.mamba_num_heads, model.mamba_num_groups
        if heads % tp or groups % tp:
            raise ConfigError(
                "tp", f"mamba_num_heads={heads} and mamba_num_groups={groups} must be divisible by tp={tp}"
            )
        if heads % (tp * cp) or (groups // tp % cp and cp % (groups // tp)):
            raise ConfigError(
                "cp", f"Mamba's {heads // tp} heads and {groups // tp} groups per TP rank do not split over cp={cp}"
            )
    if parallel.pipeline_layout is None:
        if model.num_layers % pp:
            raise ConfigError(
                "pp",
                f"num_layers={model.num_layers} must be divisible by pp={pp} (or give an uneven pipeline layout)",
            )
        if parallel.vpp is not None and (model.num_layers // pp) % parallel.vpp:
            raise ConfigError(
                "vpp", f"layers per pipeline stage ({model.num_layers // pp}) must be divisible by vpp={parallel.vpp}"
            )
    else:
        parallel.pipeline_layout.check_model(model.num_layers, model.mtp_num_layers)
    if model.is_moe:
        if model.num_moe_experts % ep:
            raise ConfigError("ep", f"num_moe_experts={model.num_moe_experts} must be divisible by ep={ep}")
        if model.moe_ffn_hidden_size % etp:
            raise ConfigError("etp", f"moe_ffn_hidden_size={model.moe_ffn_hidden_size} must be divisible by etp={etp}")
        if ep > 1 and tp > 1 and not parallel.sequence_parallel:
            raise ConfigError("sequence_parallel", "must be on when an MoE model uses both ep > 1 and tp > 1")
        _check_moe_routing(model, ep, workload.moe_routing)
    else:
        if ep > 1:
            raise ConfigError("ep", "expert parallelism needs an MoE model (num_moe_experts > 0)")
        if workload.moe_routing.load_imbalance != 1.0:
            raise ConfigError("moe_load_imbalance", "needs an MoE model (num_moe_experts > 0)")
        if etp != tp:
            raise ConfigError("etp", "expert tensor parallelism needs an MoE model")
    if model.ffn_hidden_size % tp:
        raise ConfigError("tp", f"ffn_hidden_size={model.ffn_hidden_size} must be divisible by tp={tp}")
    seq = workload.seq_length
    packed = workload.lengths is not None  # THD: each sequence is padded to `thd_alignment` instead
    if packed:
        packed_batch(parallel, workload, padded=False)  # raises when verl could not pack the step
    check_cp_attention(model, parallel)
    if cp > 1 and seq % (2 * cp) and not packed:
        raise ConfigError("seq_length", f"{seq} must be divisible by 2*cp = {2 * cp} (load-balanced context parallel)")
    if parallel.sequence_parallel and (seq // cp) % tp and not packed:
        raise ConfigError(
            "seq_length", f"seq_length/cp = {seq // cp} must be divisible by tp={tp} with sequence parallel"
        )
    check_tp_comm_overlap(parallel)
    check_moe_a2a_overlap(model, parallel, workload)
    if workload.fp8_param and workload.is_training and not parallel.use_distributed_optimizer:
        # Megatron-LM validate_args: --fp8-param-gather needs the distributed optimizer (or FSDP) when training.
        raise ConfigError("fp8_param", "needs the distributed optimizer when training (Megatron-LM --fp8-param-gather)")
    if workload.max_token_len is None:
        per_step = workload.micro_batch_size * parallel.dp
        if workload.global_batch_size % per_step:
            raise ConfigError(
                "global_batch_size",
                f"{workload.global_batch_size} must be divisible by micro_batch_size*dp = "
                f"{workload.micro_batch_size}*{parallel.dp} = {per_step}",
            )
    if parallel.vpp is not None and workload.is_training:
        m = num_microbatches(parallel, workload)
        if m % pp:
            raise ConfigError(
                "global_batch_size",
                f"the interleaved schedule needs the number of micro-batches ({m}) divisible by pp={pp}",
            )
    offload = workload.activation_offload
    if offload.layer_level:
        # megatron-core TransformerConfig.__post_init__ (cpu_offloading)
        if offload.num_layers >= model.num_layers:
            raise ConfigError(
                "cpu_offloading_num_layers", f"{offload.num_layers} must be below num_layers={model.num_layers}"
            )
        if pp > 1:
            raise ConfigError("cpu_offloading_num_layers", "no support for pipeline parallelism with CPU offloading")
    rc = workload.recompute
    if rc.is_full:
        # megatron-core checkpoints within each model chunk: groups of recompute_num_layers (uniform), or the
        # chunk's first recompute_num_layers layers (block)
        counts = pipeline_layout_of(model, parallel).decoder_counts
        bad = next((n for n in counts if n % rc.num_layers), None) if rc.method == "uniform" else None
        if bad is not None:
            raise ConfigError(
                "recompute_num_layers",
                f"layers per pipeline chunk ({bad}) must be divisible by {rc.num_layers} with method uniform",
            )
        if rc.method == "block" and rc.num_layers > max(counts):
            raise ConfigError(
                "recompute_num_layers", f"{rc.num_layers} exceeds the {max(counts)} layers of a pipeline chunk"
            )
    if rc.granularity == "selective":
        if "mla_up_proj" in rc.modules and not model.multi_latent_attention:
            raise ConfigError("recompute_modules", "mla_up_proj needs a multi-latent-attention model")
        if {"moe", "moe_act"} & set(rc.modules) and not model.is_moe:
            raise ConfigError("recompute_modules", "moe / moe_act need an MoE model")
        if "shared_experts" in rc.modules and not model.moe_shared_expert_intermediate_size:
            raise ConfigError("recompute_modules", "shared_experts needs a model with shared experts")
    validate_cuda_graphs(model, workload, parallel.moe_dispatcher)


def check_moe_graph_routing(scope: set[str] | tuple[str, ...], routing: MoeRouting, moe_dispatcher: str | None) -> None:
    """What megatron-core refuses of per-layer graphs over a MoE block given its routing: the whole block (`moe`)
    only when it drops and pads; the dispatcher's preprocess (`moe_preprocess`) not where the alltoall dispatcher
    drops without padding, which syncs the token counts to the host before the permute (TransformerConfig,
    token_dispatcher.py @ Megatron-LM d98e8a6)."""
    if "moe" in scope and not routing.drop_and_pad:
        raise ConfigError("cuda_graph_scope", "moe graphs need drop-and-pad MoE (megatron-core)")
    dropping = routing.capacity_factor is not None and not routing.drop_and_pad
    if moe_dispatcher == "alltoall" and "moe_preprocess" in scope and dropping:
        raise ConfigError(
            "cuda_graph_scope",
            "moe_preprocess graphs do not work with the alltoall dispatcher's host syncs here (megatron-core)",
        )


def validate_cuda_graphs(model: ModelSpec, workload: Workload, moe_dispatcher: str | None = None) -> None:
    """Raise `ConfigError` where megatron-core refuses the workload's CUDA graphs for this model, routing and
    recompute (TransformerConfig.__post_init__, megatron/core/transformer/transformer_config.py @ d98e8a6, the same in
    core_r0.19.0). Rules that need launch flags the specs do not hold (--moe-router-padding-for-fp8,
    --no-check-for-nan-in-loss-and-grad, CPU offloading, the allocator / NCCL environment) are checked where the
    launch is read (`specs.megatron_args.launch_to_specs`)."""
    graphs, rc = workload.cuda_graph, workload.recompute
    if not graphs.enabled:
        return
    scope = set(graphs.scope)
    if workload.max_token_len is not None:
        # a graph replays fixed shapes: TECudaGraphHelper captures seq_length x micro_batch_size inputs, the
        # full-iteration graph the first batches' static buffers (StaticBufferLoader); packed micro-batches vary
        raise ConfigError(
            "cuda_graph_impl", "CUDA graphs need fixed micro-batch shapes, not packed ones (max_token_len)"
        )
    if graphs.per_layer:
        if not model.is_moe and scope & {"moe", "moe_router"}:
            raise ConfigError("cuda_graph_scope", "moe / moe_router graphs need an MoE model (megatron-core)")
        if model.is_moe:
            check_moe_graph_routing(scope, workload.moe_routing, moe_dispatcher)
        if model.is_moe and "mlp" in scope and not any(not model.is_moe_layer(i) for i in range(model.num_layers)):
            raise ConfigError(
                "cuda_graph_scope", "mlp graphs capture dense layers only, and every layer is MoE (megatron-core)"
            )
    if rc.granularity == "full" and graphs.impl != "full_iteration":
        raise ConfigError("recompute", "full recompute works only with cuda_graph_impl full_iteration (megatron-core)")
    if rc.granularity == "selective":
        modules = set(rc.modules)
        if graphs.impl == "transformer_engine" and "moe" in modules and "moe_router" in scope:
            raise ConfigError(
                "recompute_modules", "moe recompute does not work with transformer_engine moe_router graphs"
            )
        whole = graphs.impl == "full_iteration" or not scope  # the whole layer is captured
        # graphed recomputation cannot draw random numbers (dropout) in megatron-core
        if model.attention_dropout and "core_attn" in modules and (whole or "attn" in scope):
            raise ConfigError("recompute_modules", "attention dropout with graphed core_attn recompute (megatron-core)")
        if model.hidden_dropout and (
            ("mlp" in modules and (whole or "mlp" in scope)) or ("moe" in modules and (whole or "moe" in scope))
        ):
            raise ConfigError("recompute_modules", "hidden dropout with graphed mlp / moe recompute (megatron-core)")
