import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ModelSpec, ParallelConfig, RecomputeConfig, Workload, load_model_spec
from megatron_autotuner.specs.parallel import validate_layout
from megatron_autotuner.theory.memory import (
    GIB,
    NCCL_COMMUNICATOR_GIB,
    ActivationOptions,
    MemoryAllowance,
    all_to_all_gib,
    default_non_torch_gib,
    forward_moe_fragment_bytes,
    in_flight_microbatches,
    interleaved_logits_fragment_bytes,
    layer_activation_bytes,
    memory_per_stage,
    mlp_activation_bytes,
    stage_memory,
)

UNFUSED = ActivationOptions(flash_attention=False)


def gpt3_like(s=2048, h=12288, a=96):
    return ModelSpec(
        name="gpt",
        hidden_size=h,
        num_layers=8,
        num_attention_heads=a,
        ffn_hidden_size=4 * h,
        vocab_size=51200,
        gated_linear_unit=False,
        activation="gelu",
        normalization="LayerNorm",
        add_bias_linear=True,
        position_embedding_type="learned_absolute",
        max_position_embeddings=s,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )


def korthikanti_table2(s, b, h, a, t):
    """Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, activation bytes per layer, written out here."""
    sbh = s * b * h
    return {
        "none": sbh * (34 + 5 * a * s / h),
        "tp": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp_sp": sbh / t * (34 + 5 * a * s / h),
        "tp_selective": sbh * (10 + 24 / t),
        "tp_sp_selective": sbh * 34 / t,
        "full": sbh * 2,
    }


@pytest.mark.parametrize("s, b, h, a, t", [(2048, 1, 12288, 96, 8), (2048, 4, 4096, 32, 4), (1024, 2, 2048, 16, 2)])
def test_korthikanti_table2_all_six_cases_exactly(s, b, h, a, t):
    model = gpt3_like(s, h, a)
    expected = korthikanti_table2(s, b, h, a, t)
    none = Workload(seq_length=s, micro_batch_size=b, global_batch_size=b)
    sel = none.replace(recompute=RecomputeConfig("selective", modules=("core_attn",)))
    one = ParallelConfig(num_gpus=1)
    tp = ParallelConfig(num_gpus=t, tp=t)
    tp_sp = ParallelConfig(num_gpus=t, tp=t, sequence_parallel=True)
    got = {
        "none": layer_activation_bytes(model, one, none, 0, UNFUSED),
        "tp": layer_activation_bytes(model, tp, none, 0, UNFUSED),
        "tp_sp": layer_activation_bytes(model, tp_sp, none, 0, UNFUSED),
        "tp_selective": layer_activation_bytes(model, tp, sel, 0, UNFUSED),
        "tp_sp_selective": layer_activation_bytes(model, tp_sp, sel, 0, UNFUSED),
    }
    full = none.replace(recompute=RecomputeConfig("full", "uniform", 1))
    stage = stage_memory(model, one, full, 0, UNFUSED)
    got["full"] = stage.activation_detail["decoder_layers"] / model.num_layers
    for case, value in expected.items():
        assert got[case] == pytest.approx(value, rel=1e-12), case


def test_flash_attention_has_no_s_squared_term():
    model = gpt3_like()
    p = ParallelConfig(num_gpus=8, tp=8, sequence_parallel=True)
    w1 = Workload(seq_length=2048, global_batch_size=1)
    w2 = Workload(seq_length=4096, global_batch_size=1)
    m = model.replace(max_position_embeddings=4096)
    # linear in s with flash, super-linear without
    assert layer_activation_bytes(m, p, w2) == pytest.approx(2 * layer_activation_bytes(m, p, w1))
    assert layer_activation_bytes(m, p, w2, 0, UNFUSED) > 2.5 * layer_activation_bytes(m, p, w1, 0, UNFUSED)


def test_in_flight_microbatches():
    w = Workload(seq_length=128, global_batch_size=64)
    p = ParallelConfig(num_gpus=4, pp=4)
    assert [in_flight_microbatches(p, w, r) for r in range(4)] == [4, 3, 2, 1]
    pv = ParallelConfig(num_gpus=4, pp=4, vpp=2)
    # megatron-core warm-up 2(pp-r-1) + (v-1)pp, plus the one in flight
    assert [in_flight_microbatches(pv, w, r) for r in range(4)] == [11, 9, 7, 5]
    assert in_flight_microbatches(p, w.replace(mode="forward"), 0) == 0
    few = Workload(seq_length=128, global_batch_size=2)
    assert in_flight_microbatches(p, few, 0) == 2


def test_distributed_optimizer_bytes_per_param():
    model = load_model_spec("Llama-3.1-8B")
    w = Workload(seq_length=4096, global_batch_size=64)
    for dp in (1, 2, 8):
        p = ParallelConfig(num_gpus=dp)
        st0 = stage_memory(model, p, w, 0)
        n = st0.parameters.total
        assert st0.weights_bytes == 2 * n and st0.gradients_bytes == 4 * n
        assert st0.optimizer_bytes == pytest.approx(12 * n / dp)
        plain = stage_memory(model, p.replace(use_distributed_optimizer=False), w, 0)
        assert plain.model_state_bytes == 18 * n
    fwd = stage_memory(model, ParallelConfig(num_gpus=1), w.replace(mode="forward"), 0)
    assert fwd.gradients_bytes == 0 and fwd.optimizer_bytes == 0


def test_bf16_main_grads_match_the_megatron_docs_table():
    """Megatron-LM docs, "Distributed Optimizer": 16-bit params and grads take 20 bytes per parameter without
    the distributed optimizer and 4 + 16/d with it; the fp32 gradient copy (4 or 4/d) lives only during the
    optimizer step, so the forward / backward holds 16 and 4 + 12/d."""
    model = load_model_spec("Llama-3.1-8B")
    w = Workload(seq_length=4096, global_batch_size=64)
    for dp in (1, 2, 8):
        p = ParallelConfig(num_gpus=dp, grad_reduce_in_fp32=False)
        st0 = stage_memory(model, p, w, 0)
        n = st0.parameters.total
        assert st0.gradients_bytes == 2 * n
        assert st0.model_state_bytes + st0.optimizer_step_bytes == pytest.approx((4 + 16 / dp) * n)
        plain = stage_memory(model, p.replace(use_distributed_optimizer=False), w, 0)
        assert plain.model_state_bytes + plain.optimizer_step_bytes == 20 * n
        assert plain.model_state_bytes == 16 * n
        # fp32 main grads: `.float()` returns the buffer itself, nothing more at the step
        assert stage_memory(model, p.replace(grad_reduce_in_fp32=True), w, 0).optimizer_step_bytes == 0
    fwd = stage_memory(model, ParallelConfig(num_gpus=1, grad_reduce_in_fp32=False), w.replace(mode="forward"), 0)
    assert fwd.gradients_bytes == 0 and fwd.optimizer_step_bytes == 0


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_weights_cache_only_te_linear_weights(recipe):
    """fp8 keeps a cached fp8 copy + transpose of every TE linear weight: +2 bytes per decoder parameter and
    nothing for the word embedding or the output layer (megatron-core's own ColumnParallelLinear runs bf16).
    With fp8 parameters the TE weights are fp8 + transpose and no bf16 copy is kept: 2 bytes, as in bf16."""
    model = load_model_spec("Llama-3.1-8B")  # untied: embedding and output layer 525 M parameters each
    p = ParallelConfig(num_gpus=8)
    fp8 = Workload(seq_length=4096, global_batch_size=8, precision="fp8", fp8_recipe=recipe)
    st = stage_memory(model, p, fp8, 0)
    c = st.parameters
    assert c.embedding > 0 and c.output_layer > 0
    assert st.weights_bytes == 2 * c.total + 2 * c.decoder_dense
    params = stage_memory(model, p, fp8.replace(fp8_param=True), 0)
    assert params.weights_bytes == 2 * c.total
    assert params.gradients_bytes == st.gradients_bytes and params.optimizer_bytes == st.optimizer_bytes
    bf16 = stage_memory(model, p, Workload(seq_length=4096, global_batch_size=8), 0)
    assert params.allocated_bytes == bf16.allocated_bytes


@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2]),
    dp=st.sampled_from([1, 2, 8]),
    mode=st.sampled_from(["train", "forward"]),
)
def test_fp8_params_never_need_more_memory(tp, pp, dp, mode):
    w = Workload(2048, 1, 4 * dp, precision="fp8", mode=mode)
    sizes = dict(tp=tp, pp=pp, cp=1, ep=1, dp=dp)
    try:
        cached = peak(SMALL_DENSE, **sizes, workload=w)
        params = peak(SMALL_DENSE, **sizes, workload=w.replace(fp8_param=True))
    except ConfigError:
        assume(False)
    assert params < cached


def test_optimizer_step_sets_the_peak_only_when_it_outgrows_the_activations():
    model = load_model_spec("Llama-3.1-8B")
    w = Workload(seq_length=128, global_batch_size=1)  # tiny activations
    p = ParallelConfig(num_gpus=1, grad_reduce_in_fp32=False, use_distributed_optimizer=False)
    st0 = stage_memory(model, p, w, 0)
    assert st0.optimizer_step_bytes > st0.activations_bytes
    assert st0.allocated_bytes == st0.model_state_bytes + st0.optimizer_step_bytes
    big = stage_memory(model, p, Workload(seq_length=8192, micro_batch_size=8, global_batch_size=8), 0)
    assert big.activations_bytes > big.optimizer_step_bytes
    assert big.allocated_bytes == big.model_state_bytes + big.activations_bytes


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2]),
    dp=st.sampled_from([2, 4, 8]),
    mbs=st.sampled_from([1, 2]),
    recompute=st.sampled_from(["none", "full"]),
)
def test_bf16_main_grads_never_need_more_with_a_sharded_optimizer(tp, pp, dp, mbs, recompute):
    """With the distributed optimizer over >= 2 ranks, bf16 main grads save 2 bytes per parameter for the whole
    step and their fp32 step copy costs at most 4/d <= 2: never more memory than fp32 main grads."""
    w = Workload(2048, mbs, 4 * mbs * dp, RecomputeConfig(recompute))
    sizes = dict(tp=tp, pp=pp, cp=1, ep=1, dp=dp)
    try:
        fp32 = peak(SMALL_DENSE, **sizes, workload=w)
        bf16 = peak(SMALL_DENSE, **sizes, workload=w, grad_reduce_in_fp32=False)
    except ConfigError:
        assume(False)
    assert bf16 < fp32


def test_expert_optimizer_sharded_over_expert_dp():
    model = load_model_spec("Qwen3-30B-A3B")
    w = Workload(seq_length=4096, global_batch_size=64)
    p = ParallelConfig(num_gpus=16, ep=4)
    st0 = stage_memory(model, p, w, 0)
    c = st0.parameters
    assert p.edp == 4 and c.experts > 0
    assert st0.optimizer_bytes == pytest.approx(12 * (c.dense / 16 + c.experts / 4))


def test_cp_needs_flash_for_unfused_model():
    model = gpt3_like()
    with pytest.raises(ConfigError, match="^flash_attention"):
        layer_activation_bytes(model, ParallelConfig(num_gpus=2, cp=2), Workload(seq_length=2048), 0, UNFUSED)


def peak(model, tp, pp, cp, ep, dp, workload, allocated_only=False, grad_reduce_in_fp32=True):
    sp = tp > 1
    p = ParallelConfig(
        num_gpus=tp * pp * cp * dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        sequence_parallel=sp,
        grad_reduce_in_fp32=grad_reduce_in_fp32,
    )
    validate_layout(model, p, workload)
    stages = memory_per_stage(model, p, workload)
    if allocated_only:  # what the caching allocator holds, plus its fragmentation
        return max(s.total_bytes - default_non_torch_gib(p, workload.is_training) * GIB for s in stages)
    return max(s.total_bytes for s in stages)


SMALL_DENSE = ModelSpec(
    name="d",
    hidden_size=1024,
    num_layers=8,
    num_attention_heads=16,
    num_query_groups=8,
    ffn_hidden_size=4096,
    vocab_size=32000,
)
SMALL_MOE = SMALL_DENSE.replace(
    num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024, moe_shared_expert_intermediate_size=1024
)


@settings(max_examples=80, deadline=None)
@given(
    dim=st.sampled_from(["tp", "pp", "cp", "ep"]),
    base=st.tuples(
        st.sampled_from([1, 2, 4]),
        st.sampled_from([1, 2, 4]),
        st.sampled_from([1, 2]),
        st.sampled_from([1, 2, 4]),
        st.sampled_from([1, 2]),
    ),
    recompute=st.sampled_from(["none", "selective", "full"]),
    moe=st.booleans(),
    mbs=st.sampled_from([1, 2]),
    fp32_grads=st.booleans(),
)
def test_memory_never_grows_when_a_parallel_dimension_grows(dim, base, recompute, moe, mbs, fp32_grads):
    model = SMALL_MOE if moe else SMALL_DENSE
    tp, pp, cp, ep, dp = base
    if not moe:
        ep = 1
        assume(dim != "ep")
    w = Workload(
        seq_length=2048, micro_batch_size=mbs, global_batch_size=8 * mbs * dp, recompute=RecomputeConfig(recompute)
    )
    sizes = dict(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp)
    bigger = dict(sizes)
    bigger[dim] *= 2
    g = dict(grad_reduce_in_fp32=fp32_grads)
    try:
        before = peak(model, **sizes, workload=w, allocated_only=True, **g)
        after = peak(model, **bigger, workload=w, allocated_only=True, **g)
        total_before = peak(model, **sizes, workload=w, **g)
        total_after = peak(model, **bigger, workload=w, **g)
    except ConfigError:
        assume(False)
    assert after <= before * (1 + 1e-12)
    # outside the allocator a new parallel dimension only adds its NCCL communicators' buffers
    # (EP: all-to-all + 2 collectives, the most): a small model may grow by those, never more
    most = all_to_all_gib(max(sizes.get("ep", 1), bigger.get("ep", 1))) + 2 * NCCL_COMMUNICATOR_GIB["collective"]
    assert total_after <= total_before + most * GIB + 1e-3


def test_moe_routed_copy_saves_probability_not_expert_output():
    """Per token an MoE block keeps its norm input and input (2h each), the fp32 router probabilities and, per
    routed copy, the expert input (2h), fc1 output, fc2 input and one fp32 probability (megatron-core applies
    the probabilities in the experts' activation), not the expert output."""
    model = load_model_spec("Qwen3-30B-A3B")
    parallel = ParallelConfig(num_gpus=2, ep=2)
    tokens = 4096
    mlp = sum(mlp_activation_bytes(model, parallel, Workload(tokens, 1, 2), 0).values()) / tokens
    h, f, k, e = model.hidden_size, model.moe_ffn_hidden_size, model.moe_router_topk, model.num_moe_experts
    assert mlp == 2 * h + 2 * h + 4 * e + k * (2 * h + 2 * 2 * f + 2 * f + 4)


def test_full_recompute_peak_on_the_last_stage_is_the_larger_of_loss_and_recompute():
    """The loss's fp32 softmax and bf16 logits are freed before the first recomputed layer: the last stage's
    activations are the checkpoints plus the larger of the two working sets, never their sum."""
    model = load_model_spec("Qwen3-30B-A3B").with_num_layers(4)
    parallel = ParallelConfig(num_gpus=2, ep=2)
    full = Workload(8192, 4, 16, RecomputeConfig("full"))
    detail = memory_per_stage(model, parallel, full)[-1].activation_detail
    loss = detail["output_layer"] + detail["logits_transient"]
    assert detail["recompute_working_set"] == 0.0  # 32k tokens x 151936 vocab outweigh one recomputed layer
    assert loss / GIB > 25
    short = Workload(256, 1, 2, RecomputeConfig("full"))
    small = memory_per_stage(model.replace(vocab_size=1024), parallel, short)[-1].activation_detail
    layer = max(layer_activation_bytes(model.replace(vocab_size=1024), parallel, short, i) for i in range(4))
    assert small["recompute_working_set"] == pytest.approx(layer - small["output_layer"] - small["logits_transient"])


def test_fp8_forward_only_caches_no_weight_transpose():
    """Forward-only passes (RLHF reference / log-prob) run under no_grad: TE's weight quantizer asks for no
    column-wise copy, so the cached fp8 weight is 1 byte per TE weight, not 2."""
    model = load_model_spec("Llama-3.1-8B")
    p = ParallelConfig(num_gpus=8)
    fwd = Workload(seq_length=4096, global_batch_size=8, precision="fp8", mode="forward")
    st = stage_memory(model, p, fwd, 0)
    assert st.weights_bytes == 2 * st.parameters.total + st.parameters.decoder_dense


def test_forward_moe_fragments_only_in_forward_moe_passes_with_expandable_segments():
    """The last MoE block's working set is reserved-but-unallocated under the logits (1x H100 histories): only in
    forward-only MoE passes with expandable segments; never in training, dense models or the default allocator,
    and never part of what the allocator hands out."""
    moe, dense = load_model_spec("Qwen3-30B-A3B").with_num_layers(4), load_model_spec("Qwen3-8B").with_num_layers(4)
    p = ParallelConfig(1)
    forward = Workload(8192, 2, 8, mode="forward")
    expandable = MemoryAllowance.for_allocator(True)

    def stage(model, workload, allowance):
        return stage_memory(model, p, workload, 0, allowance=allowance)

    with_hole = stage(moe, forward, expandable)
    assert with_hole.activation_detail["moe_layer_working_set"] > 1.5 * 2**30  # 16k tokens x 8 routed copies
    assert (
        forward_moe_fragment_bytes(with_hole.activation_detail) == with_hole.activation_detail["moe_layer_working_set"]
    )
    no_hole = MemoryAllowance(fragmentation_fraction=expandable.fragmentation_fraction)
    grown = with_hole.allowance_bytes - stage(moe, forward, no_hole).allowance_bytes
    assert grown == pytest.approx(with_hole.activation_detail["moe_layer_working_set"])
    assert with_hole.allocated_bytes == stage(moe, forward, no_hole).allocated_bytes
    assert forward_moe_fragment_bytes(stage(dense, forward, expandable).activation_detail) == 0
    assert forward_moe_fragment_bytes(stage(moe, Workload(8192, 2, 8), expandable).activation_detail) == 0
    assert not MemoryAllowance.for_allocator(False).expandable_segments


def test_interleaved_last_stage_reserves_one_bf16_logits_with_expandable_segments():
    """1-GPU stand-in histories: the last stage of an interleaved pipeline holds one bf16 logits buffer reserved
    but unallocated under expandable segments; not the first stage, not without interleaving, not with the default
    allocator (its fraction covers it), never in what the allocator hands out; it scales with the logits."""
    model = load_model_spec("Qwen3-8B").with_num_layers(4)
    train = Workload(4096, 1, 8)
    expandable = MemoryAllowance.for_allocator(True)
    plain = MemoryAllowance(fragmentation_fraction=expandable.fragmentation_fraction)
    vpp2, pp2 = ParallelConfig(2, pp=2, vpp=2), ParallelConfig(2, pp=2)
    padded = 151936

    def stage(parallel, s, allowance, workload=train):
        return stage_memory(model, parallel, workload, s, allowance=allowance, padded_vocab_size=padded)

    last = stage(vpp2, 1, expandable)
    logits = 2 * 4096 * padded
    assert interleaved_logits_fragment_bytes(last.activation_detail, vpp2) == logits
    assert last.allowance_bytes - stage(vpp2, 1, plain).allowance_bytes == pytest.approx(logits)
    assert last.allocated_bytes == stage(vpp2, 1, plain).allocated_bytes
    assert stage(vpp2, 0, expandable).allowance_bytes == stage(vpp2, 0, plain).allowance_bytes
    assert stage(pp2, 1, expandable).allowance_bytes == stage(pp2, 1, plain).allowance_bytes
    default = MemoryAllowance.for_allocator(False)
    assert stage(vpp2, 1, default).allowance_bytes == stage(vpp2, 1, MemoryAllowance()).allowance_bytes
    longer = stage(vpp2, 1, expandable, Workload(8192, 1, 8))
    assert interleaved_logits_fragment_bytes(longer.activation_detail, vpp2) == 2 * logits
    assert last.non_torch_bytes == default_non_torch_gib(vpp2, True) * GIB


@settings(max_examples=20, deadline=None)
@given(
    model=st.sampled_from(["Qwen3-0.6B", "Qwen3-4B", "Llama-3.1-8B"]),
    mbs=st.sampled_from([1, 2, 4]),
    graphs=st.booleans(),
)
def test_forward_only_keeps_the_layers_working_set_beside_its_logits(model, mbs, graphs):
    """A dense forward-only pass whose peak is its logits: reserved beside them is the layers' working set (the
    cache's freed blocks the logits cannot reuse), eager or with TE-graphed layers; training keeps the fraction of
    the activations, and expandable segments their own rule."""
    from megatron_autotuner.specs.parallel import CudaGraphConfig
    from megatron_autotuner.theory.memory import MemoryAllowance, memory_per_stage

    spec = load_model_spec(model).with_num_layers(4)
    parallel = ParallelConfig(num_gpus=1)
    cuda_graph = CudaGraphConfig("transformer_engine", ("attn", "mlp")) if graphs else CudaGraphConfig()
    forward = Workload(4096, mbs, mbs, mode="forward", cuda_graph=cuda_graph)
    (stage,) = memory_per_stage(spec, parallel, forward)
    detail = stage.activation_detail
    assert detail["logits_working_set"] >= detail["layer_working_set"] > 0
    default = MemoryAllowance()
    non_torch = default.non_torch_for(parallel, False) * 2**30
    assert stage.allowance_bytes == pytest.approx(non_torch + detail["layer_working_set"])
    assert stage.allowance_bytes < non_torch + default.fragmentation_fraction * stage.activations_bytes
    (train,) = memory_per_stage(spec, parallel, Workload(4096, mbs, mbs, cuda_graph=cuda_graph))
    train_non_torch = default.non_torch_for(parallel, True) * 2**30
    assert train.allowance_bytes == pytest.approx(
        train_non_torch + default.fragmentation_fraction * train.activations_bytes
    )
    expandable = MemoryAllowance.for_allocator(True)
    (grown,) = memory_per_stage(spec, parallel, forward, allowance=expandable)
    assert grown.allowance_bytes == pytest.approx(
        non_torch + expandable.fragmentation_fraction * grown.activations_bytes
    )


def test_theory_refuses_fp8_on_a_gpu_without_fp8_tensor_cores():
    """As `estimate` does (a CLI audit found `mat theory` predicting fp8 on an A100); without a GPU, closed form."""
    from megatron_autotuner.specs import get_gpu_spec
    from megatron_autotuner.theory.report import theory_report

    model, p = load_model_spec("Qwen3-8B"), ParallelConfig(num_gpus=8)
    w = Workload(seq_length=4096, global_batch_size=8, precision="fp8")
    with pytest.raises(ConfigError) as err:
        theory_report(model, p, w, get_gpu_spec("A100-80GB"))
    assert err.value.field == "precision"
    assert theory_report(model, p, w, get_gpu_spec("H100-SXM")).peak_memory_gib > 0
    assert theory_report(model, p, w).peak_memory_gib > 0
