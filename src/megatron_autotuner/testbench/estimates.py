"""Theoretical numbers for a testbench case, per rank: FLOPs per phase, weight bytes, activation bytes.

They come from `theory` (same formulas as the planner), evaluated for the operator alone with
T = b*s/cp tokens on the rank and the work of balanced TP / EP splits:
FLOPs per rank = FLOPs per token x T / tp (routed experts included: T*k*etp/tp tokens x F/etp).
"""

from __future__ import annotations

from ..theory.flops import layer_forward_flops_per_token, logits_flops_per_token, phase_flops
from ..theory.memory import (
    FP32_BYTES,
    ActivationOptions,
    attention_activation_bytes,
    layer_activation_bytes,
    local_tokens,
    mlp_activation_bytes,
    stage_memory,
)
from ..theory.params import (
    attention_parameters,
    decoder_layer_parameters,
    embedding_parameters,
    mlp_parameters,
    moe_parameters,
    norm_parameters,
    output_layer_parameters,
    stage_parameters,
)
from .cases import Case

ATTENTION_OPS = ("qkv", "q_proj", "q_down", "q_up", "kv_down", "kv_up", "core_attention", "proj")
MLP_OPS = ("fc1", "fc2")
MOE_OPS = ("router", "experts_fc1", "experts_fc2", "shared_fc1", "shared_fc2")


def _op_flops(case: Case, names: tuple[str, ...] | None) -> dict[str, float]:
    """Per-rank fwd / bwd FLOPs of the named layer operators (None = all of the layer)."""
    spec = case.model_spec()
    tokens = local_tokens(case.workload(), case.parallel())
    ops = layer_forward_flops_per_token(spec, case.layer_index(spec), case.seq_length)
    fwd = bwd = 0.0
    for op, per_token in ops.items():
        if names is not None and op not in names:
            continue
        split = phase_flops(op, per_token * tokens / case.tp)
        fwd += split["fwd"]
        bwd += split["dgrad"] + split["wgrad"]
    return {"fwd": fwd, "bwd": bwd}


def estimate_case(case: Case, options: ActivationOptions = ActivationOptions()) -> dict[str, float]:
    """Theoretical per-rank numbers: fwd_flops, bwd_flops, weight_bytes, activation_bytes (kept for backward).

    Activation bytes include the op's saved input (a layer's input is kept for its backward), so the
    measured figure to compare is: memory after forward - before forward - output + input.
    """
    spec = case.model_spec()
    parallel = case.parallel()
    workload = case.workload()
    tp, ep, etp = case.tp, case.ep, case.etp
    tokens = local_tokens(workload, parallel)
    x = tp if case.sequence_parallel else 1
    h = spec.hidden_size
    layer = case.layer_index(spec)
    vocab = spec.vocab_size
    flops = {"fwd": 0.0, "bwd": 0.0}
    weights = 0
    activations = 0.0
    if case.op == "attention":
        flops = _op_flops(case, ATTENTION_OPS)
        weights = attention_parameters(spec, tp)
        activations = sum(attention_activation_bytes(spec, parallel, workload, options).values())
    elif case.op == "mlp":
        flops = _op_flops(case, MLP_OPS)
        weights = mlp_parameters(spec, spec.ffn_hidden_size, tp) + norm_parameters(spec, h)
        parts = mlp_activation_bytes(spec, parallel, workload, layer, options)
        activations = sum(parts.values())
    elif case.op == "moe":
        flops = _op_flops(case, MOE_OPS)
        non_expert, expert = moe_parameters(spec, tp, ep, etp)
        weights = non_expert + expert
        parts = mlp_activation_bytes(spec, parallel, workload, layer, options)
        parts.pop("mlp_norm_input", None)  # the MoE block alone has no norm: its input is the router input
        activations = sum(parts.values())
    elif case.op == "decoder":
        flops = _op_flops(case, None)
        dense, expert = decoder_layer_parameters(spec, layer, tp, ep, etp)
        weights = dense + expert
        activations = layer_activation_bytes(spec, parallel, workload, layer, options)
    elif case.op == "lm_head":
        logits = logits_flops_per_token(spec) * tokens / tp
        flops = {"fwd": logits, "bwd": 2 * logits}
        weights = norm_parameters(spec, h) + output_layer_parameters(spec, tp)
        activations = 2 * 2 * tokens * h / x + FP32_BYTES * tokens * vocab / tp
    elif case.op == "embedding":
        weights = embedding_parameters(spec, tp)
        activations = 0.0
    elif case.op == "gpt_chunk":
        layers = sum(
            sum(
                phase_flops(op, f * tokens / tp)["fwd"]
                for op, f in layer_forward_flops_per_token(spec, i, case.seq_length).items()
            )
            for i in range(spec.num_layers)
        )
        logits = logits_flops_per_token(spec) * tokens / tp
        flops = {"fwd": layers + logits, "bwd": 2 * (layers + logits)}
        weights = stage_parameters(spec, parallel, 0).total
        stage = stage_memory(spec, parallel, workload, 0, options)
        # what the forward leaves saved for backward: the step-peak transient logits are gone by then
        activations = stage.activations_bytes - stage.activation_detail.get("logits_transient", 0.0)
    elif case.op in ("column_linear", "row_linear"):
        gate = 2 if spec.gated_linear_unit else 1
        out_features = gate * spec.ffn_hidden_size if case.op == "column_linear" else h
        in_features = h if case.op == "column_linear" else spec.ffn_hidden_size
        per_rank = 2.0 * in_features * out_features * tokens / tp
        flops = {"fwd": per_rank, "bwd": 2 * per_rank}
        weights = in_features * out_features // tp
        # column: saves its (SP-sharded) input; row: saves its tp-sharded input
        activations = 2 * tokens * (h / x if case.op == "column_linear" else spec.ffn_hidden_size / tp)
    elif case.op == "norm":
        weights = norm_parameters(spec, h)
        activations = 2 * tokens * h / x + FP32_BYTES * tokens / x  # input + fp32 rstd per token
    return {
        "fwd_flops": flops["fwd"],
        "bwd_flops": flops["bwd"],
        "fwd_bwd_flops": flops["fwd"] + flops["bwd"],
        "weight_params": weights,
        "weight_bytes": 2 * weights,
        "activation_bytes": activations,
        "tokens_per_rank": tokens,
    }
