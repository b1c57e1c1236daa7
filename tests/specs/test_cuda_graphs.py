"""CUDA graphs: the config, Megatron-LM's flags both ways (one table), Megatron-Bridge names, the memory term.

Golden rules from Megatron-LM @ d98e8a6 / core_r0.19.0: megatron/training/arguments.py (validate_args),
megatron/core/transformer/cuda_graph_config.py and transformer_config.py; Bridge @ 067f987
scripts/performance/utils/overrides.py. Memory from megatron/core/transformer/cuda_graphs.py (TECudaGraphHelper,
TransformerLayer.get_layer_static_inputs), counted by hand below.
"""

from __future__ import annotations

import pytest

from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export.bridge import bridge_overrides
from megatron_autotuner.specs import CudaGraphConfig, ParallelConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.megatron_args import (
    FLAG_TABLE,
    launch_to_specs,
    read_launch,
    render_flags,
    specs_to_megatron_args,
)
from megatron_autotuner.specs.parallel import RecomputeConfig, validate_layout
from megatron_autotuner.theory.memory import GIB, memory_per_stage

QWEN = (
    "torchrun --nproc_per_node 1 pretrain_gpt.py --num-layers 28 --hidden-size 1024 --ffn-hidden-size 3072 "
    "--num-attention-heads 16 --group-query-attention --num-query-groups 8 --kv-channels 128 --swiglu "
    "--normalization RMSNorm --disable-bias-linear --position-embedding-type rope --qk-layernorm "
    "--vocab-size 151936 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
    "--global-batch-size 1 --bf16 --hidden-dropout 0 --attention-dropout 0 "
)
MOE = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 2048 --num-attention-heads 32 "
    "--group-query-attention --num-query-groups 4 --kv-channels 128 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --vocab-size 151936 --seq-length 4096 --micro-batch-size 1 --global-batch-size 8 "
    "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 768 --moe-grouped-gemm --bf16 "
    "--hidden-dropout 0 --attention-dropout 0 "
)


def imported(flags: str, base: str = QWEN):
    return launch_to_specs(read_launch(base + flags))


# ------------------------------------------------------------------------------------------------ the config
def test_config_normalises_as_megatron_core_does():
    assert CudaGraphConfig("transformer_engine", ("mlp", "attn", "attn")).scope == ("attn", "mlp")
    assert CudaGraphConfig("transformer_engine", ("full",)).scope == ()  # deprecated spelling of the whole layer
    assert CudaGraphConfig("none", ("attn",)).scope == ()  # no effect without graphs
    # the local impl captures moe_router and moe_preprocess together (TransformerConfig.__post_init__)
    assert CudaGraphConfig("local", ("moe_router",)).scope == ("moe_router", "moe_preprocess")
    assert CudaGraphConfig("transformer_engine", ("moe_router",)).scope == ("moe_router",)


@pytest.mark.parametrize(
    ("impl", "scope", "field"),
    [
        ("cudagraph", (), "cuda_graph_impl"),
        ("local", ("attention",), "cuda_graph_scope"),
        ("full_iteration", ("attn",), "cuda_graph_scope"),  # must be empty
        ("transformer_engine", ("moe", "moe_router"), "cuda_graph_scope"),
        ("transformer_engine", ("moe_preprocess",), "cuda_graph_scope"),  # needs moe_router
        ("transformer_engine", ("full", "attn"), "cuda_graph_scope"),
    ],
)
def test_config_refuses_what_megatron_core_refuses(impl, scope, field):
    with pytest.raises(ConfigError) as err:
        CudaGraphConfig(impl, scope)
    assert err.value.field == field


def test_captures_follows_the_submodules_under_the_graph():
    whole = CudaGraphConfig("transformer_engine")
    assert whole.captures("attn") and whole.captures("mlp") and whole.captures("moe", moe_layer=True)
    router = CudaGraphConfig("transformer_engine", ("attn", "moe_router", "moe_preprocess"))
    assert router.captures("attn") and router.captures("moe_router", True)
    assert not router.captures("moe", True) and not router.captures("mlp", False)
    assert CudaGraphConfig("full_iteration").captures("moe", True)
    assert not CudaGraphConfig().captures("attn")


def test_model_and_recompute_rules():
    qwen, moe = load_model_spec("Qwen3-0.6B"), load_model_spec("Qwen3-30B-A3B")
    par = ParallelConfig(1)
    with pytest.raises(ConfigError, match="need an MoE model"):
        validate_layout(qwen, par, Workload(4096, cuda_graph=CudaGraphConfig("transformer_engine", ("moe_router",))))
    with pytest.raises(ConfigError, match="dense layers only"):
        validate_layout(
            moe, ParallelConfig(8, ep=8), Workload(4096, 1, 8, cuda_graph=CudaGraphConfig("local", ("mlp",)))
        )
    full = Workload(4096, recompute=RecomputeConfig("full", "uniform", 1), cuda_graph=CudaGraphConfig("local"))
    with pytest.raises(ConfigError, match="full recompute"):
        validate_layout(qwen, par, full)
    validate_layout(qwen, par, full.replace(cuda_graph=CudaGraphConfig("full_iteration")))
    with pytest.raises(ConfigError, match="fixed micro-batch shapes"):
        validate_layout(qwen, par, Workload(4096, max_token_len=8192, cuda_graph=CudaGraphConfig("full_iteration")))


# ------------------------------------------------------------------------------------------------ Megatron-LM flags
def test_flags_are_modelled_rows_of_the_one_table():
    for dest in ("cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope_deprecated", "enable_cuda_graph"):
        assert dest in FLAG_TABLE
    got = imported("--cuda-graph-impl transformer_engine --cuda-graph-modules attn mlp")
    assert got.workload.cuda_graph == CudaGraphConfig("transformer_engine", ("attn", "mlp"))
    assert not any("cuda-graph" in n for n in got.not_modelled)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--enable-cuda-graph", CudaGraphConfig("local")),
        ("--external-cuda-graph --cuda-graph-scope attn", CudaGraphConfig("transformer_engine", ("attn",))),
        ("--cuda-graph-impl local --cuda-graph-scope full_iteration --no-check-for-nan-in-loss-and-grad",
         CudaGraphConfig("full_iteration")),
        ("--cuda-graph-impl none --cuda-graph-modules full_iteration --no-check-for-nan-in-loss-and-grad",
         CudaGraphConfig("full_iteration")),  # migrated even from none (get_deprecated_cuda_graph_modules_migration)
        ("--cuda-graph-impl local --cuda-graph-modules attn full_iteration_inference",
         CudaGraphConfig("local", ("attn",))),  # inference graphs only
        ("--cuda-graph-impl transformer_engine --cuda-graph-warmup-steps 1",
         CudaGraphConfig("transformer_engine", (), 1)),
    ],
)  # fmt: skip
def test_deprecated_spellings_migrate_as_validate_args_does(flags, expected):
    got = imported(flags).workload.cuda_graph
    assert got == expected and got.warmup_steps == expected.warmup_steps


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ("--enable-cuda-graph --cuda-graph-impl local", "cuda_graph_impl"),
        ("--enable-cuda-graph --external-cuda-graph", "enable_cuda_graph"),
        ("--cuda-graph-scope attn --cuda-graph-modules mlp", "cuda_graph_scope_deprecated"),
        ("--cuda-graph-impl full_iteration", "check_for_nan_in_loss_and_grad"),
        ("--cuda-graph-impl transformer_engine --cuda-graph-modules full_iteration", "cuda_graph_modules"),
        ("--cuda-graph-impl transformer_engine --inference-cuda-graph-scope layer", "inference_cuda_graph_scope"),
        ("--cuda-graph-impl local --cpu-offloading-num-layers 2", "cuda_graph_impl"),
    ],
)
def test_launches_megatron_lm_refuses(flags, field):
    with pytest.raises(ConfigError) as err:
        imported(flags)
    assert err.value.field == field


def test_te_graphs_with_expandable_segments_need_nccl_graph_register_off():
    flags = "--cuda-graph-impl transformer_engine"
    with pytest.raises(ConfigError, match="NCCL_GRAPH_REGISTER=0"):
        imported(flags, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" + QWEN)
    ok = imported(flags, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NCCL_GRAPH_REGISTER=0\n" + QWEN)
    assert ok.workload.cuda_graph.impl == "transformer_engine"


def test_moe_graphs_need_drop_and_pad():
    with pytest.raises(ConfigError, match="drop-and-pad"):
        imported("--cuda-graph-impl transformer_engine --cuda-graph-modules moe", MOE)


def test_moe_host_bound_only_when_the_moe_block_is_eager():
    """An eager MoE block is held to its host floor, fused permute or not, unless a graph covers the whole block."""
    base = "--moe-token-dispatcher-type alltoall "
    assert imported(base, MOE).options["moe_host_bound"]
    assert imported(base + "--cuda-graph-impl transformer_engine --cuda-graph-modules attn moe_router", MOE).options[
        "moe_host_bound"
    ]
    assert not imported(base + "--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad", MOE).options[
        "moe_host_bound"
    ]
    fused = imported(base + "--moe-permute-fusion", MOE).options
    assert fused["moe_host_bound"] and fused["moe_permute_fusion"]
    assert not imported(base, MOE).options["moe_permute_fusion"]


@pytest.mark.parametrize(
    "graphs",
    [CudaGraphConfig(), CudaGraphConfig("transformer_engine", ("attn", "mlp")), CudaGraphConfig("local"),
     CudaGraphConfig("full_iteration"), CudaGraphConfig("transformer_engine", (), 1)],
)  # fmt: skip
def test_export_then_import_gives_the_same_graphs(graphs):
    model = load_model_spec("Qwen3-0.6B")
    args = specs_to_megatron_args(model, ParallelConfig(1), Workload(4096, cuda_graph=graphs))
    flags = render_flags(args)
    text = "torchrun --nproc_per_node 1 pretrain_gpt.py " + " ".join(flags)
    got = launch_to_specs(read_launch(text)).workload.cuda_graph
    assert got == graphs and got.warmup_steps == graphs.warmup_steps
    if graphs.impl == "full_iteration":
        assert "--no-check-for-nan-in-loss-and-grad" in flags
    if graphs.scope:
        assert "--cuda-graph-modules attn mlp" in flags


def test_bridge_names():
    """Bridge's perf overrides: model.cuda_graph_impl / cuda_graph_scope, te_rng_tracker on, and full_iteration as
    impl local + scope full_iteration with the NaN check off."""
    te = bridge_overrides({"seq_length": 4096, "cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn"]})
    assert te["model"]["cuda_graph_impl"] == "transformer_engine" and te["model"]["cuda_graph_scope"] == ["attn"]
    assert te["rng"] == {"te_rng_tracker": True} and "rerun_state_machine" not in te
    full = bridge_overrides(
        {"seq_length": 4096, "cuda_graph_impl": "full_iteration", "check_for_nan_in_loss_and_grad": False}
    )
    assert (full["model"]["cuda_graph_impl"], full["model"]["cuda_graph_scope"]) == ("local", ["full_iteration"])
    assert full["rerun_state_machine"] == {"check_for_nan_in_loss": False}
    assert "cuda_graph_impl" not in bridge_overrides({"seq_length": 4096})["model"]


# ------------------------------------------------------------------------------------------------ memory
def test_te_static_inputs_golden():
    """Qwen3-0.6B, b=1, s=4096, one GPU: per layer a bf16 hidden state 2*4096*1024 = 8 MiB and a boolean causal
    mask 1*4096*4096 = 16 MiB (attention captured); 28 layers x 24 MiB = 672 MiB = 0.65625 GiB, plus one shared
    grad-output buffer of 8 MiB. Everything else is the eager activations."""
    model, par = load_model_spec("Qwen3-0.6B"), ParallelConfig(1)
    eager = memory_per_stage(model, par, Workload(4096))[0]
    te = memory_per_stage(
        model, par, Workload(4096, cuda_graph=CudaGraphConfig("transformer_engine", ("attn", "mlp")))
    )[0]
    assert te.activation_detail["cuda_graph_static_inputs"] == 28 * (2 * 4096 * 1024 + 4096 * 4096)
    assert te.activation_detail["cuda_graph_grad_output"] == 2 * 4096 * 1024
    assert te.activations_bytes - eager.activations_bytes == pytest.approx(0.65625 * GIB + 8 * 2**20)
    # mlp only: no mask, hidden state only
    mlp = memory_per_stage(model, par, Workload(4096, cuda_graph=CudaGraphConfig("transformer_engine", ("mlp",))))[0]
    assert mlp.activation_detail["cuda_graph_static_inputs"] == 28 * 2 * 4096 * 1024
    # the graphed layers' activations are held in the pool: all of decoder_layers with the whole layer captured
    assert te.graph_pool_bytes == pytest.approx(eager.activation_detail["decoder_layers"])
    # local graphs alias inputs to the previous graph's outputs: no static copies
    local = memory_per_stage(model, par, Workload(4096, cuda_graph=CudaGraphConfig("local")))[0]
    assert local.activations_bytes == eager.activations_bytes


def test_static_inputs_scale_with_in_flight_micro_batches():
    """pp=2: TECudaGraphHelper captures every micro-batch and reuses a static set once its backward is done, so a
    rank holds one set per in-flight micro-batch (1F1B: pp - stage)."""
    model = load_model_spec("Qwen3-0.6B")
    par = ParallelConfig(2, pp=2)
    w = Workload(4096, 1, 8, cuda_graph=CudaGraphConfig("transformer_engine"))
    first, last = memory_per_stage(model, par, w)
    per_layer = 2 * 4096 * 1024 + 4096 * 4096
    assert first.activation_detail["cuda_graph_static_inputs"] == 2 * 14 * per_layer
    assert last.activation_detail["cuda_graph_static_inputs"] == 1 * 14 * per_layer


def test_optimizer_step_cannot_reuse_the_graph_pool():
    """With bf16 main grads the optimizer step's fp32 grad copy is held only at the step; eager it reuses the freed
    activations, with a full-iteration graph the pool keeps them."""
    model = load_model_spec("Qwen3-0.6B")
    par = ParallelConfig(1, grad_reduce_in_fp32=False)
    eager = memory_per_stage(model, par, Workload(256))[0]
    full = memory_per_stage(model, par, Workload(256, cuda_graph=CudaGraphConfig("full_iteration")))[0]
    assert eager.optimizer_step_bytes > eager.activations_bytes  # short sequences: the step is the peak
    assert eager.allocated_bytes == eager.model_state_bytes + eager.optimizer_step_bytes
    assert full.allocated_bytes == full.model_state_bytes + full.optimizer_step_bytes + full.activations_bytes


def test_forward_only_te_graphs_keep_the_captured_activations():
    """The helper captures forward + backward in training mode and megatron-core replays only in training mode: a
    forward-only pass holds one micro-batch of the graphed layers' saved activations (pp=1)."""
    model, par = load_model_spec("Qwen3-0.6B"), ParallelConfig(1)
    train = memory_per_stage(model, par, Workload(4096))[0]
    fwd = Workload(4096, mode="forward", cuda_graph=CudaGraphConfig("transformer_engine"))
    st = memory_per_stage(model, par, fwd)[0]
    assert st.activation_detail["cuda_graph_saved_activations"] == pytest.approx(
        train.activation_detail["decoder_layers"]
    )


def test_estimate_threads_the_graphs_into_the_layer_context():
    model, gpu = load_model_spec("Qwen3-0.6B"), get_gpu_spec("H100-SXM")
    w = Workload(4096, cuda_graph=CudaGraphConfig("transformer_engine", ("attn", "mlp")))
    e = estimate(model, ParallelConfig(1), w, gpu, CostOptions())
    assert e.peak_memory_gib > estimate(model, ParallelConfig(1), Workload(4096), gpu, CostOptions()).peak_memory_gib


# ------------------------------------------------------------------------------------------------ search
def test_search_tries_graphs_and_fits_their_memory():
    """With graphs in the space every layout is tried eager and with TE per-layer graphs; the graphed ones need
    their static inputs more (so never less memory), and per-layer graphs with full recompute are refused."""
    from megatron_autotuner.search.plan import plan
    from megatron_autotuner.search.space import SearchSpace, cuda_graph_choices

    model, gpu = load_model_spec("Qwen3-0.6B"), get_gpu_spec("H100-SXM")
    choices = cuda_graph_choices(model)
    assert choices[1] == CudaGraphConfig("transformer_engine", ("attn", "mlp"))
    assert cuda_graph_choices(load_model_spec("Qwen3-30B-A3B"))[1].scope == ("attn", "moe_router", "moe_preprocess")
    space = SearchSpace(tp=(1,), pp=(1,), cp=(1,), micro_batch_sizes=(1,), cuda_graphs=choices)
    result = plan(model, gpu, 1, 4096, 1, space=space)
    by_graph = {}
    for c in result.candidates:
        by_graph.setdefault(c.workload.recompute.granularity, {})[c.workload.cuda_graph.impl] = c.estimate
    for granularity in ("none", "selective"):
        eager, te = by_graph[granularity]["none"], by_graph[granularity]["transformer_engine"]
        assert te.peak_memory_gib > eager.peak_memory_gib
    assert "transformer_engine" not in by_graph["full"]
    assert any("full recompute works only" in r.reason for r in result.rejections)
