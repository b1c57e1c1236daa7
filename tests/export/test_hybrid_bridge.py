"""A hybrid (Mamba) model in the Megatron-Bridge and verl exports: Bridge v0.3.1's MambaModelProvider field
(hybrid_override_pattern) and megatron-core 0.16.1's TransformerConfig Mamba fields, its pipeline split as
megatron-core 0.16.1's MambaStack builds it (first / last stage sizes, no virtual stages)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import pytest
import yaml

from megatron_autotuner.export import export_all, megatron_args
from megatron_autotuner.export.bridge import bridge_overrides
from megatron_autotuner.export.verl import verl_overrides
from megatron_autotuner.specs import load_model_spec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload
from megatron_autotuner.specs.pipeline import PipelineLayout

NANO = load_model_spec("NVIDIA-Nemotron-3-Nano-30B-A3B")
WORKLOAD = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=64)
LAYOUT = dict(num_gpus=16, tp=2, pp=2, ep=4, etp=1, sequence_parallel=True)
HYBRID_KEYS = ("hybrid_override_pattern", "is_hybrid_model", "mamba_num_heads", "mamba_head_dim", "mamba_state_dim",
               "mamba_num_groups")  # fmt: skip


def model_section(parallel: ParallelConfig) -> dict:
    return bridge_overrides(megatron_args(NANO, parallel, WORKLOAD))["model"]


def test_a_plan_of_nemotron_3_nano_carries_its_pattern_and_mamba_sizes_to_bridge():
    model = model_section(ParallelConfig(**LAYOUT))
    assert {k: model[k] for k in HYBRID_KEYS} == {
        "hybrid_override_pattern": NANO.hybrid_layer_pattern,
        "is_hybrid_model": True,
        "mamba_num_heads": 64,
        "mamba_head_dim": 64,
        "mamba_state_dim": 128,
        "mamba_num_groups": 8,
    }
    assert (model["num_layers"], model["position_embedding_type"]) == (52, "none")


def test_uneven_stages_become_first_and_last_sizes_and_virtual_stages_are_refused():
    """Megatron-LM's `|` stages: megatron-core 0.16.1's MambaStack takes one uneven first / last rank
    (num_layers_in_first/last_pipeline_stage), no virtual stages; export_all writes the refusal as a comment."""
    uneven = ParallelConfig(pipeline_layout=PipelineLayout.from_counts([20, 32], 2), **LAYOUT)
    model = model_section(uneven)
    assert (model["num_layers_in_first_pipeline_stage"], model["num_layers_in_last_pipeline_stage"]) == (20, 32)
    assert model["hybrid_override_pattern"] == NANO.hybrid_layer_pattern  # no '|' for megatron-core 0.16.1
    verl = verl_overrides(megatron_args(NANO, uneven, WORKLOAD), mode="train", max_token_len=None)
    otc = verl["actor_rollout_ref"]["actor"]["megatron"]["override_transformer_config"]
    assert (otc["num_layers_in_first_pipeline_stage"], otc["num_layers_in_last_pipeline_stage"]) == (20, 32)
    interleaved = ParallelConfig(vpp=2, **LAYOUT)
    with pytest.raises(ValueError, match="builds no interleaved pipeline for a hybrid model"):
        model_section(interleaved)
    files = export_all(NANO, interleaved, WORKLOAD)
    for name in ("bridge_overrides.yaml", "verl_megatron.yaml", "verl_overrides.txt"):
        assert files[name].startswith("# not written for this layout: 4 hybrid pipeline stages over pp=2")
    assert "--hybrid-layer-pattern 'MEMEM*EMEMEM*|" in files["megatron_lm_args.txt"]  # Megatron-LM runs it
    assert yaml.safe_load(export_all(NANO, uneven, WORKLOAD)["bridge_overrides.yaml"])["model"]["is_hybrid_model"]


def test_the_fields_build_megatron_core_s_transformer_config_and_hybrid_allocation():
    """megatron-core 0.16.1 (the one Bridge v0.3.1 runs): the Mamba fields and is_hybrid_model are TransformerConfig
    fields, and its allocate_layers reads the pattern with num_layers (MambaModel's hybrid_override_pattern)."""
    pytest.importorskip("megatron.core", exc_type=ImportError)
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers
    from megatron.core.transformer import TransformerConfig

    model = model_section(ParallelConfig(**LAYOUT))
    config_keys = [k for k in HYBRID_KEYS if k != "hybrid_override_pattern"]
    assert set(config_keys) <= {f.name for f in dataclasses.fields(TransformerConfig)}
    shape = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size")
    config = TransformerConfig(**{k: model[k] for k in (*shape, *config_keys)}, tensor_model_parallel_size=2)
    assert config.mamba_num_heads == 64 and config.is_hybrid_model
    assert "".join(allocate_layers(config.num_layers, 0.0, 0.0, model["hybrid_override_pattern"])) == (
        NANO.hybrid_layer_pattern
    )


def test_bridge_s_mamba_provider_names_the_pattern_as_the_export_does():
    """Megatron-Bridge v0.3.1's MambaModelProvider (src/megatron/bridge/models/mamba/mamba_provider.py @ 9c9dd84)
    declares hybrid_override_pattern; the other fields are its TransformerConfig's (checked above). Read from the
    installed source: importing Bridge needs transformer-engine and transformers."""
    spec = importlib.util.find_spec("megatron.bridge")
    if spec is None:
        pytest.skip("megatron-bridge is not installed")
    source = Path(spec.submodule_search_locations[0]) / "models" / "mamba" / "mamba_provider.py"
    provider = next(
        node for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.ClassDef) and node.name == "MambaModelProvider"
    )  # fmt: skip
    fields = {n.target.id for n in provider.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert {"hybrid_override_pattern", "mamba_num_groups"} <= fields
    assert "hybrid_override_pattern" in model_section(ParallelConfig(**LAYOUT))
