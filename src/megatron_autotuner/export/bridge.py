"""Megatron-Bridge overrides for a Megatron-LM launch: a nested ConfigContainer override (dict or yaml).

The input is a Megatron-LM argument namespace as a dict (argparse `dest` -> value as Megatron's argparse
stores it; a missing key means Megatron's default). The output is what Bridge's own override loader merges
into a ConfigContainer. Pure Python: no torch, no megatron import.

Sources (each fact below cites one of these):
- Megatron-LM @ d98e8a6 (NVIDIA/Megatron-LM d98e8a64ddf3)
- Megatron-Bridge v0.3.1 (NVIDIA-NeMo/Megatron-Bridge@9c9dd848966, the PyPI wheel megatron-bridge==0.3.1)
- megatron-core 0.16.1 (PyPI)

How Bridge loads it (Bridge@9c9dd84: examples/models/nemotron_3/pretrain_nemotron_3_nano.py, the same in its
other example scripts): `create_omegaconf_dict_config(cfg)` -> `OmegaConf.merge(cfg_omega, OmegaConf.load(yaml))`
-> `apply_overrides(cfg, OmegaConf.to_container(...), excluded)`
(src/megatron/bridge/training/utils/omegaconf_utils.py). `_apply_overrides` walks the merged dict field by field
and skips, with a warning, every key that is not an attribute: so a flat `model.tensor_model_parallel_size: 8` key
is dropped. The overrides are therefore nested.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..specs.megatron_args import megatron_default

MEGATRON_LM_REF = "NVIDIA/Megatron-LM@d98e8a6"
BRIDGE_REF = "NVIDIA-NeMo/Megatron-Bridge@9c9dd84 (v0.3.1)"

# Model-shape dests carried only when the launch sets them (a Bridge recipe or HF conversion already holds the
# model; these keep it the same model the launch describes). Megatron-LM passes every dest that is also a
# TransformerConfig field straight through (core_transformer_config_from_args,
# megatron/training/argument_utils.py:277 @ d98e8a6); the GPTModelProvider of Bridge@9c9dd84
# (src/megatron/bridge/models/gpt_provider.py) has each of these fields.
SHAPE_KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "kv_channels",
    "normalization",
    "position_embedding_type",
    "rotary_base",
    "rotary_percent",
    "add_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "make_vocab_size_divisible_by",
)
# MLA fields live on MLATransformerConfig (used by Megatron-LM when --multi-latent-attention,
# argument_utils.py:293 @ d98e8a6), so only an MLA provider has them.
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
# MoE knobs carried when the launch sets them (same names in TransformerConfig).
MOE_OPTIONAL_KEYS = (
    "moe_shared_expert_intermediate_size",
    "moe_shared_expert_overlap",
    "moe_router_load_balancing_type",
    "moe_aux_loss_coeff",
    "moe_layer_freq",
    "moe_router_dtype",
    "moe_router_fusion",
    "moe_router_score_function",
    "moe_router_pre_softmax",
    "moe_flex_dispatcher_backend",
    "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute",
)

_TORCH_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


class MegatronArgs:
    """A Megatron-LM argument dict with Megatron's defaults and the values its `validate_args` derives."""

    def __init__(self, args: dict[str, Any]):
        self.args = dict(args)
        self._check()

    def __getitem__(self, dest: str) -> Any:
        """The launch's value, else Megatron-LM's argparse default (the flag catalogue, `specs.megatron_args`)."""
        if dest in self.args:
            return self.args[dest]
        return megatron_default(dest)

    def has(self, dest: str) -> bool:
        return dest in self.args

    def _check(self) -> None:
        # Megatron-LM @ d98e8a6: megatron/training/arguments.py:928 allows at most one way to give VPP.
        given = [
            k
            for k in (
                "num_layers_per_virtual_pipeline_stage",
                "num_virtual_stages_per_pipeline_rank",
                "pipeline_model_parallel_layout",
            )
            if self[k] is not None
        ]
        if len(given) > 1:
            raise ValueError(f"Megatron-LM accepts only one of {given} (arguments.py:928 @ d98e8a6)")

    # --- parallel layout -------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return int(self["tensor_model_parallel_size"])

    @property
    def pp(self) -> int:
        return int(self["pipeline_model_parallel_size"])

    @property
    def cp(self) -> int:
        return int(self["context_parallel_size"])

    @property
    def ep(self) -> int:
        return int(self["expert_model_parallel_size"])

    @property
    def etp(self) -> int:
        # arguments.py:587 @ d98e8a6: an unset expert TP size becomes the TP size.
        etp = self["expert_tensor_parallel_size"]
        return self.tp if etp is None else int(etp)

    @property
    def vpp(self) -> int | None:
        """Virtual pipeline size as Megatron-LM's validate_args derives it (arguments.py:941-981 @ d98e8a6)."""
        layout = self["pipeline_model_parallel_layout"]
        if layout is not None:
            stages = layout_num_stages(layout)
            if stages % self.pp:
                raise ValueError(f"pipeline layout has {stages} stages, not a multiple of pp={self.pp}")
            vpp = stages // self.pp
        elif self["num_virtual_stages_per_pipeline_rank"] is not None:
            vpp = int(self["num_virtual_stages_per_pipeline_rank"])
        elif self["num_layers_per_virtual_pipeline_stage"] is not None:
            if self["decoder_first_pipeline_num_layers"] is not None or self["decoder_last_pipeline_num_layers"]:
                raise ValueError(
                    "uneven PP needs --num-virtual-stages-per-pipeline-rank, not "
                    "--num-layers-per-virtual-pipeline-stage (arguments.py:956 @ d98e8a6)"
                )
            if self["num_layers"] is None:
                raise ValueError("num_layers_per_virtual_pipeline_stage needs num_layers")
            layers = int(self["num_layers"])
            layers += int(bool(self["account_for_embedding_in_pipeline_split"]))
            layers += int(bool(self["account_for_loss_in_pipeline_split"]))
            per_stage, rem = divmod(layers, self.pp)
            if rem or per_stage % int(self["num_layers_per_virtual_pipeline_stage"]):
                raise ValueError(
                    f"{layers} layers (with embedding / loss) do not split into pp={self.pp} stages of "
                    f"{self['num_layers_per_virtual_pipeline_stage']}-layer virtual stages"
                )
            vpp = per_stage // int(self["num_layers_per_virtual_pipeline_stage"])
        else:
            return None
        return None if vpp == 1 else vpp  # arguments.py:951 / :978 @ d98e8a6

    @property
    def overlap_p2p_comm(self) -> bool:
        # arguments.py:1011-1013 @ d98e8a6: without the interleaved schedule P2P overlap and aligned param
        # all-gather are turned off.
        return bool(self["overlap_p2p_comm"]) if self.vpp is not None else False

    @property
    def batch_p2p_comm(self) -> bool:
        # argument_utils.py:307 @ d98e8a6: kw_args['batch_p2p_comm'] = not args.overlap_p2p_comm
        return not self.overlap_p2p_comm

    @property
    def align_param_gather(self) -> bool:
        return bool(self["align_param_gather"]) if self.vpp is not None else False

    @property
    def cp_comm_type(self) -> str | list[str]:
        # argument_utils.py:343 @ d98e8a6: a single type is passed as a string, several as a list (one per layer).
        value = self["cp_comm_type"]
        if isinstance(value, str):
            return value
        value = list(value)
        return value[0] if len(value) == 1 else value

    def parallel_sizes(self) -> dict[str, Any]:
        """The parallel sizes under megatron-core's names (TransformerConfig; verl's McoreEngineConfig too)."""
        return {
            "tensor_model_parallel_size": self.tp,
            "pipeline_model_parallel_size": self.pp,
            "virtual_pipeline_model_parallel_size": self.vpp,
            "context_parallel_size": self.cp,
            "sequence_parallel": bool(self["sequence_parallel"]),
            "expert_model_parallel_size": self.ep,
            "expert_tensor_parallel_size": self.etp,
        }

    def pipeline_layout_fields(self) -> dict[str, Any]:
        """TransformerConfig's pipeline-split fields (argument_utils.py:310-311 @ d98e8a6 renames the
        decoder_first/last dests). All five are written so a base config cannot add a conflicting one
        (megatron-core 0.16.1 TransformerConfig.__post_init__ rejects a layout next to the others)."""
        return {
            "pipeline_model_parallel_layout": self["pipeline_model_parallel_layout"],
            "account_for_embedding_in_pipeline_split": bool(self["account_for_embedding_in_pipeline_split"]),
            "account_for_loss_in_pipeline_split": bool(self["account_for_loss_in_pipeline_split"]),
            "num_layers_in_first_pipeline_stage": self["decoder_first_pipeline_num_layers"],
            "num_layers_in_last_pipeline_stage": self["decoder_last_pipeline_num_layers"],
        }

    def recompute_fields(self) -> dict[str, Any]:
        """TransformerConfig recompute fields, passed through by name (argument_utils.py:301 @ d98e8a6)."""
        modules = self["recompute_modules"]
        return {
            "recompute_granularity": self["recompute_granularity"],
            "recompute_method": self["recompute_method"],
            "recompute_num_layers": self["recompute_num_layers"],
            "recompute_modules": None if modules is None else list(modules),
        }

    # --- precision -------------------------------------------------------------------------------
    @property
    def precision(self) -> str:
        if self["bf16"] and self["fp16"]:
            raise ValueError("bf16 and fp16 are exclusive (arguments.py:1196 @ d98e8a6)")
        return "bf16" if self["bf16"] else "fp16" if self["fp16"] else "fp32"

    @property
    def grad_reduce_in_fp32(self) -> bool:
        """DDP's grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32 (training.py:2635 @ d98e8a6),
        which validate_args sets for bf16 unless --grad-reduce-in-bf16 (arguments.py:1204-1216 @ d98e8a6)."""
        accumulate = bool(self["accumulate_allreduce_grads_in_fp32"])
        if self.precision == "bf16":
            if self["grad_reduce_in_bf16"]:
                return False
            return accumulate or self["main_grads_dtype"] in ("fp32", "float32")
        return accumulate

    def fp8_fields(self) -> dict[str, Any]:
        """fp8 format, recipe and fp8 parameters; fp8_param follows fp8_param_gather
        (argument_utils.py:312 @ d98e8a6: kw_args['fp8_param'] = args.fp8_param_gather)."""
        if self["fp8"] is None:
            return {}
        return {"fp8": self["fp8"], "fp8_recipe": self["fp8_recipe"], "fp8_param": bool(self["fp8_param_gather"])}

    def moe_fields(self) -> dict[str, Any]:
        if not self["num_experts"]:
            return {}
        out = {
            # argument_utils.py:308 @ d98e8a6: kw_args['num_moe_experts'] = args.num_experts
            "num_moe_experts": int(self["num_experts"]),
            "moe_router_topk": self["moe_router_topk"],
            "moe_ffn_hidden_size": self["moe_ffn_hidden_size"],
            "moe_token_dispatcher_type": self["moe_token_dispatcher_type"],
            "moe_grouped_gemm": bool(self["moe_grouped_gemm"]),
            "moe_permute_fusion": bool(self["moe_permute_fusion"]),
        }
        for key in MOE_OPTIONAL_KEYS:
            if self.has(key):
                value = self[key]
                # arguments.py:1661-1664 @ d98e8a6: one-element lists become scalars.
                if isinstance(value, (list, tuple)) and len(value) == 1 and key != "moe_layer_freq":
                    value = value[0]
                if key == "moe_layer_freq" and isinstance(value, str):
                    # Megatron-LM's argparse evaluates the expression ('[0]*3+[1]*58', arguments.py moe_freq_type);
                    # TransformerConfig takes the int or the list itself: a string fails its model build
                    from ..specs.megatron_args import moe_layer_pattern

                    value = list(moe_layer_pattern(value, int(self["num_layers"])))
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def cuda_graph_fields(self) -> dict[str, Any]:
        """`model.cuda_graph_impl` / `model.cuda_graph_scope`, the TransformerConfig fields Bridge sets from its
        perf scripts' --cuda_graph_impl / --cuda_graph_scope (scripts/performance/utils/overrides.py
        `_set_cuda_graph_overrides` @ NVIDIA-NeMo/Megatron-Bridge@067f987). megatron-core 0.16.1 (Bridge v0.3.1)
        knows no full_iteration impl: it is impl local with scope ["full_iteration"], which megatron-core 0.19
        migrates to impl full_iteration (cuda_graph_config.CUDA_GRAPH_MODULES_DEPRECATIONS). Empty: the launch's
        graphs as Megatron-LM's validate_args resolves them (`specs.megatron_args`), none when off."""
        from ..specs.megatron_args import Launch, launch_cuda_graphs

        graphs = launch_cuda_graphs(Launch(args=self.args, given=tuple(self.args)), None)
        if not graphs.enabled:
            return {}
        if graphs.impl == "full_iteration":
            return {"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"], "use_te_rng_tracker": True}
        # Bridge sets model.use_te_rng_tracker (and rng.te_rng_tracker) for any graphs, as Megatron-LM sets
        # --te-rng-tracker
        return {"cuda_graph_impl": graphs.impl, "cuda_graph_scope": list(graphs.scope), "use_te_rng_tracker": True}

    def shape_fields(self) -> dict[str, Any]:
        """Model-shape fields the launch sets, named as TransformerConfig / GPTModelProvider name them."""
        out: dict[str, Any] = {k: self.args[k] for k in SHAPE_KEYS if k in self.args}
        if self.has("group_query_attention") or self.has("num_query_groups"):
            # argument_utils.py:330-333 @ d98e8a6
            out["num_query_groups"] = self["num_query_groups"] if self["group_query_attention"] else None
        if self.has("swiglu"):
            # argument_utils.py:315-316 @ d98e8a6. activation_func (F.silu) is a callable: Bridge's loader leaves
            # callables as the base config has them (omegaconf_utils.py _restore_excluded_fields), so a recipe
            # of a SwiGLU model already carries it.
            out["gated_linear_unit"] = bool(self["swiglu"])
        if self.has("untie_embeddings_and_output_weights"):
            out["share_embeddings_and_output_weights"] = not self["untie_embeddings_and_output_weights"]
        if self["multi_latent_attention"]:
            out["multi_latent_attention"] = True
            out.update({k: self.args[k] for k in MLA_KEYS if k in self.args})
        if self["mtp_num_layers"]:
            out["mtp_num_layers"] = int(self["mtp_num_layers"])
            out["mtp_loss_scaling_factor"] = self["mtp_loss_scaling_factor"]
        out.update(self._attention_window_fields())
        out.update(self._linear_attention_fields())
        out.update(self._hybrid_fields())
        return out

    def _hybrid_fields(self) -> dict[str, Any]:
        """A hybrid (Mamba) model as Bridge v0.3.1's MambaModelProvider takes it
        (src/megatron/bridge/models/mamba/mamba_provider.py @ 9c9dd84: `hybrid_override_pattern`, the name
        megatron-core 0.16.1's MambaModel has; Bridge's NemotronHModelProvider sets is_hybrid_model) with the
        TransformerConfig Mamba sizes (mamba_num_heads / head_dim / state_dim / num_groups, megatron-core 0.16.1).
        0.16.1's MambaStack splits the pattern over pp evenly or by num_layers_in_first / last_pipeline_stage and
        builds no virtual stages (ssm/mamba_block.py `_select_layers_for_pipeline_parallel`), so Megatron-LM's `|`
        stage separators become those fields where they can say the split, and are refused where they cannot."""
        from ..specs.megatron_args import MAMBA_SIZES

        text = self["hybrid_layer_pattern"] or self["hybrid_override_pattern"]
        if not text:
            return {}
        if "/" in text:
            raise ValueError("a hybrid pattern's MTP parts ('/') are not modelled: no Bridge override for them")
        segments = text.split("|")
        pattern = "".join(segments)
        if "G" in pattern:
            raise ValueError("gated-DeltaNet hybrid layers (G) are not in megatron-core 0.16.1 (Bridge v0.3.1)")
        out: dict[str, Any] = {"hybrid_override_pattern": pattern, "is_hybrid_model": True}
        if "M" in pattern:
            out.update({key: int(self[key]) for key in MAMBA_SIZES if self[key] is not None})
        out.update(self.hybrid_stage_fields())
        return out

    def hybrid_stage_fields(self) -> dict[str, Any]:
        """num_layers_in_first / last_pipeline_stage for a hybrid pattern's `|`-separated stages (none without
        separators): one segment per rank, the middle ranks equal (megatron-core 0.16.1 MambaStack's uneven split,
        which Bridge v0.3.1 and verl's megatron engine build); else a ValueError."""
        text = self["hybrid_layer_pattern"] or self["hybrid_override_pattern"]
        counts = [len(s) for s in (text or "").split("|")]
        if len(counts) == 1:
            return {}
        if len(counts) != self.pp:
            raise ValueError(
                f"{len(counts)} hybrid pipeline stages over pp={self.pp}: megatron-core 0.16.1's MambaStack "
                "(Bridge v0.3.1, verl) builds no interleaved pipeline for a hybrid model"
            )
        middle = counts[1:-1]
        if len(set(counts)) == 1:
            return {}
        if len(set(middle)) > 1:
            raise ValueError(
                f"hybrid pipeline stages of {counts} layers: megatron-core 0.16.1's MambaStack (Bridge v0.3.1, "
                "verl) splits the middle ranks evenly"
            )
        first = counts[0] if not middle or counts[0] != middle[0] else None
        last = counts[-1] if not middle or counts[-1] != middle[0] else None
        return {"num_layers_in_first_pipeline_stage": first, "num_layers_in_last_pipeline_stage": last}

    def _attention_window_fields(self) -> dict[str, Any]:
        """gpt-oss / Mistral attention fields as TransformerConfig takes them: window_size a [left, right] pair
        (Megatron-LM's tuple_type of "127,0"; Bridge's MistralBridge writes a list), window_attn_skip_freq an int or
        the evaluated list (moe_freq_type), softmax_type, and the clamped GLU's offset and clamp
        (transformer_config.py @ d98e8a6). --quick-geglu is gated_linear_unit; its activation_func (quick_gelu, a
        callable) stays the recipe's, as --swiglu's does."""
        from ..specs.megatron_args import window_layer_pattern, window_size_pair

        out: dict[str, Any] = {}
        if self.has("quick_geglu") and self["quick_geglu"]:
            out["gated_linear_unit"] = True
        if self.has("window_size") and self["window_size"] is not None:
            out["window_size"] = list(window_size_pair(self["window_size"]))
        if self.has("window_attn_skip_freq") and self["window_attn_skip_freq"] is not None:
            freq = self["window_attn_skip_freq"]
            if isinstance(freq, str) and "[" in freq:
                freq = list(window_layer_pattern(freq, int(self["num_layers"])))
            out["window_attn_skip_freq"] = freq if isinstance(freq, list) else int(freq)
        for key in ("softmax_type", "glu_linear_offset", "activation_func_clamp_value"):
            if self.has(key) and self[key] != megatron_default(key):
                out[key] = self[key]
        return out

    def _linear_attention_fields(self) -> dict[str, Any]:
        """Gated DeltaNet and the attention output gate as megatron-core 0.16.1's TransformerConfig takes them, the
        fields Bridge's Qwen3NextBridge sets (src/megatron/bridge/models/qwen/qwen3_next_bridge.py @ 067f987):
        experimental_attention_variant gated_delta_net (0.16.1's name of Megatron-LM's gdn), linear_attention_freq
        as the list of 0 / 1 per layer Megatron-LM's la_freq_type and megatron-core's get_linear_attention_pattern
        make of it, and the linear_* sizes (Megatron-LM's defaults for those the launch does not give)."""
        from ..specs.megatron_args import GATED_DELTA_NET_VARIANTS, LINEAR_ATTENTION_SIZES, linear_attention_pattern

        out: dict[str, Any] = {}
        if self["attention_output_gate"]:
            out["attention_output_gate"] = True
        variant = self["experimental_attention_variant"]
        if variant is None:
            return out
        if variant not in GATED_DELTA_NET_VARIANTS:
            raise ValueError(f"--experimental-attention-variant {variant} is not modelled: no Bridge override for it")
        freq = self["linear_attention_freq"]
        if freq is None or self["num_layers"] is None:
            raise ValueError("gated DeltaNet needs linear_attention_freq and num_layers (megatron-core)")
        out["experimental_attention_variant"] = "gated_delta_net"
        out["linear_attention_freq"] = list(linear_attention_pattern(freq, int(self["num_layers"])))
        out.update({key: int(self[key]) for key in LINEAR_ATTENTION_SIZES})
        return out


def layout_num_stages(layout: str) -> int:
    """Number of PP x VPP stages in a `--pipeline-model-parallel-layout` string, parsed as megatron-core 0.16.1
    does (PipelineParallelLayerLayout.parse_str_to_list: commas are cosmetic, `(..)*n` and `x*n` unroll,
    `|` separates stages, layers are E / L / t / m)."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    bad = {c for c in text if c not in "ELtm|"}
    if bad:
        raise ValueError(f"unknown layer characters {sorted(bad)} in pipeline layout {layout!r}")
    return len(stages)


def _dtype_node(precision: str) -> dict[str, Any]:
    # A torch.dtype written as an instantiable node: Bridge's loader instantiates `_target_` dicts with
    # `_call_: false` returning the object itself (src/megatron/bridge/utils/instantiate_utils.py @ 9c9dd84).
    return {"_target_": _TORCH_DTYPE[precision], "_call_": False}


def _mixed_precision(a: MegatronArgs) -> dict[str, Any]:
    """A whole MixedPrecisionConfig (src/megatron/bridge/training/mixed_precision.py @ 9c9dd84).

    It is written as an instantiable node (`_target_`) because recipes leave `cfg.mixed_precision` as a name
    ("bf16_mixed", recipes/common.py) or None, and merging plain keys onto a string gives a dict that
    `runtime_config_update` (training/config.py:1843) cannot use; with `_target_` Bridge's loader builds a
    MixedPrecisionConfig whatever the base held. Every dtype field is written (as a torch.dtype node) so a
    base MixedPrecisionConfig's dtype strings never reach the constructor. `setup()` then copies these fields
    onto the model, optimizer and DDP configs (update_config_with_precision_overrides), e.g. fp8_param_gather
    onto DDP and grad_reduce_in_fp32 onto DDP."""
    prec = a.precision
    return {
        "_target_": "megatron.bridge.training.mixed_precision.MixedPrecisionConfig",
        "fp32": prec == "fp32",
        "fp16": prec == "fp16",
        "bf16": prec == "bf16",
        # arguments.py:1193-1206 @ d98e8a6 (params_dtype); argument_utils.py:306 (pipeline_dtype = params_dtype)
        "params_dtype": _dtype_node(prec),
        "pipeline_dtype": _dtype_node(prec),
        "autocast_dtype": None,
        "autocast_enabled": False,
        "grad_reduce_in_fp32": a.grad_reduce_in_fp32,
        "fp8": a["fp8"],
        "fp8_recipe": a["fp8_recipe"],
        "fp8_margin": a["fp8_margin"],
        "fp8_amax_history_len": a["fp8_amax_history_len"],
        "fp8_amax_compute_algo": a["fp8_amax_compute_algo"],
        "fp8_wgrad": bool(a["fp8_wgrad"]),
        # MixedPrecisionConfig.__setattr__ keeps fp8_param and fp8_param_gather equal.
        "fp8_param": bool(a["fp8_param_gather"]),
        "fp8_param_gather": bool(a["fp8_param_gather"]),
        "first_last_layers_bf16": bool(a["first_last_layers_bf16"]),
        "num_layers_at_start_in_bf16": a["num_layers_at_start_in_bf16"],
        "num_layers_at_end_in_bf16": a["num_layers_at_end_in_bf16"],
        "loss_scale": a["loss_scale"],
        "initial_loss_scale": a["initial_loss_scale"],
        "min_loss_scale": a["min_loss_scale"],
        "loss_scale_window": a["loss_scale_window"],
        "hysteresis": a["hysteresis"],
    }


def bridge_overrides(args: dict[str, Any], *, tp_comm_overlap_cfg: str | None = None) -> dict[str, Any]:
    """Nested Megatron-Bridge ConfigContainer overrides for a Megatron-LM launch.

    Sections: `model` (parallel layout, pipeline split, recompute, fusions, MoE, shape keys the launch sets),
    `train` (batch sizes), `dataset` (seq_length), `ddp`, `optimizer`, `mixed_precision` (a whole
    MixedPrecisionConfig) and `comm_overlap`.

    `tp_comm_overlap_cfg`: path of a TE userbuffers yaml (`--tp-comm-overlap-cfg`; defaults to the args' own).
    With it, TP overlap is set on the model (`model.tp_comm_overlap_cfg` = the path) and `comm_overlap` is set
    to null: CommOverlapConfig.setup() writes its own `tp_comm_overlap_cfg` (a TransformerLayerTPOverlapCfg
    dataclass, turned into a dict with `asdict`, or None) over the model's, so a file path only survives
    without it (src/megatron/bridge/training/comm_overlap.py:567-595 @ 9c9dd84); Bridge's initialize reads
    a string model.tp_comm_overlap_cfg as a yaml file (training/initialize.py:330-333 @ 9c9dd84).
    """
    a = MegatronArgs(args)
    if a["seq_length"] is None:
        raise ValueError("seq_length is required (ConfigContainer.validate compares model and dataset seq_length)")
    ub_cfg = tp_comm_overlap_cfg if tp_comm_overlap_cfg is not None else a["tp_comm_overlap_cfg"]
    tp_overlap = bool(a["tp_comm_overlap"])

    model: dict[str, Any] = {
        **a.parallel_sizes(),
        **a.pipeline_layout_fields(),
        "cp_comm_type": a.cp_comm_type,
        "seq_length": int(a["seq_length"]),
        **a.recompute_fields(),
        "gradient_accumulation_fusion": bool(a["gradient_accumulation_fusion"]),
        "cross_entropy_loss_fusion": bool(a["cross_entropy_loss_fusion"]),
        "cross_entropy_fusion_impl": a["cross_entropy_fusion_impl"],
        **a.moe_fields(),
        **a.shape_fields(),
        **a.cuda_graph_fields(),
    }
    out: dict[str, Any] = {"model": model}
    if model.get("cuda_graph_impl"):
        out["rng"] = {"te_rng_tracker": True}
        if model["cuda_graph_scope"] == ["full_iteration"]:
            # the graph cannot hold the NaN check's host sync (_set_cuda_graph_overrides: check_for_nan_in_loss)
            out["rerun_state_machine"] = {"check_for_nan_in_loss": False}

    train: dict[str, Any] = {}
    if a["micro_batch_size"] is not None:
        train["micro_batch_size"] = int(a["micro_batch_size"])
    if a["global_batch_size"] is not None:
        train["global_batch_size"] = int(a["global_batch_size"])
    if train:
        out["train"] = train
    # ConfigContainer.validate asserts model.seq_length == dataset.seq_length (training/config.py:1601 @ 9c9dd84).
    out["dataset"] = {"seq_length": int(a["seq_length"])}

    dist_opt = bool(a["use_distributed_optimizer"])
    overlap = {
        "overlap_grad_reduce": bool(a["overlap_grad_reduce"]),
        "overlap_param_gather": bool(a["overlap_param_gather"]),
        "align_param_gather": a.align_param_gather,
    }
    ddp: dict[str, Any] = {
        "use_distributed_optimizer": dist_opt,
        **overlap,
        "grad_reduce_in_fp32": a.grad_reduce_in_fp32,
    }
    if a["ddp_bucket_size"] is not None:
        ddp["bucket_size"] = int(a["ddp_bucket_size"])
    out["ddp"] = ddp
    # _validate_and_sync_distributed_optimizer_settings (training/config.py:1878 @ 9c9dd84) keeps
    # use_distributed_optimizer equal on both. overlap_param_gather_with_optimizer_step is an OptimizerConfig
    # field, not a DDP one (megatron-core 0.16.1); Megatron-LM passes overlap_param_gather to both by name.
    out["optimizer"] = {
        "use_distributed_optimizer": dist_opt,
        "overlap_param_gather": overlap["overlap_param_gather"],
        "overlap_param_gather_with_optimizer_step": bool(a["overlap_param_gather_with_optimizer_step"]),
    }
    out["mixed_precision"] = _mixed_precision(a)

    if tp_overlap and ub_cfg is not None:
        model.update(
            {
                "tp_comm_overlap": True,
                "tp_comm_overlap_cfg": str(ub_cfg),
                "tp_comm_bootstrap_backend": a["tp_comm_bootstrap_backend"],
                "overlap_p2p_comm": a.overlap_p2p_comm,
                "batch_p2p_comm": a.batch_p2p_comm,
            }
        )
        out["comm_overlap"] = None
    else:
        # CommOverlapConfig fields (training/comm_overlap.py:374-395 @ 9c9dd84). Written as an instantiable node
        # because recipes leave cfg.comm_overlap None (recipes/common.py) and plain keys would turn it into a
        # dict. Every user value that is not None wins over the defaults setup() derives
        # (_override_user_cfgs), so the launch's overlap settings are all given: setup() would otherwise turn on
        # grad-reduce / param-gather overlap for DP > 1 and pick P2P overlap from VPP. tp_comm_overlap_cfg: None
        # means TE's default userbuffers config, as Megatron-LM without --tp-comm-overlap-cfg.
        comm: dict[str, Any] = {
            "_target_": "megatron.bridge.training.comm_overlap.CommOverlapConfig",
            "tp_comm_overlap": tp_overlap,
            "tp_comm_overlap_cfg": None,
            "tp_comm_bootstrap_backend": a["tp_comm_bootstrap_backend"],
            "overlap_p2p_comm": a.overlap_p2p_comm,
            "batch_p2p_comm": a.batch_p2p_comm,
            **overlap,
            "overlap_param_gather_with_optimizer_step": bool(a["overlap_param_gather_with_optimizer_step"]),
            "overlap_moe_expert_parallel_comm": bool(a["overlap_moe_expert_parallel_comm"]),
            "delay_wgrad_compute": bool(a["delay_wgrad_compute"]),
        }
        if a["ddp_bucket_size"] is not None:
            comm["bucket_size"] = int(a["ddp_bucket_size"])
        if a["defer_embedding_wgrad_compute"]:
            comm["defer_embedding_wgrad_compute"] = True
            comm["wgrad_deferral_limit"] = a["wgrad_deferral_limit"]
        out["comm_overlap"] = comm
    return out


BRIDGE_YAML_HEADER = (
    "# Megatron-Bridge ConfigContainer overrides (nested), written by megatron-autotuner.\n"
    "# Load as Bridge's example scripts do: OmegaConf.merge(create_omegaconf_dict_config(cfg)[0],\n"
    "# OmegaConf.load(this file)), then apply_overrides (megatron.bridge.training.utils.omegaconf_utils).\n"
    "# mixed_precision / comm_overlap are whole instantiable configs (_target_): they replace the recipe's.\n"
)


def bridge_overrides_yaml(args: dict[str, Any], *, tp_comm_overlap_cfg: str | None = None) -> str:
    """`bridge_overrides` as a yaml file for Bridge's `--config-file` style loading."""
    overrides = bridge_overrides(args, tp_comm_overlap_cfg=tp_comm_overlap_cfg)
    return BRIDGE_YAML_HEADER + yaml.safe_dump(overrides, sort_keys=False)


__all__ = ["MegatronArgs", "bridge_overrides", "bridge_overrides_yaml", "layout_num_stages"]
