"""Megatron-LM's hybrid (Mamba) flags both ways: --hybrid-layer-pattern (and its deprecated name
--hybrid-override-pattern) with `|` pipeline stages, the --mamba-* sizes, megatron-core 0.16.1's allocation from
--hybrid-attention-ratio / --hybrid-mlp-ratio, and the export of a hybrid model that reads back the same."""

from __future__ import annotations

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import load_model_spec
from megatron_autotuner.specs.megatron_args import (
    allocate_hybrid_layers,
    launch_to_specs,
    read_launch,
    render_flags,
    specs_to_megatron_args,
)
from megatron_autotuner.specs.parallel import ParallelConfig, Workload
from megatron_autotuner.specs.pipeline import PipelineLayout
from megatron_autotuner.theory.params import total_parameters

BASE = (
    "--hidden-size 1024 --num-attention-heads 16 --group-query-attention --num-query-groups 8 --seq-length 4096 "
    "--position-embedding-type none --vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 "
    "--hidden-dropout 0 --attention-dropout 0 --disable-bias-linear --normalization RMSNorm"
)
PATTERN = "M-M*-M-M*-M-"


def read(flags: str, script: str = "pretrain_hybrid.py"):
    return launch_to_specs(read_launch(f"torchrun --nproc-per-node 8 {script} {BASE} {flags}"))


def test_the_pattern_gives_the_layers_and_megatron_lm_s_mamba_defaults():
    """No --num-layers: the pattern's 12 symbols are the layers (Megatron-LM d98e8a6 validate_args); MambaMixer's
    heads default to 2 x hidden / head dim (64 of 32), groups 8, state 128."""
    imported = read(f"--hybrid-layer-pattern '{PATTERN}' --spec megatron.core.models.hybrid.hybrid_layer_specs "
                    "hybrid_stack_spec")  # fmt: skip
    model = imported.model
    assert (model.num_layers, model.hybrid_layer_pattern) == (12, PATTERN)
    assert (model.mamba_num_heads, model.mamba_head_dim, model.mamba_state_dim, model.mamba_num_groups) == (
        32, 64, 128, 8,
    )  # fmt: skip
    assert [model.token_mixer(i) for i in range(4)] == ["mamba", None, "mamba", "attention"]
    assert imported.not_modelled == ()  # the hybrid stack spec is what the pattern builds
    sized = read(f"--hybrid-override-pattern '{PATTERN}' --num-layers 12 --mamba-num-heads 16 --mamba-head-dim 128 "
                 "--mamba-state-dim 64 --mamba-num-groups 4 --is-hybrid-model")  # fmt: skip
    assert sized.model.hybrid_layer_pattern == PATTERN and sized.model.mamba_inner_size == 2048
    assert (sized.model.mamba_state_dim, sized.model.mamba_num_groups) == (64, 4)
    longer = read(f"--hybrid-layer-pattern '{PATTERN}' --num-layers 24")
    assert longer.model.num_layers == 12
    assert any("--num-layers 24: ignored, the hybrid pattern has 12 layers" in n for n in longer.notes)


@pytest.mark.parametrize(
    "flags, match",
    [
        (f"--hybrid-layer-pattern '{PATTERN}' --hybrid-override-pattern '{PATTERN}'", "cannot be given with"),
        (f"--hybrid-layer-pattern '{PATTERN}/*-/*-'", "MTP layers \\('/' parts\\) are not modelled"),
        ("--hybrid-layer-pattern 'M-M+M-'", "'\\+': multi-latent attention layers are not modelled"),
        ("--hybrid-layer-pattern 'M-MDM-'", "'D': DeepSeek sparse attention layers are not modelled"),
        ("--hybrid-layer-pattern 'M-MXM-'", "'X' is not a layer symbol"),
        ("--hybrid-layer-pattern '|'", "is empty: give one symbol per layer"),
        (f"--hybrid-layer-pattern '{PATTERN}' --num-virtual-stages-per-pipeline-rank 2 "
         "--pipeline-model-parallel-size 2", "refused beside a hybrid pattern"),
        ("--hybrid-layer-pattern 'M-M*|-M-M|*-M-' --pipeline-model-parallel-size 2", "3 '|'-separated stages"),
        ("--hybrid-layer-pattern 'M-M*|-M-M*-M-' --pipeline-model-parallel-size 2 "
         "--decoder-first-pipeline-num-layers 4", "'|' separators"),
        (f"--hybrid-override-pattern '{PATTERN}' --num-layers 12 --hybrid-attention-ratio 0.5",
         "has not the layer counts of --hybrid-attention-ratio 0.5"),
        ("--hybrid-layer-pattern 'MEME' --num-experts 4 --moe-router-topk 2 --mamba-head-dim 48",
         "mamba_head_dim: must divide 2 x hidden_size = 2048"),
    ],
)  # fmt: skip
def test_what_megatron_lm_refuses_or_the_tool_does_not_model_is_one_line(flags, match):
    with pytest.raises(ConfigError, match=match) as info:
        read(flags)
    assert "\n" not in str(info.value)


def test_pipes_are_the_pipeline_stages():
    """Megatron-LM d98e8a6 select_pipeline_segment: segment vp x pp + rank; vpp = segments / pp."""
    interleaved = read("--hybrid-layer-pattern 'M-M|*-M|-M*|-M-' --pipeline-model-parallel-size 2")
    assert (interleaved.parallel.pp, interleaved.parallel.vpp, interleaved.parallel.pipeline_layout) == (2, 2, None)
    uneven = read("--hybrid-layer-pattern 'M-M*-|M-M*-M-' --pipeline-model-parallel-size 2").parallel
    assert uneven.vpp is None and uneven.pipeline_layout.decoder_counts == (5, 7)
    first = read(f"--hybrid-layer-pattern '{PATTERN}' --pipeline-model-parallel-size 2 "
                 "--decoder-first-pipeline-num-layers 4").parallel  # fmt: skip
    assert first.pipeline_layout.decoder_counts == (4, 8)


@pytest.mark.parametrize(
    "layers, attention, mlp",
    [(10, 0.2, 0.0), (48, 0.1, 0.0), (48, 0.5, 0.2), (10, 0.0, 0.3), (96, 0.125, 0.5), (9, 0.0, 0.0), (52, 0.3, 0.3)],
)
def test_the_ratio_allocation_is_megatron_core_s(layers, attention, mlp):
    pytest.importorskip("megatron.core", exc_type=ImportError)
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

    assert allocate_hybrid_layers(layers, attention, mlp) == "".join(allocate_layers(layers, attention, mlp))


def test_ratio_flags_of_megatron_core_0_16_1_launches():
    """--hybrid-attention-ratio / --hybrid-mlp-ratio (core_v0.16.1's, since removed from Megatron-LM): the layers
    they allocate without a pattern; a pattern with their counts passes. pretrain_mamba.py alone: all Mamba."""
    imported = read("--num-layers 10 --hybrid-attention-ratio 0.2", "pretrain_mamba.py")
    assert imported.model.hybrid_layer_pattern == allocate_hybrid_layers(10, 0.2, 0.0) == "MMM*MM*MMM"
    assert any("megatron-core 0.16.1's allocation of 10 layers" in n for n in imported.notes)
    assert read("--num-layers 4", "pretrain_mamba.py").model.hybrid_layer_pattern == "MMMM"
    assert allocate_hybrid_layers(12, 0.25, 0.25) == "MM*-MM*-M*M-"
    same = read("--num-layers 12 --hybrid-attention-ratio 0.25 --hybrid-mlp-ratio 0.25 "
                "--hybrid-override-pattern 'M*M-M*M-M*M-'")  # fmt: skip
    assert same.model.hybrid_layer_pattern == "M*M-M*M-M*M-"
    gpt = read("--num-layers 4", "pretrain_gpt.py").model
    assert gpt.hybrid_layer_pattern == "" and gpt.token_mixer(0) == "attention"


NANO = load_model_spec("NVIDIA-Nemotron-3-Nano-30B-A3B")
WORKLOAD = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=64)
LAYOUT = dict(num_gpus=16, tp=2, pp=2, ep=4, etp=1, sequence_parallel=True)


@pytest.mark.parametrize(
    "parallel, pattern_flag",
    [
        (ParallelConfig(**LAYOUT), NANO.hybrid_layer_pattern),
        (ParallelConfig(vpp=2, **LAYOUT), "MEMEM*EMEMEM*|EMEMEM*EMEMEM|*EMEMEM*EMEME|MEM*EMEMEMEME"),
        (ParallelConfig(pipeline_layout=PipelineLayout.first_last(52, 2, None, 24, None, 0), **LAYOUT),
         NANO.hybrid_layer_pattern),
        (ParallelConfig(pipeline_layout=PipelineLayout.from_counts([20, 32], 2), **LAYOUT),
         "MEMEM*EMEMEM*EMEMEM*|EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"),
    ],
)  # fmt: skip
def test_a_hybrid_model_exports_as_megatron_lm_s_pattern_and_reads_back(parallel, pattern_flag):
    """The export says an interleaved or uneven pipeline with `|` in the pattern (Megatron-LM refuses the layout
    flags beside it), first / last stage sizes as flags, and the stack spec pretrain_hybrid.py needs."""
    args = specs_to_megatron_args(NANO, parallel, WORKLOAD)
    assert args["hybrid_layer_pattern"] == pattern_flag
    assert args["spec"] == ["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]
    assert not {"num_virtual_stages_per_pipeline_rank", "pipeline_model_parallel_layout"} & set(args)
    flags = render_flags(args)
    assert "--mamba-num-heads 64" in flags and "--squared-relu" in flags and "--position-embedding-type none" in flags
    back = launch_to_specs(read_launch(" ".join(flags)), num_gpus=16)
    assert back.model.replace(name=NANO.name) == NANO
    assert back.parallel.pp == parallel.pp and back.parallel.vpp == parallel.vpp
    assert back.parallel.pipeline_layout is None or (
        back.parallel.pipeline_layout.decoder_counts == parallel.pipeline_layout.decoder_counts
    )
    assert back.not_modelled == ()
    assert total_parameters(back.model).total == 31_577_937_344
