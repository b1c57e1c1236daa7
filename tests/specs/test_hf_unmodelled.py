"""config.json models with layers the tool does not model are refused, not predicted as plain transformers; the
sliding windows it models are read."""

from __future__ import annotations

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.hf import model_spec_from_hf_config

# mistralai/Mistral-7B-v0.1's config.json (sliding_window 4096 of a 32k context)
MISTRAL_V01 = {
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 4096,
}  # fmt: skip


def test_sliding_window_attention_that_is_on_is_refused_where_not_modelled():
    """Qwen2's window (on for the layers from max_window_layers, a split Megatron-Bridge does not map) is refused."""
    qwen2 = {**MISTRAL_V01, "model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 28}
    with pytest.raises(ConfigError, match="sliding_window: 4096: sliding-window attention is not modelled"):
        model_spec_from_hf_config(qwen2)
    # Qwen2's use_sliding_window false, a window as long as the context: full attention
    for extra in ({"use_sliding_window": False}, {"sliding_window": 32768}):
        assert model_spec_from_hf_config({**qwen2, **extra}).window_size == 0


def test_mistral_s_window_is_modelled_on_every_layer():
    """Megatron-Bridge's MistralBridge: window_size [sliding_window - 1, 0] on every layer (v0.1: 4096 keys)."""
    spec = model_spec_from_hf_config(MISTRAL_V01)
    assert spec.window_size == 4096 and all(spec.is_window_layer(i) for i in range(32))
    assert model_spec_from_hf_config({**MISTRAL_V01, "sliding_window": None}).window_size == 0  # v0.3


def test_a_hybrid_mamba_pattern_outside_nemotron_h_is_refused():
    """A converter that builds transformer layers would predict a hybrid pattern's Mamba layers as attention: only
    nemotron_h's converter reads the pattern (tests/specs/test_nemotron_h.py)."""
    cfg = {**MISTRAL_V01, "model_type": "nemotron", "sliding_window": None, "hybrid_override_pattern": "M-M-M*-M-"}
    with pytest.raises(ConfigError, match="hybrid_override_pattern: .*read for nemotron_h only"):
        model_spec_from_hf_config(cfg)
