"""Mamba-2's token mixing (Nemotron-H's M layers): the chunked SSD scan's FLOPs, memory traffic and saved tensors, per
token.

megatron-core's MambaMixer (ssm/mamba_mixer.py) trains through mamba_ssm's `mamba_split_conv1d_scan_combined` (its
memory-efficient path): the in_proj output zxbcdt is split, x / B / C go through the depthwise conv1d, the SSD scan
runs over chunks of Q = 128 tokens (MambaMixer's `chunk_size` default), and a gated RMSNorm follows. Per chunk, with
H heads of dim P, state N and G groups (mamba_ssm/ops/triton/ssd_combined.py `_mamba_chunk_scan_combined_fwd`:
_chunk_cumsum_fwd, _chunk_state_fwd, _state_passing_fwd, _bmm_chunk_fwd, _chunk_scan_fwd):
- C B^T per group  [Q x Q, inner N],
- the chunk's own output (C B^T, decayed) X per head  [Q x P, inner Q],
- each chunk's state B^T X per head  [N x P, inner Q] (fp32, written and read back),
- the carried-in states' output C S per head  [Q x P, inner N].
Backward is priced at twice the forward (the convention for attention, `flops.phase_flops`).
"""

from __future__ import annotations

from ..specs.model import MAMBA_CONV_KERNEL, ModelSpec

# MambaMixer's SSD chunk length (megatron-core 0.16.1 ssm/mamba_mixer.py default chunk_size=128)
CHUNK_TOKENS = 128
FP32_BYTES = 4
# forward kernels of _mamba_chunk_scan_combined_fwd (module docstring)
FORWARD_KERNELS = 5


def scan_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the SSD scan per token, all heads: 2 m n k per product and chunk, over Q tokens."""
    q, n, p = CHUNK_TOKENS, model.mamba_state_dim, model.mamba_head_dim
    h, g = model.mamba_num_heads, model.mamba_num_groups
    per_chunk = g * 2.0 * q * q * n + h * (2.0 * q * p * q + 2.0 * n * p * q + 2.0 * q * p * n)
    return per_chunk / q


def scan_bytes_per_token(model: ModelSpec, bytes_per_element: int = 2) -> float:
    """HBM bytes the forward scan moves per token, all heads: x, B, C, dt read and the output written once, and
    each chunk's fp32 state (heads x P x N) written and read back."""
    h, p, n = model.mamba_num_heads, model.mamba_head_dim, model.mamba_state_dim
    io = bytes_per_element * (2 * model.mamba_inner_size + 2 * model.mamba_num_groups * n + h)
    states = 2 * FP32_BYTES * h * p * n / CHUNK_TOKENS
    return io + states


def mixer_parameters(model: ModelSpec, tp: int = 1) -> int:
    """Parameters of one Mamba-2 mixer on one TP rank without its input norm (megatron-core 0.16.1 MambaMixer with
    mamba_num_heads set): in_proj [(2 d_inner + 2 G N + H)/tp, h], the depthwise conv1d over x, B, C with its bias
    [(d_inner + 2 G N)/tp, 1, 4] + [(d_inner + 2 G N)/tp], dt_bias, A_log and D [H/tp] each, the gated RMSNorm's
    weight [d_inner/tp] and out_proj [h, d_inner/tp]; no linear biases (MambaMixer asserts `not bias`)."""
    h = model.hidden_size
    params = model.mamba_in_proj_size * h // tp
    params += model.mamba_conv_dim * (MAMBA_CONV_KERNEL + 1) // tp
    params += 3 * model.mamba_num_heads // tp
    params += model.mamba_inner_size // tp
    params += model.mamba_inner_size * h // tp
    return params


def activation_elements_per_token(model: ModelSpec) -> dict[str, float]:
    """Elements one Mamba-2 mixer keeps for backward per token on one TP rank (divide by tp), besides its input
    norm's: the in_proj output zxbcdt and the scan output that `mamba_split_conv1d_scan_combined` saves (it
    recomputes the rest), and out_proj's input. Read from the code, not measured: mamba_ssm is not installed on the
    GPU machine."""
    return {
        "mamba_in_proj_output": float(model.mamba_in_proj_size),
        "mamba_scan_output": float(model.mamba_inner_size),
        "mamba_out_proj_input": float(model.mamba_inner_size),
    }


def forward_working_bytes(model: ModelSpec, tokens: float, bytes_per_element: int = 2) -> float:
    """Bytes alive at once in a forward-only Mamba-2 mixer of `tokens` tokens, all heads (divide by tp): the in_proj
    output, the convolved x / B / C, the scan output and its per-chunk fp32 states."""
    h, p, n = model.mamba_num_heads, model.mamba_head_dim, model.mamba_state_dim
    elements = model.mamba_in_proj_size + model.mamba_conv_dim + model.mamba_inner_size
    return bytes_per_element * tokens * elements + FP32_BYTES * tokens * h * p * n / CHUNK_TOKENS
