"""`ModelSpec`: the shape of a decoder-only transformer, as megatron-core's `TransformerConfig` sees it.

Field names follow megatron-core (`num_query_groups`, `kv_channels`, `ffn_hidden_size`,
`num_moe_experts`, ...) so a reader can map them one to one onto a `TransformerConfig`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError, reject_unknown_fields
from .hashing import cached_hash
from .vision import VisionEncoder

ACTIVATIONS = ("silu", "gelu", "relu", "squared_relu", "quick_gelu")
# megatron-core hybrid layer pattern symbols: M Mamba-2, * attention, - MLP, E MoE (0.16.1
# ssm/mamba_hybrid_layer_allocation.py Symbols), G gated DeltaNet (Megatron-LM d98e8a6
# models/hybrid/hybrid_layer_allocation.py)
HYBRID_SYMBOLS = ("M", "*", "-", "E", "G")
# the Mamba-2 mixer's depthwise conv1d width: megatron-core's MambaLayer builds MambaMixer with its default d_conv=4
# (ssm/mamba_mixer.py @ 0.16.1), and Megatron-Bridge maps no conv_kernel
MAMBA_CONV_KERNEL = 4
NORMALIZATIONS = ("RMSNorm", "LayerNorm")
POSITION_EMBEDDINGS = ("rope", "learned_absolute", "none")
# megatron-core TransformerConfig.softmax_type: "learnable" adds one sink logit per head and layer (softmax_offset)
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
# The deepest decoder read (published models have under 200 layers): a deeper one from a flag, a config.json or a
# launch is refused before any per-layer list is built (10^18 layers ran out of memory, 10^6 took minutes; #39).
MAX_NUM_LAYERS = 10_000


def check_num_layers(value: object, field: str = "num_layers") -> int:
    """`value` as a decoder layer count: a positive integer up to MAX_NUM_LAYERS, else a `ConfigError` naming
    `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(field, f"must be a positive integer, got {value!r}")
    if value > MAX_NUM_LAYERS:
        raise ConfigError(field, f"{value} layers is above the limit of {MAX_NUM_LAYERS}")
    return value


def router_group_fields(groups: int, group_topk: int) -> dict[str, int]:
    """`ModelSpec`'s group-limited routing fields from a config's group count and groups per token (HF n_group /
    topk_group, Megatron-LM --moe-router-num-groups / --moe-router-group-topk): one group (or none) is no limit."""
    if groups <= 1:
        return {"moe_router_num_groups": 0, "moe_router_group_topk": 0}
    return {"moe_router_num_groups": groups, "moe_router_group_topk": group_topk}


@dataclass(frozen=True)
class ModelSpec:
    """Everything the analytical model needs to know about a GPT-style model.

    Dense models leave the MoE fields at 0; models without MLA leave `multi_latent_attention`
    False. `moe_layer_pattern` holds one entry per decoder layer: 1 for an MoE layer, 0 for a
    dense one (megatron-core's list form of `moe_layer_freq`); empty means "every layer" when
    `num_moe_experts > 0`.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_query_groups: int | None = None  # None -> = num_attention_heads (plain MHA)
    kv_channels: int | None = None  # head dim; None -> hidden_size // num_attention_heads
    gated_linear_unit: bool = True  # SwiGLU-style fc1 (two halves)
    activation: str = "silu"
    normalization: str = "RMSNorm"
    add_bias_linear: bool = False  # bias on every linear layer (GPT-2 style)
    add_qkv_bias: bool = False  # bias on QKV only (Qwen2)
    qk_layernorm: bool = False  # per-head RMSNorm of Q and K (Qwen3)
    tie_embeddings: bool = False
    position_embedding_type: str = "rope"
    max_position_embeddings: int = 4096
    # Megatron-LM's --make-vocab-size-divisible-by: the vocabulary is padded to a multiple of this x tp
    make_vocab_size_divisible_by: int = 128
    # Dropout probabilities matter for activation memory (dropout masks are stored).
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    # Mixture of experts.
    num_moe_experts: int = 0
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    moe_shared_expert_gate: bool = False
    moe_layer_pattern: tuple[int, ...] = field(default_factory=tuple)
    # Group-limited routing (Megatron-LM --moe-router-num-groups / --moe-router-group-topk, HF n_group / topk_group):
    # the experts in num_groups equal groups of consecutive experts, a token's top-k picked inside its group_topk best
    # groups (DeepSeek-V3: 8 groups, 4 of them, so that a token reaches at most 4 nodes). 0: not group-limited.
    moe_router_num_groups: int = 0
    moe_router_group_topk: int = 0
    # Multi-latent attention (DeepSeek-V2/V3).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_head_dim: int = 0  # "nope" part of the query/key head
    qk_pos_emb_head_dim: int = 0  # rope part of the query/key head
    v_head_dim: int = 0
    # Multi-token prediction layers (DeepSeek-V3: 1).
    mtp_num_layers: int = 0
    # Sliding-window attention: the keys a query sees, itself included (HF `sliding_window`; Megatron-LM
    # `--window-size window_size-1,0`); 0 = full causal attention. `window_layer_pattern`: one entry per layer, 1 for
    # a sliding-window layer, 0 for full attention (megatron-core's list form of `window_attn_skip_freq`); empty
    # means every layer when `window_size` > 0.
    window_size: int = 0
    window_layer_pattern: tuple[int, ...] = field(default_factory=tuple)
    softmax_type: str = "vanilla"
    # gpt-oss's clamped GLU (megatron-core glu_linear_offset / activation_func_clamp_value): elementwise, no matmul
    glu_linear_offset: float = 0.0
    activation_clamp_value: float | None = None
    # Gated DeltaNet linear attention (Qwen3-Next; megatron-core experimental_attention_variant="gated_delta_net",
    # ssm/gated_delta_net.py): `linear_attention_pattern` has one entry per layer, 1 for a gated-DeltaNet layer and 0
    # for softmax attention (megatron-core's list form of `linear_attention_freq`); empty: no linear attention.
    linear_attention_pattern: tuple[int, ...] = field(default_factory=tuple)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # Hybrid Mamba models (Nemotron-H; megatron-core MambaModel): `hybrid_layer_pattern` is megatron-core's
    # hybrid_override_pattern, one symbol per layer (ssm/mamba_hybrid_layer_allocation.py): M a Mamba-2 mixer, G a
    # gated-DeltaNet mixer (its sizes the linear_* fields), * self-attention, - an MLP, E a MoE block, each a layer of
    # its own with its own input norm; empty: a GPT model.
    hybrid_layer_pattern: str = ""
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state_dim: int = 0
    mamba_num_groups: int = 0
    # a sigmoid gate on softmax attention's output (megatron-core attention_output_gate; Qwen3-Next): linear_qkv
    # also projects heads x head dim gate values (transformer/attention.py SelfAttention.linear_qkv_out_dim)
    attention_output_gate: bool = False
    # False: every token attends to every other (a vision tower's blocks; megatron-core AttnMaskType.no_mask)
    causal_attention: bool = True
    # a vision-language model's vision tower (`specs.vision.VisionEncoder`), on the first pipeline stage; None for
    # a language model
    vision: VisionEncoder | None = None

    __hash__ = cached_hash  # hashed once: the search's caches look it up constantly

    def __post_init__(self) -> None:
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    "kv_channels", "must be given when hidden_size is not divisible by num_attention_heads"
                )
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)
        object.__setattr__(self, "moe_layer_pattern", tuple(int(x) for x in self.moe_layer_pattern))
        object.__setattr__(self, "window_layer_pattern", tuple(int(x) for x in self.window_layer_pattern))
        object.__setattr__(self, "linear_attention_pattern", tuple(int(x) for x in self.linear_attention_pattern))
        if isinstance(self.vision, dict):
            object.__setattr__(self, "vision", VisionEncoder.from_dict(self.vision))
        self.validate()

    # ---- validation -------------------------------------------------------------------------
    def validate(self) -> None:
        names = ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size", "vocab_size", "kv_channels")
        for name in (*names, "make_vocab_size_divisible_by"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        check_num_layers(self.num_layers)
        # every other count and size too: a config.json's head_dim or num_experts of 1e308, inf or NaN divided by
        # zero, overflowed or, as an expert count, made a search that exhausted memory (#39)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type not in ("int", "int | None") or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f.name, f"must be an integer >= 0, got {value!r}")
        if self.num_query_groups <= 0 or self.num_attention_heads % self.num_query_groups:
            raise ConfigError(
                "num_query_groups",
                f"must divide num_attention_heads={self.num_attention_heads}, got {self.num_query_groups}",
            )
        if self.activation not in ACTIVATIONS:
            raise ConfigError("activation", f"must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(
                "normalization", f"must be one of {', '.join(NORMALIZATIONS)}, got {self.normalization!r}"
            )
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ConfigError(
                "position_embedding_type",
                f"must be one of {', '.join(POSITION_EMBEDDINGS)}, got {self.position_embedding_type!r}",
            )
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(name, "must be in [0, 1)")
        if self.num_moe_experts < 0:
            raise ConfigError("num_moe_experts", "must be >= 0")
        if self.num_moe_experts:
            if not 0 < self.moe_router_topk <= self.num_moe_experts:
                raise ConfigError("moe_router_topk", f"must be in 1..num_moe_experts={self.num_moe_experts}")
            if self.moe_ffn_hidden_size <= 0:
                raise ConfigError("moe_ffn_hidden_size", "must be > 0 for an MoE model")
            if self.moe_layer_pattern and len(self.moe_layer_pattern) != self.num_layers:
                raise ConfigError(
                    "moe_layer_pattern",
                    f"needs one entry per layer ({self.num_layers}), got {len(self.moe_layer_pattern)}",
                )
            if self.moe_layer_pattern and set(self.moe_layer_pattern) - {0, 1}:
                raise ConfigError("moe_layer_pattern", "entries must be 0 (dense) or 1 (MoE)")
            self._check_router_groups()
        elif self.moe_layer_pattern and any(self.moe_layer_pattern):
            raise ConfigError("moe_layer_pattern", "marks MoE layers but num_moe_experts is 0")
        if self.multi_latent_attention:
            for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
                if getattr(self, name) <= 0:
                    raise ConfigError(name, "must be > 0 with multi_latent_attention")
        if self.mtp_num_layers < 0:
            raise ConfigError("mtp_num_layers", "must be >= 0")
        if self.mtp_num_layers > MAX_NUM_LAYERS:  # decoder layers too (2^31 of them ran out of memory; #39)
            raise ConfigError("mtp_num_layers", f"{self.mtp_num_layers} layers is above the limit of {MAX_NUM_LAYERS}")
        self._validate_attention_window()
        self._validate_linear_attention()
        self._validate_hybrid()
        if self.vision is not None:
            if not isinstance(self.vision, VisionEncoder):
                raise ConfigError("vision", f"must be a VisionEncoder, got {type(self.vision).__name__}")
            if self.vision.out_hidden_size != self.hidden_size:
                raise ConfigError("vision.out_hidden_size", f"must be the model's hidden_size {self.hidden_size}")

    def _validate_hybrid(self) -> None:
        """megatron-core's hybrid pattern (one symbol of M, *, -, E per layer; MambaMixer: heads a multiple of
        groups); a GPT-style MoE or linear-attention pattern does not apply beside it."""
        pattern = self.hybrid_layer_pattern
        if not pattern:
            return
        if len(pattern) != self.num_layers:
            raise ConfigError(
                "hybrid_layer_pattern", f"needs one symbol per layer ({self.num_layers}), got {len(pattern)}"
            )
        if set(pattern) - set(HYBRID_SYMBOLS):
            raise ConfigError(
                "hybrid_layer_pattern", "symbols must be M (Mamba), G (gated DeltaNet), * (attention), - (MLP), E (MoE)"
            )
        if self.moe_layer_pattern or self.linear_attention_pattern:
            raise ConfigError("hybrid_layer_pattern", "replaces moe_layer_pattern and linear_attention_pattern")
        if ("E" in pattern) != self.is_moe:
            raise ConfigError("hybrid_layer_pattern", "has E layers exactly when num_moe_experts > 0")
        if "M" in pattern:
            for name in ("mamba_num_heads", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups"):
                if getattr(self, name) <= 0:
                    raise ConfigError(name, "must be > 0 for Mamba layers")
            if self.mamba_num_heads % self.mamba_num_groups:
                raise ConfigError("mamba_num_heads", f"must be a multiple of mamba_num_groups={self.mamba_num_groups}")

    def _validate_linear_attention(self) -> None:
        """megatron-core TransformerConfig.__post_init__'s gated-DeltaNet checks (value heads a multiple of key
        heads) on a pattern of one 0 / 1 per layer; MLA has no output gate (MLATransformerConfig)."""
        pattern = self.linear_attention_pattern
        if pattern and len(pattern) != self.num_layers:
            raise ConfigError(
                "linear_attention_pattern", f"needs one entry per layer ({self.num_layers}), got {len(pattern)}"
            )
        if set(pattern) - {0, 1}:
            raise ConfigError("linear_attention_pattern", "entries must be 1 (gated DeltaNet) or 0 (softmax attention)")
        if self.has_linear_attention:
            for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                         "linear_value_head_dim", "linear_conv_kernel_dim"):  # fmt: skip
                if getattr(self, name) <= 0:
                    raise ConfigError(name, "must be > 0 for gated-DeltaNet layers")
            if self.linear_num_value_heads % self.linear_num_key_heads:
                raise ConfigError(
                    "linear_num_value_heads", f"must be a multiple of linear_num_key_heads={self.linear_num_key_heads}"
                )
        if self.attention_output_gate and self.multi_latent_attention:
            raise ConfigError("attention_output_gate", "is not supported with multi_latent_attention (megatron-core)")

    def _validate_attention_window(self) -> None:
        if isinstance(self.window_size, bool) or not isinstance(self.window_size, int) or self.window_size < 0:
            raise ConfigError("window_size", f"must be an integer >= 0 (0: full attention), got {self.window_size!r}")
        pattern = self.window_layer_pattern
        if pattern and len(pattern) != self.num_layers:
            raise ConfigError(
                "window_layer_pattern", f"needs one entry per layer ({self.num_layers}), got {len(pattern)}"
            )
        if set(pattern) - {0, 1}:
            raise ConfigError("window_layer_pattern", "entries must be 1 (sliding window) or 0 (full attention)")
        if any(pattern) and not self.window_size:
            raise ConfigError("window_layer_pattern", "marks sliding-window layers but window_size is 0")
        if self.softmax_type not in SOFTMAX_TYPES:
            raise ConfigError("softmax_type", f"must be one of {', '.join(SOFTMAX_TYPES)}, got {self.softmax_type!r}")
        if self.activation_clamp_value is not None and not self.activation_clamp_value > 0:
            raise ConfigError("activation_clamp_value", "must be > 0 (megatron-core TransformerConfig)")

    # ---- derived shapes ---------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_moe_experts > 0

    def is_moe_layer(self, layer_index: int) -> bool:
        """True if decoder layer `layer_index` (0-based) has an MoE MLP."""
        if not self.is_moe:
            return False
        if self.hybrid_layer_pattern:
            return self.hybrid_layer_pattern[layer_index] == "E"
        if not self.moe_layer_pattern:
            return True
        return bool(self.moe_layer_pattern[layer_index])

    def is_window_layer(self, layer_index: int) -> bool:
        """True if decoder layer `layer_index` (0-based) attends through a sliding window of `window_size` keys
        (megatron-core utils.is_layer_window_attention, with the pattern in its list form)."""
        if not self.window_size:
            return False
        if not self.window_layer_pattern:
            return True
        return bool(self.window_layer_pattern[layer_index])

    @property
    def megatron_window_size(self) -> tuple[int, int] | None:
        """megatron-core's `window_size`: (keys to the left, 0 to the right), the query itself not counted; None for
        full attention."""
        return (self.window_size - 1, 0) if self.window_size else None

    def is_linear_attention_layer(self, layer_index: int) -> bool:
        """True if decoder layer `layer_index` (0-based) mixes tokens with gated DeltaNet instead of attention (a G
        layer of a hybrid model)."""
        if self.hybrid_layer_pattern:
            return self.hybrid_layer_pattern[layer_index] == "G"
        return bool(self.linear_attention_pattern) and bool(self.linear_attention_pattern[layer_index])

    @property
    def has_linear_attention(self) -> bool:
        return any(self.linear_attention_pattern) or "G" in self.hybrid_layer_pattern

    def token_mixer(self, layer_index: int) -> str | None:
        """What mixes tokens in layer `layer_index`: "attention", "gdn" (gated DeltaNet), "mamba", or None for a
        hybrid model's MLP / MoE layer."""
        if self.hybrid_layer_pattern:
            return {"M": "mamba", "*": "attention", "G": "gdn"}.get(self.hybrid_layer_pattern[layer_index])
        return "gdn" if self.is_linear_attention_layer(layer_index) else "attention"

    def has_mlp(self, layer_index: int) -> bool:
        """Whether layer `layer_index` has an MLP or MoE block (a hybrid model's M and * layers have none)."""
        return not self.hybrid_layer_pattern or self.hybrid_layer_pattern[layer_index] in "-E"

    @property
    def mamba_inner_size(self) -> int:
        """Mamba-2's inner width, heads x head dim (megatron-core MambaMixer.d_inner with mamba_num_heads set)."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_in_proj_size(self) -> int:
        """MambaMixer's in_proj output: z and x (d_inner each), B and C (groups x state each), dt (one per head)."""
        return 2 * self.mamba_inner_size + 2 * self.mamba_num_groups * self.mamba_state_dim + self.mamba_num_heads

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of MambaMixer's depthwise conv1d: x, B and C."""
        return self.mamba_inner_size + 2 * self.mamba_num_groups * self.mamba_state_dim

    def layer_kind(self, layer_index: int) -> tuple[bool, bool, str | None, bool]:
        """(MoE layer?, sliding-window layer?, token mixer, has an MLP?): what a decoder layer's time and memory
        depend on besides the run (every layer's, derived once per model: the search asks for each layer of every
        layout)."""
        kinds = _layer_kinds(self)
        if 0 <= layer_index < len(kinds):
            return kinds[layer_index]
        return self._derive_layer_kind(layer_index)

    def _derive_layer_kind(self, layer_index: int) -> tuple[bool, bool, str | None, bool]:
        return (
            self.is_moe_layer(layer_index),
            self.is_window_layer(layer_index),
            self.token_mixer(layer_index),
            self.has_mlp(layer_index),
        )

    def dispatched_tokens(self, tokens: float, tp: int, load: float) -> float:
        """Token rows one rank's all-to-all dispatch (or combine) moves in one MoE layer: T / tp x top-k (T the
        micro-batch's tokens, split over the sequence-parallel TP ranks) x `load`. The expert-TP gather comes after
        the all-to-all (megatron-core MoEAlltoAllTokenDispatcher: `token_dispatch` all-to-alls the permuted local
        rows over the EP group, `dispatch_postprocess` then gathers them over expt_tp; token_dispatcher.py @
        Megatron-LM d98e8a6)."""
        return tokens * self.moe_router_topk / tp * load

    def routed_tokens(self, tokens: float, tp: int, etp: int, load: float) -> float:
        """Token rows the routed experts of one rank take in one MoE layer: the dispatched rows x etp (an expert-TP
        group gathers its ranks' rows), T x top-k x etp / tp x `load`, the busiest rank's share over the mean
        (`Workload.expert_load`: imbalance and capacity)."""
        return self.dispatched_tokens(tokens, tp, load) * etp

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def query_projection_size(self) -> int:
        """Width of Q (= heads x head dim); for MLA, heads x (nope + rope) dims."""
        if self.multi_latent_attention:
            return self.num_attention_heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_projection_size(self) -> int:
        """Width of K plus V for GQA (= 2 x groups x head dim)."""
        return 2 * self.num_query_groups * self.kv_channels

    @property
    def attention_output_size(self) -> int:
        """Width of the core-attention output that feeds the output projection."""
        if self.multi_latent_attention:
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.kv_channels

    def residual_blocks(self, layer_index: int) -> int:
        """Residual blocks of layer `layer_index`, each with its input norm: a token mixer and an MLP, or one of
        them in a hybrid model's layer."""
        return (self.token_mixer(layer_index) is not None) + self.has_mlp(layer_index)

    def tp_collective_blocks(self, layer_index: int) -> int:
        """Residual blocks of layer `layer_index` whose linears gather / scatter the hidden states over TP: its token
        mixer, and its MLP when dense or when a MoE block has shared experts. Routed experts take the
        sequence-parallel shard and move their tokens in the dispatcher (megatron-core MoELayer; the expert-TP gather
        is the dispatcher's, `costmodel.layer.expert_tp_comm_s`)."""
        moe = self.is_moe_layer(layer_index)
        mlp = self.has_mlp(layer_index) and (not moe or self.moe_shared_expert_intermediate_size > 0)
        return (self.token_mixer(layer_index) is not None) + mlp

    def token_mixer_widths(self, layer_index: int) -> tuple[int, int] | None:
        """(output, input) widths of layer `layer_index`'s token-mixer projections, the column-parallel one into the
        mixer and the row-parallel one out of it: attention's linear_qkv / linear_proj, gated DeltaNet's and Mamba-2's
        in_proj / out_proj; None for a hybrid model's MLP / MoE layer (MLA's projections are its own)."""
        return {
            "attention": (self.qkv_projection_size, self.attention_output_size),
            "gdn": (self.gdn_in_proj_size, self.linear_v_dim),
            "mamba": (self.mamba_in_proj_size, self.mamba_inner_size),
        }.get(self.token_mixer(layer_index))

    def gathers_qkv_over_tp(self, layer_index: int, tp: int) -> bool:
        """Whether layer `layer_index`'s softmax attention all-gathers its qkv output over TP: more TP ranks than K / V
        heads (megatron-core SelfAttention.get_query_key_value_tensors; MLA has no query groups)."""
        mixer_is_attention = self.token_mixer(layer_index) == "attention" and not self.multi_latent_attention
        return mixer_is_attention and tp > self.num_query_groups

    def query_groups_per_rank(self, tp: int) -> int:
        """K / V heads one TP rank holds: groups / tp, or 1 when tp exceeds the groups (megatron-core SelfAttention:
        each rank all-gathers the qkv output of its group's ranks and keeps its query heads with that group's k, v)."""
        return self.num_query_groups // tp if self.num_query_groups >= tp else 1

    @property
    def qkv_projection_size(self) -> int:
        """Width of softmax attention's fused `linear_qkv` output: Q, K, V and, with `attention_output_gate`, the
        gate (heads x head dim; megatron-core SelfAttention.linear_qkv_out_dim)."""
        gate = self.num_attention_heads * self.kv_channels if self.attention_output_gate else 0
        return self.query_projection_size + self.kv_projection_size + gate

    @property
    def linear_qk_dim(self) -> int:
        """Gated DeltaNet: width of Q (= of K), key heads x key head dim."""
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_v_dim(self) -> int:
        """Gated DeltaNet: width of V (= of the output gate), value heads x value head dim."""
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def gdn_in_proj_size(self) -> int:
        """Gated DeltaNet's `in_proj` output: q, k, v, the output gate z, and beta and alpha per value head
        (megatron-core GatedDeltaNet.in_proj_dim = 2 qk + 2 v + 2 value heads)."""
        return 2 * self.linear_qk_dim + 2 * self.linear_v_dim + 2 * self.linear_num_value_heads

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of gated DeltaNet's depthwise causal conv1d: q, k and v (GatedDeltaNet.conv_dim)."""
        return 2 * self.linear_qk_dim + self.linear_v_dim

    def _check_router_groups(self) -> None:
        groups, picked = self.moe_router_num_groups, self.moe_router_group_topk
        if (groups > 0) != (picked > 0) or groups < 0 or picked < 0:
            raise ConfigError(
                "moe_router_group_topk", "give both moe_router_num_groups and moe_router_group_topk, or neither"
            )
        if groups and self.num_moe_experts % groups:
            raise ConfigError(
                "moe_router_num_groups", f"must divide num_moe_experts={self.num_moe_experts}, got {groups}"
            )
        if picked > min(groups, self.moe_router_topk):
            # megatron-core scores a group by its top (topk // group_topk) experts (moe_utils.group_limited_topk)
            raise ConfigError(
                "moe_router_group_topk",
                f"must be <= moe_router_num_groups={groups} and moe_router_topk={self.moe_router_topk}, got {picked}",
            )

    def padded_vocab_size(self, tp: int = 1, divisible_by: int | None = None) -> int:
        """Vocabulary padded as Megatron-LM does (`--make-vocab-size-divisible-by` x TP; default the model's)."""
        multiple = (divisible_by or self.make_vocab_size_divisible_by) * tp
        return -(-self.vocab_size // multiple) * multiple

    # ---- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["moe_layer_pattern"] = list(self.moe_layer_pattern)
        data["window_layer_pattern"] = list(self.window_layer_pattern)
        data["linear_attention_pattern"] = list(self.linear_attention_pattern)
        data["vision"] = None if self.vision is None else self.vision.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        reject_unknown_fields(cls, data, "ModelSpec")
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data
        ]
        if missing:
            raise ConfigError(missing[0], "is required in a ModelSpec")
        return cls(**data)

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)

    def with_num_layers(self, num_layers: int) -> ModelSpec:
        """The same model with fewer (or more) layers: keeps the MoE pattern's prefix."""
        check_num_layers(num_layers)

        def cycled(pattern: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(pattern[i % len(pattern)] for i in range(num_layers)) if pattern else pattern

        hybrid = self.hybrid_layer_pattern.replace("|", "")
        if "E" in hybrid and "E" not in cycled(tuple(hybrid)):
            # megatron-core builds no experts without an E layer, while the model keeps its expert count
            raise ConfigError(
                "num_layers",
                f"{num_layers} keeps no MoE layer of {self.name}'s hybrid pattern {hybrid[:8]}...: "
                f"give at least {hybrid.index('E') + 1}",
            )

        return dataclasses.replace(
            self,
            num_layers=num_layers,
            moe_layer_pattern=cycled(self.moe_layer_pattern),
            window_layer_pattern=cycled(self.window_layer_pattern),
            linear_attention_pattern=cycled(self.linear_attention_pattern),
            hybrid_layer_pattern="".join(cycled(tuple(self.hybrid_layer_pattern))),
        )

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


@lru_cache(maxsize=256)
def _layer_kinds(model: ModelSpec) -> tuple[tuple[bool, bool, str | None, bool], ...]:
    """`ModelSpec.layer_kind` of each decoder layer of `model`."""
    return tuple(model._derive_layer_kind(i) for i in range(model.num_layers))
