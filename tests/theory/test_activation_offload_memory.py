"""Activation offloading in the memory model: golden bytes derived by hand from megatron-core's / TE's rules on a
small model, and the property that offloading more never adds activation memory."""

from __future__ import annotations

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ModelSpec, ParallelConfig, RecomputeConfig, Workload
from megatron_autotuner.specs.parallel import ActivationOffloadConfig, validate_layout
from megatron_autotuner.theory.memory import memory_per_stage, offload_groups, saved_tensors

MIB = 2**20


def small_model(layers: int = 4) -> ModelSpec:
    """h=1024, 8 heads of 128 (no GQA), GeLU MLP of 4h, no dropout: every activation tensor of a 2048-token
    micro-batch is 2048 x 1024 = 2Mi elements (4 MiB in bf16) but fc1's output / fc2's input (8Mi elements, 16 MiB)
    and the flash-attention log-sum-exp (8 heads x 2048 = 16Ki fp32 elements)."""
    return ModelSpec(
        name="small",
        hidden_size=1024,
        num_layers=layers,
        num_attention_heads=8,
        ffn_hidden_size=4096,
        vocab_size=32000,
        gated_linear_unit=False,
        activation="gelu",
        normalization="RMSNorm",
        position_embedding_type="rope",
        max_position_embeddings=2048,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


NO_RECOMPUTE = RecomputeConfig()


def workload(offload: ActivationOffloadConfig, recompute: RecomputeConfig = NO_RECOMPUTE) -> Workload:
    return Workload(seq_length=2048, micro_batch_size=1, global_batch_size=4, recompute=recompute,
                    activation_offload=offload)  # fmt: skip


def stage0(model, parallel, offload):
    return memory_per_stage(model, parallel, workload(offload))[0]


ONE = ParallelConfig(num_gpus=1)


def test_saved_tensors_of_the_small_model():
    """Per layer: norm input, qkv input, q, k, v, proj input, MLP norm input, fc1 input (4 MiB each), fc1 output and
    fc2 input (16 MiB each), the log-sum-exp (64 KiB): 64 MiB + 64 KiB."""
    tensors = saved_tensors(small_model(), ONE, workload(ActivationOffloadConfig()), 0)
    sizes = sorted(t.nbytes for t in tensors)
    assert sizes == [64 * 1024] + [4 * MIB] * 8 + [16 * MIB] * 2
    assert sum(sizes) == 64 * MIB + 64 * 1024


def test_fine_grained_core_attn_and_attn_proj_golden_bytes():
    """core_attn copies q, k, v and the attention output (16 MiB) and frees q, k, v (12 MiB; the log-sum-exp has
    16Ki < 1Mi elements and stays); attn_proj copies and frees the output (4 MiB). 4 layers, pp=1: the last layer's
    two groups stay (the offload margin), so 3 x 16 MiB = 48 MiB leave the GPU."""
    model = small_model()
    off = ActivationOffloadConfig(modules=("core_attn", "attn_proj"))
    groups = offload_groups(model, ONE, workload(off), 0)
    assert [(g.module, g.copied_bytes, g.freed_bytes) for g in groups] == [
        ("core_attn", 16 * MIB, 12 * MIB),
        ("attn_proj", 4 * MIB, 4 * MIB),
    ]
    base = stage0(model, ONE, ActivationOffloadConfig())
    with_offload = stage0(model, ONE, off)
    assert with_offload.offloaded_bytes == 48 * MIB
    assert base.activations_bytes - with_offload.activations_bytes == 48 * MIB


def test_core_attn_alone_frees_q_k_v_only():
    """Without attn_proj the attention output is still linear_proj's saved input: copied, not freed."""
    model = small_model()
    off = ActivationOffloadConfig(modules=("core_attn",))
    (group,) = offload_groups(model, ONE, workload(off), 0)
    assert (group.copied_bytes, group.freed_bytes) == (16 * MIB, 12 * MIB)
    assert stage0(model, ONE, off).offloaded_bytes == 3 * 12 * MIB  # the last layer's group stays


def test_activation_offload_fraction_keeps_the_later_groups():
    """fraction 0.5 on 8 groups (4 layers x core_attn, attn_proj): the margin keeps layer 3's two, int(6 x 0.5) = 3
    more of the later ones stay, so layer 0's both groups and layer 1's core_attn move: 12 + 4 + 12 = 28 MiB."""
    off = ActivationOffloadConfig(modules=("core_attn", "attn_proj"), fraction=0.5)
    assert stage0(small_model(), ONE, off).offloaded_bytes == 28 * MIB


def test_min_offloaded_tensor_size_keeps_small_tensors():
    off = ActivationOffloadConfig(modules=("core_attn", "attn_proj"), min_tensor_elements=2 * MIB + 1)
    assert offload_groups(small_model(), ONE, workload(off), 0) == ()
    assert stage0(small_model(), ONE, off).offloaded_bytes == 0


def test_qkv_linear_holds_the_fused_norm_input_and_attn_norm_moves_nothing():
    """TE spec: the input norm is fused into linear_qkv, so the qkv_linear group saves the norm input and the GEMM
    input (8 MiB) and attn_norm (an IdentityOp) nothing; dense layers have no mlp_norm group."""
    off = ActivationOffloadConfig(modules=("attn_norm", "qkv_linear", "mlp_norm"))
    groups = offload_groups(small_model(), ONE, workload(off), 0)
    assert [(g.module, g.copied_bytes) for g in groups] == [("qkv_linear", 8 * MIB)]


def test_layer_level_golden_bytes():
    """TE's layer-level offload moves every saved tensor of >= 256Ki elements of the first N layers: 64 MiB a layer
    (the 16Ki-element log-sum-exp stays); N=2 of 4 -> 128 MiB."""
    model = small_model()
    off = ActivationOffloadConfig(num_layers=2)
    base = stage0(model, ONE, ActivationOffloadConfig())
    with_offload = stage0(model, ONE, off)
    assert with_offload.offloaded_bytes == 128 * MIB
    assert base.activations_bytes - with_offload.activations_bytes == 128 * MIB


def test_more_offloaded_layers_never_add_activation_memory():
    model = small_model(8)
    previous = None
    for n in range(8):
        act = stage0(model, ONE, ActivationOffloadConfig(num_layers=n)).activations_bytes
        assert previous is None or act < previous
        previous = act
    modules = ("qkv_linear", "core_attn", "attn_proj")
    for k in range(1, 4):
        for pp in (1, 2):
            parallel = ParallelConfig(num_gpus=pp, pp=pp)
            mems = [memory_per_stage(model, parallel, workload(ActivationOffloadConfig(modules=modules[:j])))
                    for j in range(k + 1)]  # fmt: skip
            for s in range(pp):
                acts = [m[s].activations_bytes for m in mems]
                assert acts == sorted(acts, reverse=True)


def test_pipeline_ranks_keep_the_margin_once():
    """pp=2, 4 micro-batches: rank 0 holds 2 in flight of 4 layers each; all groups move but the margin chunk's last
    layer (one chunk-micro-batch): 2 x 4 x 16 - 16 = 112 MiB."""
    model = small_model(8)
    parallel = ParallelConfig(num_gpus=2, pp=2)
    off = ActivationOffloadConfig(modules=("core_attn", "attn_proj"))
    rank0 = memory_per_stage(model, parallel, workload(off))[0]
    assert rank0.in_flight_microbatches == 2
    assert rank0.offloaded_bytes == 112 * MIB


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda: ActivationOffloadConfig(num_layers=2, modules=("core_attn",)), "cannot be combined"),
        (lambda: ActivationOffloadConfig(modules=("attn_proj",)), "without core_attn"),
        (lambda: ActivationOffloadConfig(modules=("fused_group_mlp",)), "unknown module"),
        (lambda: ActivationOffloadConfig(fraction=1.5), "[0, 1]"),
        (lambda: ActivationOffloadConfig(num_layers=-1), ">= 0"),
        (lambda: workload(ActivationOffloadConfig(num_layers=1), RecomputeConfig("selective")), "recomputation"),
        (lambda: workload(ActivationOffloadConfig(modules=("core_attn",)), RecomputeConfig("full")), "full recompute"),
        (lambda: Workload(2048, activation_offload=ActivationOffloadConfig(num_layers=1), mode="forward"), "forward"),
    ],
)
def test_invalid_offload_configs_are_config_errors(make, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        make()


def test_layer_level_layout_rules():
    model = small_model()
    with pytest.raises(ConfigError, match="below num_layers"):
        validate_layout(model, ONE, workload(ActivationOffloadConfig(num_layers=4)))
    with pytest.raises(ConfigError, match="pipeline parallelism"):
        validate_layout(model, ParallelConfig(num_gpus=2, pp=2), workload(ActivationOffloadConfig(num_layers=1)))
