import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.specs import ModelSpec, ParallelConfig, RecomputeConfig, Workload, load_model_spec
from megatron_autotuner.theory.flops import iteration_flops, model_flops_per_token, phase_flops


def gpt(h=2304, layers=24, heads=24, vocab=51200):
    return ModelSpec(
        name="gpt",
        hidden_size=h,
        num_layers=layers,
        num_attention_heads=heads,
        ffn_hidden_size=4 * h,
        vocab_size=vocab,
        gated_linear_unit=False,
        activation="gelu",
        normalization="LayerNorm",
        add_bias_linear=True,
        position_embedding_type="learned_absolute",
        max_position_embeddings=2048,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )


def test_llama3_8b_flops_per_token_match_published():
    # Megatron-Bridge performance summary / NeMo 24.07: Llama-3-8B, seq 8192:
    # 5.79e10 FLOPs/token counting full attention, 5.15e10 counting causal attention.
    model = load_model_spec("Llama-3.1-8B")
    assert model_flops_per_token(model, 8192, "full") == pytest.approx(5.79e10, rel=0.01)
    assert model_flops_per_token(model, 8192, "causal") == pytest.approx(5.15e10, rel=0.01)


def test_narayanan_eq3_with_full_recompute():
    # Narayanan et al. 2021 Eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), full recompute, full attention.
    b, s, l, h, v = 512, 2048, 24, 2304, 51200
    expected = 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    flops = iteration_flops(
        gpt(h, l, 24, v),
        ParallelConfig(num_gpus=32),
        Workload(seq_length=s, global_batch_size=b, recompute=RecomputeConfig("full")),
        "full",
    )
    assert flops.hardware_flops == pytest.approx(expected, rel=1e-12)
    # full recompute redoes every layer's forward, not the logits: hardware = model + model/3 - logits fwd
    assert flops.recompute_flops == pytest.approx(flops.model_flops / 3 - 2 * b * s * h * v, rel=1e-12)


def test_phases_and_forward_mode():
    assert phase_flops("fc1", 10.0) == {"fwd": 10.0, "dgrad": 10.0, "wgrad": 10.0}
    assert phase_flops("core_attention", 10.0) == {"fwd": 10.0, "dgrad": 20.0, "wgrad": 0.0}
    model = load_model_spec("Qwen3-8B")
    p = ParallelConfig(num_gpus=8)
    train = iteration_flops(model, p, Workload(seq_length=4096, global_batch_size=8))
    fwd = iteration_flops(model, p, Workload(seq_length=4096, global_batch_size=8, mode="forward"))
    assert train.model_flops == pytest.approx(3 * fwd.model_flops)


def test_moe_counts_only_topk_experts():
    model = load_model_spec("Qwen3-30B-A3B")
    dense_equiv = model.replace(
        num_moe_experts=0,
        moe_router_topk=0,
        moe_ffn_hidden_size=0,
        ffn_hidden_size=model.moe_ffn_hidden_size * model.moe_router_topk,
    )
    moe = model_flops_per_token(model, 4096)
    dense = model_flops_per_token(dense_equiv, 4096)
    router = 3 * 2 * model.hidden_size * model.num_moe_experts * model.num_layers
    assert moe == pytest.approx(dense + router)


def test_selective_recompute_adds_attention_forward():
    model = load_model_spec("Llama-3.1-8B")
    p = ParallelConfig(num_gpus=8, tp=8, sequence_parallel=True)
    base = Workload(seq_length=8192, global_batch_size=8)
    sel = base.replace(recompute=RecomputeConfig("selective"))
    f0 = iteration_flops(model, p, base)
    f1 = iteration_flops(model, p, sel)
    assert f1.model_flops == f0.model_flops
    assert f1.recompute_flops == pytest.approx(f0.by_operator["core_attention"]["fwd"])


LAYOUTS = st.tuples(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 2]),
    st.sampled_from(["none", "selective", "full"]),
)


@settings(max_examples=60, deadline=None)
@given(LAYOUTS)
def test_flops_do_not_depend_on_layout(layout):
    tp, pp, cp, dp, recompute = layout
    model = load_model_spec("Llama-3.1-8B")
    workload = Workload(seq_length=4096, global_batch_size=16, recompute=RecomputeConfig(recompute))
    reference = iteration_flops(model, ParallelConfig(num_gpus=1), workload)
    flops = iteration_flops(model, ParallelConfig(num_gpus=tp * pp * cp * dp, tp=tp, pp=pp, cp=cp), workload)
    assert flops.model_flops == pytest.approx(reference.model_flops, rel=1e-12)
    assert flops.hardware_flops == pytest.approx(reference.hardware_flops, rel=1e-12)


@given(st.integers(1, 64), st.integers(65, 4096))
@settings(max_examples=50, deadline=None)
def test_a_sliding_window_layer_counts_the_keys_each_query_sees(window, seq):
    """Query i of a causal sliding window of w keys attends min(i + 1, w) keys: the per-token count is that sum
    over i, by brute force, times 2*a*(d_qk + d_v); a sequence no longer than the window costs what causal does."""
    from megatron_autotuner.theory.flops import attention_flops_per_token

    model = gpt(h=256, heads=4).replace(window_size=window)
    per_key = 2.0 * 4 * (64 + 64)
    keys = sum(min(i + 1, window) for i in range(seq))
    assert attention_flops_per_token(model, seq, "causal", windowed=True) == pytest.approx(per_key * keys / seq)
    assert attention_flops_per_token(model, window, "causal", windowed=True) == attention_flops_per_token(
        model, window, "causal"
    )


def test_gpt_oss_attention_flops_follow_its_alternating_windows():
    """gpt-oss-20b at 32k: the 12 sliding layers (128 keys) cost ~1/128 of the 12 full causal ones in attention."""
    from megatron_autotuner.theory.flops import layer_forward_flops_per_token

    oss = load_model_spec("gpt-oss-20b")
    sliding = layer_forward_flops_per_token(oss, 0, 32768)["core_attention"]
    full = layer_forward_flops_per_token(oss, 1, 32768)["core_attention"]
    assert full / sliding == pytest.approx((32768 / 2) / (128 - 128 * 127 / (2 * 32768)))
    assert model_flops_per_token(oss, 32768) < model_flops_per_token(
        oss.replace(window_size=0, window_layer_pattern=()), 32768
    )
