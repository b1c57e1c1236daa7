"""Turn a Hugging Face `config.json` into a `ModelSpec`.

Supported `model_type`s: llama, mistral, qwen2, qwen2_5_vl (with its vision tower), qwen3, qwen2_moe, qwen3_moe,
qwen3_next, mixtral, deepseek_v3 (and deepseek_v2, kimi_k2), glm4_moe, gpt_oss, gpt2, nemotron, nemotron_h, mimo. The
mapping follows Megatron-Bridge's HF->Megatron converters (field meanings from each model's `configuration_*.py` in
transformers).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import CONFIG_LIMIT_BYTES, read_json_bounded
from .model import MAMBA_CONV_KERNEL, ModelSpec, check_num_layers, router_group_fields
from .vision import qwen2_5_vl_vision

_ACTIVATION_BY_HF_NAME = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu",
    "relu": "relu",
    "relu2": "squared_relu",
}


def _require(cfg: dict[str, Any], key: str, model_type: str) -> Any:
    if key not in cfg:
        raise ConfigError(key, f"missing from the {model_type} config.json")
    return cfg[key]


def _require_layers(cfg: dict[str, Any], key: str, model_type: str) -> int:
    """The layer count, checked before a per-layer list is built from it."""
    return check_num_layers(_require(cfg, key, model_type), key)


def _activation(cfg: dict[str, Any], key: str = "hidden_act") -> str:
    name = cfg.get(key, "silu")
    if name not in _ACTIVATION_BY_HF_NAME:
        raise ConfigError(key, f"unsupported activation {name!r} (known: {', '.join(_ACTIVATION_BY_HF_NAME)})")
    return _ACTIVATION_BY_HF_NAME[name]


def _require_positive_int(cfg: dict[str, Any], key: str, model_type: str) -> int:
    """A field other fields are divided by: a positive integer, else a `ConfigError` naming it."""
    value = _require(cfg, key, model_type)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"must be a positive integer in the {model_type} config.json, got {value!r}")
    return value


def _llama_like(cfg: dict[str, Any], name: str, model_type: str, **extra: Any) -> ModelSpec:
    heads = _require_positive_int(cfg, "num_attention_heads", model_type)
    hidden = _require_positive_int(cfg, "hidden_size", model_type)
    fields: dict[str, Any] = dict(
        name=name,
        hidden_size=hidden,
        num_layers=_require_layers(cfg, "num_hidden_layers", model_type),
        num_attention_heads=heads,
        num_query_groups=cfg.get("num_key_value_heads") or heads,
        kv_channels=cfg.get("head_dim") or hidden // heads,
        ffn_hidden_size=_require(cfg, "intermediate_size", model_type),
        vocab_size=_require(cfg, "vocab_size", model_type),
        gated_linear_unit=True,
        activation=_activation(cfg),
        normalization="RMSNorm",
        add_bias_linear=bool(cfg.get("mlp_bias", False)) and bool(cfg.get("attention_bias", False)),
        add_qkv_bias=bool(cfg.get("attention_bias", False)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        position_embedding_type="rope",
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
    )
    fields.update(extra)
    return ModelSpec(**fields)


def _llama(cfg: dict[str, Any], name: str) -> ModelSpec:
    return _llama_like(cfg, name, cfg["model_type"])


def _mistral(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Mistral: a sliding window of `sliding_window` keys on every layer when set, as Megatron-Bridge's
    MistralBridge maps it (window_size [sliding_window - 1, 0], cp_comm_type a2a;
    src/megatron/bridge/models/mistral/mistral_bridge.py @ 067f987)."""
    return _llama_like(cfg, name, "mistral", window_size=int(cfg.get("sliding_window") or 0))


def _qwen2(cfg: dict[str, Any], name: str) -> ModelSpec:
    # Qwen2 / Qwen2.5 always carry q/k/v biases (no config flag for it).
    return _llama_like(cfg, name, "qwen2", add_qkv_bias=True)


def _qwen2_5_vl(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Qwen2.5-VL: a Qwen2 language model (its fields at the top level, or under `text_config` as newer
    transformers write them) and a vision tower (`specs.vision.qwen2_5_vl_vision`)."""
    text = {**cfg, **cfg["text_config"]} if isinstance(cfg.get("text_config"), dict) else cfg
    language = _llama_like(text, name, "qwen2_5_vl", add_qkv_bias=True)
    vision = qwen2_5_vl_vision(_require(cfg, "vision_config", "qwen2_5_vl"), language.hidden_size)
    return language.replace(vision=vision)


def _mimo(cfg: dict[str, Any], name: str) -> ModelSpec:
    """MiMo-7B: Qwen2 (q/k/v biases) with `num_nextn_predict_layers` MTP layers, as Megatron-Bridge's MiMoBridge
    maps it (a Qwen2Bridge with add_qkv_bias=True, qk_layernorm=False, mtp_num_layers = num_nextn_predict_layers;
    src/megatron/bridge/models/mimo/mimo_bridge.py @ 067f987)."""
    return _llama_like(
        cfg, name, "mimo", add_qkv_bias=True, mtp_num_layers=int(cfg.get("num_nextn_predict_layers") or 0)
    )


def _qwen3(cfg: dict[str, Any], name: str) -> ModelSpec:
    return _llama_like(cfg, name, "qwen3", qk_layernorm=True)


def _moe_pattern(num_layers: int, is_moe: Callable[[int], bool]) -> tuple[int, ...]:
    return tuple(int(is_moe(i)) for i in range(num_layers))


def _qwen_moe(cfg: dict[str, Any], name: str, **extra: Any) -> ModelSpec:
    """Qwen MoE models (transformers' Qwen2Moe / Qwen3Moe / Qwen3Next decoder layers): layer i is MoE unless it is in
    `mlp_only_layers` or (i + 1) % decoder_sparse_step != 0; a shared expert, when there is one, has a sigmoid gate
    (Qwen2MoeSparseMoeBlock.shared_expert_gate). `extra` fields win over these."""
    model_type = cfg["model_type"]
    num_layers = _require_layers(cfg, "num_hidden_layers", model_type)
    step = cfg.get("decoder_sparse_step", 1) or 1
    mlp_only = set(cfg.get("mlp_only_layers", []) or [])
    pattern = _moe_pattern(num_layers, lambda i: i not in mlp_only and (i + 1) % step == 0)
    shared = int(cfg.get("shared_expert_intermediate_size", 0) or 0)
    fields: dict[str, Any] = dict(
        qk_layernorm=model_type == "qwen3_moe",
        add_qkv_bias=model_type == "qwen2_moe" or bool(cfg.get("attention_bias", False)),
        num_moe_experts=_require(cfg, "num_experts", model_type),
        moe_router_topk=_require(cfg, "num_experts_per_tok", model_type),
        moe_ffn_hidden_size=_require(cfg, "moe_intermediate_size", model_type),
        moe_shared_expert_intermediate_size=shared,
        moe_shared_expert_gate=shared > 0,
        moe_layer_pattern=pattern if not all(pattern) else (),
    )
    fields.update(extra)
    return _llama_like(cfg, name, model_type, **fields)


# transformers' names of a layer's token mixer in `layer_types`, its legacy ones too
# (configuration_utils._LEGACY_LAYER_TYPE_REMAP: mamba -> linear_attention, attention -> full_attention): 1 for gated
# DeltaNet, 0 for softmax attention
_LINEAR_ATTENTION_LAYER_TYPES = {"linear_attention": 1, "mamba": 1, "full_attention": 0, "attention": 0}
# Qwen3NextConfig's defaults for what a config.json may leave out (transformers
# src/transformers/models/qwen3_next/configuration_qwen3_next.py @ 249ef81)
_QWEN3_NEXT_DEFAULTS = {
    "head_dim": 256,
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}


def _layer_types(cfg: dict[str, Any], num_layers: int) -> list[Any]:
    """`layer_types`, one entry per layer (empty when the config has none)."""
    types = cfg.get("layer_types") or []
    if not isinstance(types, list) or (types and len(types) != num_layers):
        count = len(types) if isinstance(types, list) else type(types).__name__
        raise ConfigError("layer_types", f"needs one entry per layer ({num_layers}), got {count}")
    return types


def _linear_attention_pattern(cfg: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """1 for a gated-DeltaNet layer, 0 for softmax attention, as Megatron-Bridge's full_attention_interval_from_hf
    reads it (src/megatron/bridge/models/conversion/transformers_compat.py @ 067f987): `layer_types` when the config
    has it (transformers >= 5.5 writes only that), else layer i attends in full iff (i + 1) % full_attention_interval
    == 0 (Qwen3NextConfig.__post_init__, which defaults the interval to 4). Empty when no layer is gated DeltaNet."""
    types = _layer_types(cfg, num_layers)
    if types:
        unknown = next((t for t in types if t not in _LINEAR_ATTENTION_LAYER_TYPES), None)
        if unknown is not None:
            known = ", ".join(_LINEAR_ATTENTION_LAYER_TYPES)
            raise ConfigError("layer_types", f"{unknown!r} is not a layer type the tool models (known: {known})")
        pattern = tuple(_LINEAR_ATTENTION_LAYER_TYPES[t] for t in types)
    else:
        interval = cfg.get("full_attention_interval", _QWEN3_NEXT_DEFAULTS["full_attention_interval"])
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError("full_attention_interval", f"must be a positive integer, got {interval!r}")
        pattern = tuple(int((i + 1) % interval != 0) for i in range(num_layers))
    return pattern if any(pattern) else ()


def _qwen3_next(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Qwen3-Next as Megatron-Bridge's Qwen3NextBridge maps it (src/megatron/bridge/models/qwen/qwen3_next_bridge.py
    @ 067f987): Qwen3-MoE's layers (q/k RMSNorm, MoE from decoder_sparse_step and mlp_only_layers, a shared expert of
    shared_expert_intermediate_size with a sigmoid gate: moe_shared_expert_gate) whose softmax attention gates its
    output (attention_output_gate: transformers' Qwen3NextAttention.q_proj is 2 x heads x head_dim, the second half a
    sigmoid gate), and gated DeltaNet (experimental_attention_variant gated_delta_net) on the layers
    `_linear_attention_pattern` marks, of linear_num_key_heads / linear_num_value_heads heads of
    linear_key_head_dim / linear_value_head_dim and a conv1d of linear_conv_kernel_dim. Missing sizes take
    Qwen3NextConfig's defaults. partial_rotary_factor, rope_theta, norm_topk_prob and the zero-centred RMSNorm change
    no matmul; the checkpoint's MTP layer (mtp.* weights) is not in config.json, and Bridge sets no mtp_num_layers."""
    num_layers = _require_layers(cfg, "num_hidden_layers", "qwen3_next")
    pattern = _linear_attention_pattern(cfg, num_layers)
    sizes = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
             "linear_num_value_heads")  # fmt: skip
    return _qwen_moe(
        cfg,
        name,
        kv_channels=cfg.get("head_dim") or _QWEN3_NEXT_DEFAULTS["head_dim"],
        qk_layernorm=True,
        attention_output_gate=True,
        linear_attention_pattern=pattern,
        **{key: cfg.get(key, _QWEN3_NEXT_DEFAULTS[key]) if pattern else 0 for key in sizes},
    )


def _mixtral(cfg: dict[str, Any], name: str) -> ModelSpec:
    return _llama_like(
        cfg,
        name,
        "mixtral",
        num_moe_experts=_require(cfg, "num_local_experts", "mixtral"),
        moe_router_topk=_require(cfg, "num_experts_per_tok", "mixtral"),
        moe_ffn_hidden_size=_require(cfg, "intermediate_size", "mixtral"),
    )


def _deepseek(cfg: dict[str, Any], name: str) -> ModelSpec:
    model_type = cfg["model_type"]
    num_layers = _require_layers(cfg, "num_hidden_layers", model_type)
    first_dense = cfg.get("first_k_dense_replace", 0) or 0
    freq = cfg.get("moe_layer_freq", 1) or 1
    pattern = _moe_pattern(num_layers, lambda i: i >= first_dense and i % freq == 0)
    n_shared = cfg.get("n_shared_experts", 0) or 0
    moe_ffn = _require(cfg, "moe_intermediate_size", model_type)
    heads = _require(cfg, "num_attention_heads", model_type)
    # group-limited routing as Megatron-Bridge's DeepSeek bridges map n_group / topk_group (no topk_group: no limit)
    group_topk = int(cfg.get("topk_group") or 0)
    routing_groups = router_group_fields(int(cfg.get("n_group") or 0) if group_topk else 0, group_topk)
    return ModelSpec(
        name=name,
        hidden_size=_require(cfg, "hidden_size", model_type),
        num_layers=num_layers,
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=cfg.get("qk_nope_head_dim", 128) + cfg.get("qk_rope_head_dim", 64),
        ffn_hidden_size=_require(cfg, "intermediate_size", model_type),
        vocab_size=_require(cfg, "vocab_size", model_type),
        gated_linear_unit=True,
        activation=_activation(cfg),
        normalization="RMSNorm",
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        position_embedding_type="rope",
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        num_moe_experts=_require(cfg, "n_routed_experts", model_type),
        moe_router_topk=_require(cfg, "num_experts_per_tok", model_type),
        moe_ffn_hidden_size=moe_ffn,
        moe_shared_expert_intermediate_size=n_shared * moe_ffn,
        moe_layer_pattern=pattern,
        multi_latent_attention=True,
        q_lora_rank=cfg.get("q_lora_rank"),
        kv_lora_rank=_require(cfg, "kv_lora_rank", model_type),
        qk_head_dim=_require(cfg, "qk_nope_head_dim", model_type),
        qk_pos_emb_head_dim=_require(cfg, "qk_rope_head_dim", model_type),
        v_head_dim=_require(cfg, "v_head_dim", model_type),
        mtp_num_layers=int(cfg.get("num_nextn_predict_layers", 0) or 0),
        **routing_groups,
    )


def _glm4_moe(cfg: dict[str, Any], name: str) -> ModelSpec:
    """GLM-4.5 / GLM-4.5-Air as Megatron-Bridge's GLM45Bridge maps them (src/megatron/bridge/models/glm/glm45_bridge.py
    @ 067f987: q/k/v biases from attention_bias, qk_layernorm from use_qk_norm, no other linear bias, the first
    `first_k_dense_replace` layers dense, a shared expert of moe_intermediate_size without a gate, and
    num_nextn_predict_layers MTP layers). partial_rotary_factor (rotary_percent 0.5) changes no matmul."""
    num_layers = _require_layers(cfg, "num_hidden_layers", "glm4_moe")
    first_dense = cfg.get("first_k_dense_replace", 0) or 0
    moe_ffn = _require(cfg, "moe_intermediate_size", "glm4_moe")
    return _llama_like(
        cfg,
        name,
        "glm4_moe",
        add_bias_linear=False,
        qk_layernorm=bool(cfg.get("use_qk_norm", False)),
        num_moe_experts=_require(cfg, "n_routed_experts", "glm4_moe"),
        moe_router_topk=_require(cfg, "num_experts_per_tok", "glm4_moe"),
        moe_ffn_hidden_size=moe_ffn,
        moe_shared_expert_intermediate_size=int(cfg.get("n_shared_experts", 0) or 0) * moe_ffn,
        moe_layer_pattern=_moe_pattern(num_layers, lambda i: i >= first_dense),
        mtp_num_layers=int(cfg.get("num_nextn_predict_layers", 0) or 0),
    )


def _gpt_oss(cfg: dict[str, Any], name: str) -> ModelSpec:
    """gpt-oss as Megatron-Bridge's GPTOSSBridge maps it (src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py
    @ 067f987): biases on every linear layer, the experts' and the router's included (add_bias_linear); a clamped
    GLU of quick_gelu (activation_func_clamp_value = swiglu_limit, glu_linear_offset 1.0); learnable attention sinks
    (softmax_type learnable); sliding-window attention of `sliding_window` keys (window_size (w-1, 0)) on the layers
    `layer_types` marks "sliding_attention"; every layer an MoE of `num_local_experts` experts of width
    intermediate_size, no shared expert. YaRN rope changes no matmul."""
    num_layers = _require_layers(cfg, "num_hidden_layers", "gpt_oss")
    types = _layer_types(cfg, num_layers)
    experts = _require(cfg, "num_local_experts", "gpt_oss")
    topk = cfg.get("num_experts_per_tok") or _require(cfg, "experts_per_token", "gpt_oss")
    window = int(cfg.get("sliding_window") or 0)
    return _llama_like(
        cfg,
        name,
        "gpt_oss",
        add_bias_linear=True,
        add_qkv_bias=bool(cfg.get("attention_bias", True)),
        activation="quick_gelu",
        activation_clamp_value=float(cfg.get("swiglu_limit", 7.0)),
        glu_linear_offset=1.0,
        softmax_type="learnable",
        window_size=window,
        # no window (sliding_window null) leaves every layer full, whatever layer_types says
        window_layer_pattern=tuple(int(t == "sliding_attention") for t in types) if window else (),
        num_moe_experts=experts,
        moe_router_topk=topk,
        moe_ffn_hidden_size=_require(cfg, "intermediate_size", "gpt_oss"),
    )


def _gpt2(cfg: dict[str, Any], name: str) -> ModelSpec:
    hidden = _require_positive_int(cfg, "n_embd", "gpt2")
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=_require_layers(cfg, "n_layer", "gpt2"),
        num_attention_heads=_require_positive_int(cfg, "n_head", "gpt2"),
        ffn_hidden_size=cfg.get("n_inner") or 4 * hidden,
        vocab_size=_require(cfg, "vocab_size", "gpt2"),
        gated_linear_unit=False,
        activation=_activation(cfg, "activation_function"),
        normalization="LayerNorm",
        add_bias_linear=True,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        position_embedding_type="learned_absolute",
        max_position_embeddings=cfg.get("n_positions", 1024),
        hidden_dropout=float(cfg.get("resid_pdrop", 0.1)),
        attention_dropout=float(cfg.get("attn_pdrop", 0.1)),
    )


def _nemotron(cfg: dict[str, Any], name: str) -> ModelSpec:
    # Nemotron-4 / Minitron: squared-ReLU, non-gated MLP, LayerNorm (1p), no biases, partial RoPE.
    heads = _require_positive_int(cfg, "num_attention_heads", "nemotron")
    hidden = _require_positive_int(cfg, "hidden_size", "nemotron")
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=_require_layers(cfg, "num_hidden_layers", "nemotron"),
        num_attention_heads=heads,
        num_query_groups=cfg.get("num_key_value_heads") or heads,
        kv_channels=cfg.get("head_dim") or hidden // heads,
        ffn_hidden_size=_require(cfg, "intermediate_size", "nemotron"),
        vocab_size=_require(cfg, "vocab_size", "nemotron"),
        gated_linear_unit=False,
        activation=_activation(cfg),
        normalization="LayerNorm",
        add_bias_linear=bool(cfg.get("attention_bias", False)) and bool(cfg.get("mlp_bias", False)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        position_embedding_type="rope",
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
    )


# transformers' NemotronHConfig defaults for what a config.json may leave out, under the attribute names a saved
# config.json carries (src/transformers/models/nemotron_h/configuration_nemotron_h.py @ cfeb552: n_groups is
# __init__'s mamba_n_groups, conv_kernel its mamba_d_conv)
_NEMOTRON_H_DEFAULTS = {
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 21504,
    "mlp_hidden_act": "relu2",
    "ssm_state_size": 128,
    "mamba_num_heads": 128,
    "n_groups": 8,
    "mamba_head_dim": 64,
    "n_shared_experts": 1,
}
# transformers >= 5 writes `layers_block_type` in place of the pattern (NemotronHConfig._pattern_to_list)
_NEMOTRON_H_BLOCK_SYMBOLS = {"mamba": "M", "attention": "*", "moe": "E"}


def _nemotron_h_pattern(cfg: dict[str, Any]) -> str:
    """The layer pattern of a nemotron_h config: `hybrid_override_pattern` (M Mamba-2, * attention, - MLP, E MoE),
    else transformers 5's `layers_block_type` list."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None and isinstance(cfg.get("layers_block_type"), list):
        blocks = cfg["layers_block_type"]
        unknown = next((b for b in blocks if b not in _NEMOTRON_H_BLOCK_SYMBOLS), None)
        if unknown is not None:
            known = ", ".join(_NEMOTRON_H_BLOCK_SYMBOLS)
            raise ConfigError("layers_block_type", f"{unknown!r} is not a Nemotron-H block type (known: {known})")
        pattern = "".join(_NEMOTRON_H_BLOCK_SYMBOLS[b] for b in blocks)
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("hybrid_override_pattern", "missing from the nemotron_h config.json (or layers_block_type)")
    return pattern


def _nemotron_h(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Nemotron-H / Nemotron-3 (a megatron-core MambaModel) as Megatron-Bridge's NemotronHBridge maps it
    (src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py @ 928a7e5 provider_bridge, and @ 067f987
    CONFIG_MAPPING): hybrid_override_pattern -> the layer pattern (one layer per symbol: M Mamba-2, * attention,
    - MLP, E MoE), mamba_num_heads / mamba_head_dim, n_groups -> mamba_num_groups, ssm_state_size ->
    mamba_state_dim, head_dim -> kv_channels, intermediate_size the MLP layers' width, use_bias -> add_bias_linear,
    attention_bias -> add_qkv_bias, the routed experts (n_routed_experts, moe_intermediate_size, top
    num_experts_per_tok); no position embedding ("Mamba doesn't use position embeddings", 067f987), a squared-ReLU
    MLP without a gate (Bridge's squared_relu activation_func; mlp_hidden_act relu2), RMSNorm. The shared expert is
    n_shared_experts x moe_shared_expert_intermediate_size wide, as transformers' NemotronHMoE builds it (Bridge maps
    moe_shared_expert_intermediate_size alone: the same for every released config, whose n_shared_experts is 1).
    Missing sizes take transformers' NemotronHConfig defaults. Refused: MTP layers (num_nextn_predict_layers > 0),
    latent MoE projections (moe_latent_size) and a conv1d other than megatron-core's width 4. n_group / topk_group /
    routed_scaling_factor (routing) and time_step_* / chunk_size change no matmul."""

    def get(key: str) -> Any:
        value = cfg.get(key)
        return _NEMOTRON_H_DEFAULTS[key] if value is None else value

    pattern = _nemotron_h_pattern(cfg)
    layers = cfg.get("num_hidden_layers")
    if layers is not None and layers != len(pattern):
        raise ConfigError(
            "num_hidden_layers", f"{layers} but hybrid_override_pattern has {len(pattern)} layers (one per symbol)"
        )
    mtp = cfg.get("num_nextn_predict_layers") or 0
    if mtp:
        raise ConfigError(
            "num_nextn_predict_layers",
            f"{mtp}: a hybrid model's MTP layers (mtp_hybrid_override_pattern) are not modelled",
        )
    if cfg.get("moe_latent_size") is not None:
        raise ConfigError("moe_latent_size", "latent MoE projections (Nemotron-3-Super) are not modelled")
    kernel = cfg.get("conv_kernel", cfg.get("mamba_d_conv", MAMBA_CONV_KERNEL))
    if kernel != MAMBA_CONV_KERNEL:
        raise ConfigError(
            "conv_kernel", f"{kernel}: megatron-core's MambaMixer has a conv1d of width {MAMBA_CONV_KERNEL} (d_conv)"
        )
    heads = _require_positive_int(cfg, "num_attention_heads", "nemotron_h")
    experts: dict[str, Any] = {}
    if "E" in pattern:
        shared = int(get("n_shared_experts") or 0) * int(cfg.get("moe_shared_expert_intermediate_size") or 0)
        experts = dict(
            num_moe_experts=_require(cfg, "n_routed_experts", "nemotron_h"),
            moe_router_topk=_require(cfg, "num_experts_per_tok", "nemotron_h"),
            moe_ffn_hidden_size=_require(cfg, "moe_intermediate_size", "nemotron_h"),
            moe_shared_expert_intermediate_size=shared,
        )
    mamba: dict[str, Any] = {}
    if "M" in pattern:
        mamba = dict(
            mamba_num_heads=get("mamba_num_heads"),
            mamba_head_dim=get("mamba_head_dim"),
            mamba_state_dim=get("ssm_state_size"),
            mamba_num_groups=cfg.get("n_groups") or cfg.get("mamba_n_groups") or get("n_groups"),
        )
    return ModelSpec(
        name=name,
        hidden_size=_require_positive_int(cfg, "hidden_size", "nemotron_h"),
        num_layers=check_num_layers(len(pattern), "hybrid_override_pattern"),
        num_attention_heads=heads,
        num_query_groups=get("num_key_value_heads") or heads,
        kv_channels=cfg.get("head_dim") or cfg.get("attention_head_dim") or get("head_dim"),
        ffn_hidden_size=get("intermediate_size"),
        vocab_size=_require(cfg, "vocab_size", "nemotron_h"),
        gated_linear_unit=False,
        activation=_activation({"mlp_hidden_act": get("mlp_hidden_act")}, "mlp_hidden_act"),
        normalization="RMSNorm",
        add_bias_linear=bool(cfg.get("use_bias", False)),
        add_qkv_bias=bool(cfg.get("attention_bias", False)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        position_embedding_type="none",
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        hidden_dropout=float(cfg.get("hidden_dropout", 0.0) or 0.0),
        hybrid_layer_pattern=pattern,
        **mamba,
        **experts,
    )


HF_CONVERTERS: dict[str, Callable[[dict[str, Any], str], ModelSpec]] = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3": _qwen3,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "qwen3_next": _qwen3_next,
    "mixtral": _mixtral,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    # Kimi K2 ships DeepSeek-V3's architecture under its own model_type (its config.json: architectures
    # DeepseekV3ForCausalLM; the Kimi-K2 README asks frameworks without it to read the file as deepseek_v3, and
    # slime's HF loader maps kimi_k2 to its DeepSeek-V3 one)
    "kimi_k2": _deepseek,
    "glm4_moe": _glm4_moe,
    "gpt_oss": _gpt_oss,
    "gpt2": _gpt2,
    "nemotron": _nemotron,
    "nemotron_h": _nemotron_h,
    "mimo": _mimo,
}


# model types whose `sliding_window` the converter models (the others' is refused while it is on)
WINDOW_MODELLED = ("mistral", "gpt_oss")
# model types whose converter reads gated-DeltaNet layers from `layer_types` (the others' are refused)
LINEAR_ATTENTION_MODELLED = ("qwen3_next",)
# model types whose converter reads a hybrid (Mamba) `hybrid_override_pattern` (the others' are refused)
HYBRID_MODELLED = ("nemotron_h",)


def _refuse_unmodelled_attention(cfg: dict[str, Any]) -> None:
    """Layers the tool would otherwise predict as something else: a hybrid pattern (Mamba / MoE layers,
    `hybrid_override_pattern`) outside `HYBRID_MODELLED`, linear-attention `layer_types` outside
    `LINEAR_ATTENTION_MODELLED`, and sliding-window
    attention that is on (`sliding_window` below the context, and `use_sliding_window` not false, as transformers'
    Qwen2 configs say) where the converter does not model it (Qwen2's `max_window_layers` split, which
    Megatron-Bridge does not map either)."""
    pattern = cfg.get("hybrid_override_pattern")
    modelled = cfg.get("model_type") in HYBRID_MODELLED
    if not modelled and isinstance(pattern, str) and any(ch != "*" and ch != "-" for ch in pattern):
        raise ConfigError(
            "hybrid_override_pattern",
            f"{pattern[:40]!r}: the {cfg.get('model_type')} converter would predict transformer layers; hybrid "
            f"(Mamba) patterns are read for {', '.join(HYBRID_MODELLED)} only",
        )
    types = cfg.get("layer_types")
    if cfg.get("model_type") not in LINEAR_ATTENTION_MODELLED and isinstance(types, list):
        linear = [i for i, t in enumerate(types) if isinstance(t, str) and _LINEAR_ATTENTION_LAYER_TYPES.get(t) == 1]
        if linear:
            raise ConfigError(
                "layer_types",
                f"marks {len(linear)} linear-attention layers (the first: layer {linear[0]}), which the "
                f"{cfg.get('model_type')} converter would predict as softmax attention: not modelled",
            )
    window, context = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    if cfg.get("model_type") in WINDOW_MODELLED:
        return
    if isinstance(window, int) and cfg.get("use_sliding_window", True) and (not context or window < context):
        raise ConfigError(
            "sliding_window",
            f"{window}: sliding-window attention is not modelled (full causal attention would be predicted; "
            "set sliding_window to null in a copy of config.json to predict that)",
        )


def model_spec_from_hf_config(cfg: dict[str, Any], name: str | None = None) -> ModelSpec:
    """Build a `ModelSpec` from the dict of a Hugging Face `config.json`."""
    if not isinstance(cfg, dict):
        raise ConfigError("config.json", "must hold a JSON object")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in HF_CONVERTERS:
        raise ConfigError(
            "model_type", f"{model_type!r} is not supported (supported: {', '.join(sorted(HF_CONVERTERS))})"
        )
    if name is None:
        name = cfg.get("_name_or_path") or model_type
    _refuse_unmodelled_attention(cfg)
    try:
        return HF_CONVERTERS[model_type](cfg, name)
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("config.json", f"malformed {model_type} config: {exc}") from exc


def read_json_file(path: Path, field: str = "model") -> dict[str, Any]:
    """Read a JSON object from `path` (at most a few MiB, UTF-8), turning any failure into a one-line
    `ConfigError` naming `field` and the file."""
    data = read_json_bounded(path, field, CONFIG_LIMIT_BYTES)
    if not isinstance(data, dict):
        raise ConfigError(field, f"{path} must hold a JSON object")
    return data
