"""Gated DeltaNet's token mixing (Qwen3-Next's linear attention): the chunked delta-rule scan's GEMMs, FLOPs,
memory traffic and saved activations, per token.

megatron-core runs the scan with flash-linear-attention's `chunk_gated_delta_rule` (megatron/core/ssm/
gated_delta_net.py; Megatron-LM d98e8a6 `GatedDeltaNet.chunk_size = 64`), after repeating q and k from the key heads
to the value heads. Per chunk of C tokens and value head, with key / value head dims dk / dv (fla/ops/
gated_delta_rule/chunk.py: chunk_scaled_dot_kkt_fwd, solve_tril, recompute_w_u_fwd, chunk_gated_delta_rule_fwd_h,
chunk_fwd_o):
- A = (beta K) K^T  [C x C, inner dk], its lower-triangular inverse (C^3 / 3 multiply-adds),
- W = A (beta K)  [C x dk, inner C] and U = A (beta V)  [C x dv, inner C],
- the state recurrence: V' = U - W S  [C x dv, inner dk] and S <- S + K^T V'  [dk x dv, inner C],
- the output: O = Q S  [C x dv, inner dk] + (Q K^T, masked) V'  [C x C, inner dk; C x dv, inner C].
The chunk states S (dk x dv, fp32) are written for every chunk in the forward pass and read back. Backward is
priced at twice the forward (the convention for attention, `flops.phase_flops`).
"""

from __future__ import annotations

from ..specs.model import ModelSpec

# flash-linear-attention's chunk length for the gated delta rule (Megatron-LM d98e8a6
# megatron/core/ssm/gated_delta_net/gdn.py: `self.chunk_size = 64`)
CHUNK_TOKENS = 64
FP32_BYTES = 4
# forward kernels of chunk_gated_delta_rule_fwd: chunk_local_cumsum, chunk_scaled_dot_kkt_fwd, solve_tril,
# recompute_w_u_fwd, chunk_gated_delta_rule_fwd_h, chunk_fwd_o (fla/ops/gated_delta_rule/chunk.py)
FORWARD_KERNELS = 6


def scan_gemms(model: ModelSpec) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) of the forward scan's matrix products for one chunk of one value head (module docstring)."""
    c, dk, dv = CHUNK_TOKENS, model.linear_key_head_dim, model.linear_value_head_dim
    return (
        (c, c, dk),  # A = (beta K) K^T
        (c, dk, c),  # W = A (beta K)
        (c, dv, c),  # U = A (beta V)
        (c, dv, dk),  # W S
        (dk, dv, c),  # K^T V'
        (c, dv, dk),  # Q S
        (c, c, dk),  # Q K^T
        (c, dv, c),  # (Q K^T) V'
    )


def scan_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the chunked scan per token, all value heads: 2 m n k per product and chunk, plus the
    triangular inverse (C^3 / 3 multiply-adds per chunk), over C tokens."""
    c = CHUNK_TOKENS
    per_chunk = sum(2.0 * m * n * k for m, n, k in scan_gemms(model)) + 2.0 * c**3 / 3
    return model.linear_num_value_heads * per_chunk / c


def scan_bytes_per_token(model: ModelSpec, bytes_per_element: int = 2) -> float:
    """HBM bytes the forward scan moves per token, all value heads: q, k (repeated to the value heads), v, the
    output, g and beta read or written once, and each chunk's fp32 state written and read back."""
    nv, dk, dv = model.linear_num_value_heads, model.linear_key_head_dim, model.linear_value_head_dim
    io = bytes_per_element * nv * (2 * dk + 2 * dv) + FP32_BYTES * 2 * nv
    states = 2 * FP32_BYTES * nv * dk * dv / CHUNK_TOKENS
    return io + states


def activation_elements_per_token(model: ModelSpec) -> dict[str, float]:
    """Elements one gated-DeltaNet mixer keeps for backward per token on one TP rank (divide by tp), besides its
    input norm's: read from megatron-core's forward (ssm/gated_delta_net.py) -- the conv1d input (q, k, v before the
    convolution), the activation's input after it, the l2-normalised q / k inputs, the scan's q / k (repeated to
    the value heads) and v, its per-chunk A (C per value head), the scan output, the output gate z, and the output
    projection's input. Not measured: flash-linear-attention is not on the GPU machine."""
    nv, dk = model.linear_num_value_heads, model.linear_key_head_dim
    v = model.linear_v_dim
    return {
        "gdn_conv_input": float(model.gdn_conv_dim),
        "gdn_conv_activation_input": float(model.gdn_conv_dim),
        "gdn_l2norm_inputs": float(2 * model.linear_qk_dim),
        "gdn_scan_qkv": float(2 * nv * dk + v),
        "gdn_scan_chunk_a": float(nv * CHUNK_TOKENS),
        "gdn_scan_output": float(v),
        "gdn_output_gate": float(v),
        "gdn_out_proj_input": float(v),
    }


def forward_working_bytes(model: ModelSpec, tokens: float, bytes_per_element: int = 2) -> float:
    """Bytes alive at once in a forward-only gated-DeltaNet mixer of `tokens` tokens, all heads (divide by tp):
    the in_proj output, the convolved q / k / v, q and k repeated to the value heads, the scan output and its
    per-chunk fp32 states."""
    nv, dk, dv = model.linear_num_value_heads, model.linear_key_head_dim, model.linear_value_head_dim
    elements = model.gdn_in_proj_size + model.gdn_conv_dim + 2 * nv * dk + model.linear_v_dim
    return bytes_per_element * tokens * elements + FP32_BYTES * tokens * nv * dk * dv / CHUNK_TOKENS
