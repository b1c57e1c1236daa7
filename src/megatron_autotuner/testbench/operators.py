"""Build testbench operators from real megatron-core modules, and their inputs.

Imports torch / megatron-core / Transformer Engine inside functions only. With TE importable the
modules come from megatron-core's TE layer spec (what users train with); otherwise from the local
spec, and every result says so (`layer_spec: local`).

Each builder returns an `Operator`: the module, a `forward()` that runs it on fresh-enough inputs and
returns the tensor to backpropagate from, the input tensor the op keeps for backward (its bytes are
counted as activation memory), and the gradient to feed backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from ..specs import ModelSpec
from .cases import Case

ROPE_BASE_DEFAULT = 10000.0


def te_available() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "no TE" here
        return False
    return True


def transformer_config_kwargs(spec: ModelSpec, case: Case) -> dict[str, Any]:
    """megatron-core `TransformerConfig` keyword arguments for `spec` split as `case` says (no torch needed)."""
    kwargs: dict[str, Any] = dict(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        kv_channels=spec.kv_channels,
        ffn_hidden_size=spec.ffn_hidden_size,
        gated_linear_unit=spec.gated_linear_unit,
        normalization=spec.normalization,
        add_bias_linear=spec.add_bias_linear,
        add_qkv_bias=spec.add_qkv_bias,
        qk_layernorm=spec.qk_layernorm,
        hidden_dropout=spec.hidden_dropout,
        attention_dropout=spec.attention_dropout,
        tensor_model_parallel_size=case.tp,
        context_parallel_size=case.cp,
        expert_model_parallel_size=case.ep,
        expert_tensor_parallel_size=case.etp,
        sequence_parallel=case.sequence_parallel,
        bf16=True,
        gradient_accumulation_fusion=False,  # plain .grad (no DDP main_grad buffers here)
        cp_comm_type=case.cp_comm_type if case.cp > 1 else None,
    )
    if case.dtype == "fp8":
        # E4M3 forward / E5M2 backward: Megatron-LM's `--fp8-format hybrid`, the format of NVIDIA's fp8 recipes.
        # The GEMMs run in fp8 only inside TE's fp8 autocast (see `build_operator`).
        kwargs["fp8"] = "hybrid"
        kwargs["fp8_recipe"] = case.fp8_recipe  # delayed | tensorwise (per-tensor current scaling) | blockwise
    if spec.is_moe:
        kwargs.update(
            num_moe_experts=spec.num_moe_experts,
            moe_router_topk=spec.moe_router_topk,
            moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
            moe_shared_expert_intermediate_size=spec.moe_shared_expert_intermediate_size or None,
            moe_shared_expert_gate=spec.moe_shared_expert_gate,
            moe_layer_freq=list(spec.moe_layer_pattern) or 1,
            moe_token_dispatcher_type="alltoall",
            moe_router_load_balancing_type="none",
            moe_aux_loss_coeff=0.0,
            moe_router_pre_softmax=spec.moe_router_topk == 1,
            moe_permute_fusion=case.moe_permute_fusion,
        )
    if spec.window_size:
        # megatron-core's window_attn_skip_freq None: every layer slides
        kwargs["window_size"] = spec.megatron_window_size
        kwargs["window_attn_skip_freq"] = list(spec.window_layer_pattern) or None
    if spec.softmax_type != "vanilla":
        kwargs["softmax_type"] = spec.softmax_type
    if spec.glu_linear_offset:
        kwargs["glu_linear_offset"] = spec.glu_linear_offset
    if spec.activation_clamp_value is not None:
        kwargs["activation_func_clamp_value"] = spec.activation_clamp_value
    if spec.multi_latent_attention:
        kwargs.update(
            q_lora_rank=spec.q_lora_rank,
            kv_lora_rank=spec.kv_lora_rank,
            qk_head_dim=spec.qk_head_dim,
            qk_pos_emb_head_dim=spec.qk_pos_emb_head_dim,
            v_head_dim=spec.v_head_dim,
        )
    return kwargs


def uses_bias_activation_fusion(spec: ModelSpec) -> bool:
    """Megatron-LM trains with bias_activation_fusion on (--bias-swiglu-fusion / --bias-gelu-fusion default
    True); megatron-core fuses GLU with silu or gelu, and plain gelu only with a bias."""
    if spec.gated_linear_unit:
        return spec.activation in ("silu", "gelu", "quick_gelu")  # quick_gelu: weighted_bias_quick_geglu
    return spec.activation == "gelu" and spec.add_bias_linear


def megatron_lm_fusions(device: str, use_te: bool) -> dict[str, bool]:
    """The kernel fusions Megatron-LM trains with by default (arguments.py: --no-bias-dropout-fusion,
    --no-masked-softmax-fusion and --no-rope-fusion switch them off), where they can run: on a GPU, and the fused
    RoPE with TE. They change the host's work as well as the GPU's (the unfused RoPE alone is about 20 small ops
    per layer), so the testbench's layers and the validate runner's models both use them."""
    cuda = device == "cuda"
    return {"bias_dropout_fusion": cuda, "masked_softmax_fusion": cuda, "apply_rope_fusion": cuda and use_te}


def activation_function(name: str) -> Callable:
    """The megatron-core activation_func of a `ModelSpec.activation` (quick_gelu: gpt-oss's, from
    megatron.core.fusions.fused_bias_geglu, as Megatron-LM's --quick-geglu sets it)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    try:
        from megatron.core.activations import squared_relu
    except ImportError:  # older megatron-core

        def squared_relu(x):
            return torch.pow(F.relu(x), 2)

    return {"silu": F.silu, "gelu": F.gelu, "relu": F.relu, "squared_relu": squared_relu, "quick_gelu": quick_gelu}[
        name
    ]


def build_transformer_config(
    spec: ModelSpec, case: Case, use_te: bool, device: str, overrides: dict[str, Any] | None = None
):
    """megatron-core `TransformerConfig` for `spec`; `overrides` (e.g. pipeline sizes, recompute) win over
    the defaults (the validate runner uses them for whole training runs)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = transformer_config_kwargs(spec, case)
    kwargs["activation_func"] = activation_function(spec.activation)
    # Megatron-LM trains with bias_activation_fusion on (--bias-swiglu-fusion / --bias-gelu-fusion default
    # True); megatron-core can fuse GLU with silu or gelu, and plain gelu only with a bias.
    kwargs["bias_activation_fusion"] = uses_bias_activation_fusion(spec)
    kwargs.update(megatron_lm_fusions(device, use_te))
    kwargs["params_dtype"] = torch.bfloat16
    kwargs["pipeline_dtype"] = torch.bfloat16
    kwargs["use_cpu_initialization"] = device == "cpu"
    if device == "cpu":
        kwargs["bf16"] = False
        kwargs["params_dtype"] = torch.float32
        kwargs["pipeline_dtype"] = torch.float32
    if spec.is_moe:
        kwargs["moe_grouped_gemm"] = use_te
        if use_te and spec.add_bias_linear:
            # TEGroupedMLP refuses the fused bias-dropout-add with biased experts (megatron/core/transformer/moe/
            # experts.py, an assertion); Megatron-LM's gpt-oss launches pass --no-bias-dropout-fusion
            kwargs["bias_dropout_fusion"] = False
        fields = TransformerConfig.__dataclass_fields__
        if "moe_router_force_load_balancing" in fields:
            kwargs["moe_router_force_load_balancing"] = True  # balanced routing, as theory assumes
    if overrides:
        kwargs.update(overrides)
    if kwargs.get("cp_comm_type") is None:
        kwargs.pop("cp_comm_type", None)
    if spec.multi_latent_attention:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config = MLATransformerConfig(**kwargs)
    else:
        config = TransformerConfig(**kwargs)
    if not use_te and config.sequence_parallel:
        # The local spec's torch norms refuse sequence parallelism (megatron-core raises).
        raise RuntimeError("sequence parallel needs the Transformer Engine layer spec")
    return config


def layer_spec(spec: ModelSpec, use_te: bool, moe_layer: bool):
    from megatron.core.models.gpt import gpt_layer_specs as specs

    num_experts = spec.num_moe_experts if moe_layer else None
    if use_te:
        built = specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts,
            moe_grouped_gemm=moe_layer,
            qk_layernorm=spec.qk_layernorm,
            multi_latent_attention=spec.multi_latent_attention,
        )
    else:
        built = specs.get_gpt_layer_local_spec(
            num_experts=num_experts,
            moe_grouped_gemm=False,
            qk_layernorm=spec.qk_layernorm,
            multi_latent_attention=spec.multi_latent_attention,
            normalization=spec.normalization,
        )
    if not spec.causal_attention:
        # bidirectional attention (a vision tower's blocks): unmasked self-attention over each image or window, as
        # megatron-core's get_vit_layer_with_transformer_engine_spec builds it for verl's Qwen2.5-VL tower
        # (verl/models/mcore/model_initializer.py @ b178a3c)
        from megatron.core.transformer.enums import AttnMaskType

        built.submodules.self_attention.params["attn_mask_type"] = AttnMaskType.no_mask
    return built


def _build_mlp_submodule(mlp_spec: Any, config: Any, layer_number: int, moe: bool) -> Any:
    """Build a layer spec's `mlp` entry the way TransformerLayer does in the installed megatron-core.

    megatron-core <= 0.16 gives a `ModuleSpec` (built with `build_module`); 0.19 gives a builder
    (`functools.partial` of `MLP.as_mlp_submodule` or `MoELayer`) that TransformerLayer calls with
    `config`, `pg_collection` and `is_mtp_layer`.
    """
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module

    if isinstance(mlp_spec, ModuleSpec):
        if moe:
            return build_module(mlp_spec, config=config, layer_number=layer_number)
        return build_module(mlp_spec, config=config)
    from megatron.core.process_groups_config import ProcessGroupCollection

    module = mlp_spec(config=config, pg_collection=ProcessGroupCollection.use_mpu_process_groups(), is_mtp_layer=False)
    if hasattr(module, "set_layer_number"):
        module.set_layer_number(layer_number)
    return module


@dataclass
class Operator:
    """A built operator ready to measure."""

    module: Any
    forward: Callable[[], Any]  # returns the tensor backward starts from
    backward: Callable[[Any], None]
    saved_input_bytes: int  # bytes of the op's input tensor, which the op keeps for backward
    output_bytes: Callable[[Any], int]
    layer_spec: str  # "te" or "local"
    description: str
    # host seconds spent in each named step of the last forward (a MoE block's `MOE_FORWARD_STEPS`); None: not timed
    host_steps_s: dict[str, float] | None = None


# megatron-core MoELayer's forward steps (megatron/core/transformer/moe/moe_layer.py @ core_r0.19: route ->
# preprocess -> dispatch -> experts -> combine -> postprocess; shared experts beside the router). CUDA graphs with
# --cuda-graph-modules moe_router capture the router (and shared experts), moe_preprocess the dispatcher's preprocess
# as well (transformer_layer.py `_get_submodules_under_cudagraphs`), so their host time is what those scopes save.
MOE_FORWARD_STEPS = (
    "shared_experts_compute", "route", "preprocess", "dispatch", "routed_experts_compute", "combine", "postprocess",
)  # fmt: skip


def time_host_steps(module: Any, steps: tuple[str, ...]) -> dict[str, float]:
    """Wrap each of `module`'s methods named in `steps` (those it has) so that the host seconds of its calls add up
    in the returned dict (keys: the wrapped steps; the caller zeroes it before a timed pass)."""
    import time

    spent: dict[str, float] = {}

    def timed(name: str, method: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return call

    for name in steps:
        method = getattr(module, name, None)
        if callable(method):
            spent[name] = 0.0
            setattr(module, name, timed(name, method))
    return spent


def _rope_base(spec_name: str) -> float:
    from ..specs.loader import _preset_path

    path = _preset_path(spec_name)
    if path is None:
        return ROPE_BASE_DEFAULT
    import json

    return float(json.loads(path.read_text()).get("rope_theta", ROPE_BASE_DEFAULT))


def build_operator(case: Case, device: str = "cuda") -> Operator:
    """Build `case.op` from megatron-core modules on the current rank (model-parallel state initialised).

    dtype fp8 runs the forward inside megatron-core's `get_fp8_context` (TE fp8 autocast), as megatron-core's
    TransformerBlock does in training; TE's linear layers then cast their inputs and run fp8 GEMMs."""
    use_te = case.use_te and te_available() and device == "cuda"
    if case.dtype == "fp8" and not use_te:
        raise ConfigError("dtype", "fp8 needs Transformer Engine on a GPU (TE layer spec); use bf16 here")
    config = build_transformer_config(case.model_spec(), case, use_te, device)
    operator = _build_operator(case, device, config, use_te)
    if not config.fp8:
        return operator
    from megatron.core.fp8_utils import get_fp8_context

    run_forward = operator.forward

    def forward_in_fp8() -> Any:
        with get_fp8_context(config):
            return run_forward()

    return replace(operator, forward=forward_in_fp8)


def _build_operator(case: Case, device: str, config: Any, use_te: bool) -> Operator:
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.transformer.spec_utils import build_module

    spec = case.model_spec()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layer_index = case.layer_index(spec)
    moe_layer = spec.is_moe_layer(layer_index) or case.op == "moe"
    lspec = layer_spec(spec, use_te, moe_layer)
    tp, cp = case.tp, case.cp
    seq_local = case.seq_length // cp
    seq_in = seq_local // tp if case.sequence_parallel else seq_local
    b, h = case.micro_batch_size, spec.hidden_size

    def hidden_input() -> Any:
        return torch.randn(seq_in, b, h, device=device, dtype=dtype, requires_grad=True)

    def rope():
        if spec.position_embedding_type != "rope":
            return None
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        head_dim = spec.qk_pos_emb_head_dim if spec.multi_latent_attention else spec.kv_channels
        emb = RotaryEmbedding(
            kv_channels=head_dim,
            rotary_percent=1.0,
            rotary_base=_rope_base(case.model),
            use_cpu_initialization=device == "cpu",
        )
        if packed_mb is not None:
            # THD: one table up to the longest (padded) sequence, applied per sequence through cu_seqlens; GPTModel
            # asks RotaryEmbedding.forward for it with packed_seq=True (no CP slicing of the table)
            return emb(max(packed_mb.padded_lengths), packed_seq=True)
        return emb(case.seq_length)

    def tensor_bytes(t: Any) -> int:
        t = t[0] if isinstance(t, tuple) else t
        return int(t.numel() * t.element_size())

    def backward_from(out: Any, grad: Any) -> None:
        t = out[0] if isinstance(out, tuple) else out
        t.backward(grad)

    kind = "te" if use_te else "local"
    op = case.op
    packed_mb = case.packed_micro_batch()
    packed_batch: dict[str, Any] = {}
    if packed_mb is not None:
        # one THD row (batch 1) of whole sequences, this CP rank's chunks (`testbench.packed`, verl's layout)
        from megatron.core import parallel_state

        from .packed import thd_tensors

        packed_batch = thd_tensors(
            packed_mb, spec.vocab_size, case.length_seed, device, cp, parallel_state.get_context_parallel_rank()
        )
        seq_local = packed_batch["tokens"].shape[1]
        seq_in = seq_local // tp if case.sequence_parallel else seq_local
        b = 1
    packed_kwargs = {"packed_seq_params": packed_batch["packed_seq_params"]} if packed_batch else {}

    if op in ("attention", "mlp", "moe", "decoder", "norm"):
        x = hidden_input()
        rotary = rope() if op in ("attention", "decoder") else None
        if op == "decoder":
            module = build_module(lspec, config=config, layer_number=layer_index + 1)

            def run():
                out = module(x, attention_mask=None, rotary_pos_emb=rotary, **packed_kwargs)
                return out[0] if isinstance(out, tuple) else out
        elif op == "attention":
            norm = build_module(lspec.submodules.input_layernorm, config=config, hidden_size=h, eps=1e-6)
            attn = build_module(lspec.submodules.self_attention, config=config, layer_number=layer_index + 1)
            module = torch.nn.ModuleList([norm, attn])

            def run():
                out, bias = attn(norm(x), attention_mask=None, rotary_pos_emb=rotary)
                return out if bias is None else out + bias
        elif op in ("mlp", "moe"):
            norm = (
                build_module(lspec.submodules.pre_mlp_layernorm, config=config, hidden_size=h, eps=1e-6)
                if op == "mlp"
                else None
            )
            mlp = _build_mlp_submodule(lspec.submodules.mlp, config, layer_index + 1, moe=op == "moe")
            module = torch.nn.ModuleList([m for m in (norm, mlp) if m is not None])

            def run():
                out, bias = mlp(norm(x) if norm is not None else x)
                return out if bias is None else out + bias
        else:  # norm
            if use_te:
                from megatron.core.extensions.transformer_engine import TENorm

                module = TENorm(config=config, hidden_size=h, eps=1e-6)
            else:
                module = build_module(lspec.submodules.input_layernorm, config=config, hidden_size=h, eps=1e-6)

            def run():
                return module(x)

        module = module.to(device=device, dtype=dtype) if device == "cpu" else module.cuda()
        grad = None

        def forward():
            return run()

        def backward(out):
            nonlocal grad
            if grad is None or grad.shape != out.shape:
                grad = torch.randn_like(out)
            backward_from(out, grad)

        steps = time_host_steps(mlp, MOE_FORWARD_STEPS) if op == "moe" else None
        return Operator(
            module, forward, backward, tensor_bytes(x), tensor_bytes, kind, f"{op} of {spec.name} layer {layer_index}",
            steps,
        )  # fmt: skip

    if op in ("column_linear", "row_linear"):
        gate = 2 if spec.gated_linear_unit else 1
        init = config.init_method
        if op == "column_linear":
            cls = _te_linear("TEColumnParallelLinear") if use_te else tensor_parallel.ColumnParallelLinear
            module = cls(
                h,
                gate * spec.ffn_hidden_size,
                config=config,
                init_method=init,
                gather_output=False,
                bias=spec.add_bias_linear,
                skip_bias_add=False,
                is_expert=False,
            )
            x = hidden_input()
        else:
            cls = _te_linear("TERowParallelLinear") if use_te else tensor_parallel.RowParallelLinear
            module = cls(
                spec.ffn_hidden_size,
                h,
                config=config,
                init_method=init,
                bias=spec.add_bias_linear,
                input_is_parallel=True,
                skip_bias_add=False,
                is_expert=False,
            )
            x = torch.randn(seq_local, b, spec.ffn_hidden_size // tp, device=device, dtype=dtype, requires_grad=True)
        module = module.to(device) if device == "cpu" else module.cuda()
        grad_holder: dict[str, Any] = {}

        def forward():
            out, _ = module(x)
            return out

        def backward(out):
            g = grad_holder.get("g")
            if g is None:
                g = grad_holder["g"] = torch.randn_like(out)
            out.backward(g)

        return Operator(module, forward, backward, tensor_bytes(x), tensor_bytes, kind, f"{op} of {spec.name}")

    if op == "lm_head":
        if use_te:
            from megatron.core.extensions.transformer_engine import TENorm

            norm = TENorm(config=config, hidden_size=h, eps=1e-6)
        else:
            norm = build_module(lspec.submodules.input_layernorm, config=config, hidden_size=h, eps=1e-6)
        output_layer = tensor_parallel.ColumnParallelLinear(
            h,
            spec.vocab_size,
            config=config,
            init_method=config.init_method,
            bias=False,
            skip_bias_add=False,
            gather_output=False,
        )
        module = torch.nn.ModuleList([norm, output_layer])
        module = module.to(device) if device == "cpu" else module.cuda()
        x = hidden_input()
        labels = torch.randint(0, spec.vocab_size, (seq_local, b), device=device)

        def forward():
            logits, _ = output_layer(norm(x))
            loss = tensor_parallel.vocab_parallel_cross_entropy(logits, labels)
            return loss.mean()

        def backward(loss):
            loss.backward()

        return Operator(module, forward, backward, tensor_bytes(x), lambda _: 0, kind, f"lm_head of {spec.name}")

    if op in ("embedding", "gpt_chunk"):
        if packed_batch:
            tokens, positions = packed_batch["tokens"], packed_batch["position_ids"]
        else:
            tokens = torch.randint(0, spec.vocab_size, (b, seq_local), device=device)
            positions = torch.arange(seq_local, device=device).unsqueeze(0).expand(b, -1)
        if op == "embedding":
            from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding

            module = LanguageModelEmbedding(
                config=config,
                vocab_size=spec.vocab_size,
                max_sequence_length=spec.max_position_embeddings,
                position_embedding_type=spec.position_embedding_type,
            )
            module = module.to(device) if device == "cpu" else module.cuda()
            grad_holder = {}

            def forward():
                return module(input_ids=tokens, position_ids=positions)

            def backward(out):
                g = grad_holder.get("g")
                if g is None:
                    g = grad_holder["g"] = torch.randn_like(out)
                out.backward(g)

            return Operator(module, forward, backward, 0, tensor_bytes, kind, f"embedding of {spec.name}")
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        block = get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization=spec.normalization)
        module = GPTModel(
            config=config,
            transformer_layer_spec=block,
            vocab_size=spec.vocab_size,
            max_sequence_length=max(spec.max_position_embeddings, case.seq_length),
            position_embedding_type=spec.position_embedding_type,
            rotary_base=int(_rope_base(case.model)),
            share_embeddings_and_output_weights=spec.tie_embeddings,
        )
        module = module.to(device) if device == "cpu" else module.cuda()
        if packed_batch:
            labels, loss_mask = packed_batch["labels"], packed_batch["loss_mask"]
        else:
            labels = torch.randint(0, spec.vocab_size, (b, seq_local), device=device)
            loss_mask = None

        def forward():
            losses = module(
                input_ids=tokens, position_ids=positions, attention_mask=None, labels=labels, **packed_kwargs
            )
            if loss_mask is None:
                return losses.mean()
            return (losses.float() * loss_mask).sum() / loss_mask.sum()  # pad tokens carry no loss

        def backward(loss):
            loss.backward()

        return Operator(
            module,
            forward,
            backward,
            0,
            lambda _: 0,
            kind,
            f"GPTModel chunk of {spec.num_layers} layers of {spec.name}" + (" (packed THD)" if packed_batch else ""),
        )
    raise ValueError(f"unknown op {op}")


def _te_linear(name: str):
    from megatron.core.extensions import transformer_engine as te_ext

    return getattr(te_ext, name)


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    if not n:
        return math.nan
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
