"""Gated DeltaNet (Qwen3-Next) in the Megatron-Bridge export: the TransformerConfig fields Bridge's Qwen3NextBridge
sets, in the forms megatron-core 0.16.1 takes."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_autotuner.export import megatron_args
from megatron_autotuner.export.bridge import bridge_overrides
from megatron_autotuner.specs import load_model_spec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload

GDN_KEYS = (
    "experimental_attention_variant", "linear_attention_freq", "linear_conv_kernel_dim", "linear_key_head_dim",
    "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "attention_output_gate",
)  # fmt: skip
LAYOUT = ParallelConfig(num_gpus=16, tp=2, pp=2, cp=1, ep=4, sequence_parallel=True)
WORKLOAD = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=64)


def qwen3_next_model_section() -> dict:
    args = megatron_args(load_model_spec("Qwen3-Next-80B-A3B"), LAYOUT, WORKLOAD)
    return bridge_overrides(args)["model"]


def test_a_plan_of_qwen3_next_carries_its_gated_delta_net_to_bridge():
    model = qwen3_next_model_section()
    assert {k: model[k] for k in GDN_KEYS} == {
        "experimental_attention_variant": "gated_delta_net",
        "linear_attention_freq": [1, 1, 1, 0] * 12,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "attention_output_gate": True,
    }


def test_a_launch_s_list_expression_and_gdn_name_reach_bridge_as_megatron_core_takes_them():
    """Megatron-LM's command line: `--experimental-attention-variant gdn --linear-attention-freq '[0]+[1]*3'` with
    the sizes left at Megatron-LM's defaults; TransformerConfig 0.16.1 takes gated_delta_net and the list."""
    launch = {"num_layers": 4, "seq_length": 1024, "experimental_attention_variant": "gdn"}
    model = bridge_overrides({**launch, "linear_attention_freq": "[0]+[1]*3"})["model"]
    assert model["experimental_attention_variant"] == "gated_delta_net"
    assert model["linear_attention_freq"] == [0, 1, 1, 1]
    sizes = ("linear_num_key_heads", "linear_num_value_heads", "linear_conv_kernel_dim")
    assert [model[k] for k in sizes] == [16, 32, 4]
    assert "attention_output_gate" not in model
    # without the variant there is no gated DeltaNet to carry
    assert "linear_attention_freq" not in bridge_overrides({"num_layers": 4, "seq_length": 1024})["model"]
    with pytest.raises(ValueError, match="needs linear_attention_freq"):
        bridge_overrides(launch)


def test_the_fields_build_a_megatron_core_transformer_config():
    """megatron-core 0.16.1's TransformerConfig.__post_init__ checks (the freq set, value heads a multiple of key
    heads, both divisible by tp) pass, and its get_linear_attention_pattern reads the list back."""
    pytest.importorskip("megatron.core", exc_type=ImportError)
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_linear_attention_pattern
    from megatron.core.transformer import TransformerConfig

    model = qwen3_next_model_section()
    assert set(GDN_KEYS) <= {f.name for f in dataclasses.fields(TransformerConfig)}
    shape = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels")
    config = TransformerConfig(**{k: model[k] for k in (*shape, *GDN_KEYS)}, tensor_model_parallel_size=2)
    assert get_linear_attention_pattern(config) == [1, 1, 1, 0] * 12
