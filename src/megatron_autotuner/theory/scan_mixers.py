"""The token mixers that run a chunked scan instead of attention, by `ModelSpec.token_mixer` name: gated DeltaNet
(`gated_delta_net`) and Mamba-2 (`mamba`). Each module gives the same functions of a model: scan_flops_per_token,
scan_bytes_per_token, activation_elements_per_token, forward_working_bytes, and FORWARD_KERNELS."""

from __future__ import annotations

from . import gated_delta_net, mamba

SCAN_MIXERS = {"gdn": gated_delta_net, "mamba": mamba}
