import pytest

from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload, load_model_spec
from megatron_autotuner.theory.comm import comm_bytes_by_dimension, stage_comm_volumes, wire_factor
from megatron_autotuner.theory.params import stage_parameters


def by_key(volumes):
    return {(v.dimension, v.collective): v for v in volumes}


def test_wire_factors():
    assert wire_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert wire_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert wire_factor("send_recv", 2) == 1.0
    assert wire_factor("all_reduce", 1) == 0.0


def test_tp_sp_collectives_per_layer():
    model = load_model_spec("Llama-3.1-8B")
    p = ParallelConfig(num_gpus=2, tp=2, sequence_parallel=True)
    w = Workload(seq_length=8192, global_batch_size=4)
    v = by_key(stage_comm_volumes(model, p, w, 0))
    m, L = 4, model.num_layers
    msg = 2 * 8192 * model.hidden_size
    # forward 2 AG + 2 RS per layer, backward mirrors them, plus 2 wgrad re-gathers per layer
    # (the single output-layer gather is listed on its own entry)
    ag = [x for x in stage_comm_volumes(model, p, w, 0) if x.collective == "all_gather"]
    assert sum(x.calls for x in ag) == m * (6 * L + 1)
    assert v[("tp", "reduce_scatter")].message_bytes == msg
    full = w.replace(recompute=RecomputeConfig("full"))
    ag_full = [x for x in stage_comm_volumes(model, p, full, 0) if x.collective == "all_gather"]
    assert sum(x.calls for x in ag_full) == m * (8 * L + 1)


def test_tp_without_sp_uses_all_reduce():
    model = load_model_spec("Llama-3.1-8B")
    p = ParallelConfig(num_gpus=4, tp=4)
    vols = stage_comm_volumes(model, p, Workload(seq_length=4096, global_batch_size=1), 0)
    ar = [v for v in vols if v.dimension == "tp" and v.collective == "all_reduce"]
    assert sum(v.calls for v in ar) == 4 * model.num_layers + 1 + 3  # layers, embedding, cross-entropy


def test_dp_distributed_optimizer_volumes():
    model = load_model_spec("Llama-3.1-8B")
    p = ParallelConfig(num_gpus=8)
    vols = by_key(stage_comm_volumes(model, p, Workload(seq_length=4096, global_batch_size=8), 0))
    n = 8_030_261_248 + (model.padded_vocab_size(1) - model.vocab_size) * 0
    assert vols[("dp", "reduce_scatter")].message_bytes == 4 * n
    assert vols[("dp", "all_gather")].message_bytes == 2 * n
    assert vols[("dp", "reduce_scatter")].wire_bytes == pytest.approx(4 * n * 7 / 8)
    plain = by_key(
        stage_comm_volumes(
            model, p.replace(use_distributed_optimizer=False), Workload(seq_length=4096, global_batch_size=8), 0
        )
    )
    assert plain[("dp", "all_reduce")].wire_bytes == pytest.approx(4 * n * 2 * 7 / 8)


def test_fp8_params_are_all_gathered_in_fp8():
    """--fp8-param-gather: the TE linear weights (decoder, experts) travel in fp8, 1 byte; the word embedding,
    final norm and output layer stay bf16. Gradients are reduced as before."""
    for name, ep in (("Llama-3.1-8B", 1), ("Qwen3-30B-A3B", 4)):
        model = load_model_spec(name)
        p = ParallelConfig(num_gpus=8, ep=ep)
        w = Workload(seq_length=4096, global_batch_size=8, precision="fp8")
        bf16 = by_key(stage_comm_volumes(model, p, w, 0))
        fp8 = by_key(stage_comm_volumes(model, p, w.replace(fp8_param=True), 0))
        c = stage_parameters(model, p, 0)
        assert bf16[("dp", "all_gather")].message_bytes == 2 * c.dense
        assert fp8[("dp", "all_gather")].message_bytes == 2 * c.dense - c.decoder_dense
        assert fp8[("dp", "reduce_scatter")] == bf16[("dp", "reduce_scatter")]
        if ep > 1:
            assert fp8[("edp", "all_gather")].message_bytes == c.experts
            assert bf16[("edp", "all_gather")].message_bytes == 2 * c.experts


def test_pp_cp_ep_volumes():
    model = load_model_spec("Qwen3-30B-A3B")
    p = ParallelConfig(num_gpus=16, tp=1, pp=2, cp=2, ep=4)
    w = Workload(seq_length=8192, global_batch_size=16)
    first, last = (by_key(stage_comm_volumes(model, p, w, s)) for s in (0, 1))
    m = 16 // 4
    tokens = 8192 // 2
    assert first[("pp", "send_recv")].calls == m  # activations forward only
    assert last[("pp", "send_recv")].calls == m  # gradients backward only
    kv = 2 * tokens * 2 * model.num_query_groups * model.kv_channels
    layers = model.num_layers // 2
    assert first[("cp", "send_recv")].message_bytes == kv
    assert first[("cp", "send_recv")].calls == m * 3 * (2 - 1) * layers
    a2a = first[("ep", "all_to_all")]
    assert a2a.calls == m * 4 * layers and a2a.message_bytes == 2 * tokens * 8 * model.hidden_size
    assert set(comm_bytes_by_dimension(list(first.values()))) == {"pp", "cp", "ep", "dp", "edp"}


def test_the_all_to_all_moves_a_ranks_own_rows_before_the_expert_tp_gather():
    """megatron-core's alltoall dispatcher all-to-alls a rank's permuted local rows over the EP group, then gathers
    them over the expert-TP group (`token_dispatch`, then `dispatch_postprocess`; token_dispatcher.py @ Megatron-LM
    d98e8a6). Grok-1's dgxc layout, tp 4 = etp 4 (sequence parallel), ep 8, 4096 tokens, top-2, hidden 6144, by
    hand: 4096 / 4 x 2 rows x 6144 x 2 bytes = 25,165,824 bytes per all-to-all, whatever etp is (the experts then
    see 4x the rows); it had been counted 4x."""
    model = load_model_spec("Mixtral-8x7B").replace(hidden_size=6144, num_layers=4)
    w = Workload(seq_length=4096, global_batch_size=1024)
    for etp in (1, 4):
        p = ParallelConfig(num_gpus=32, tp=4, ep=8, etp=etp, sequence_parallel=True)
        a2a = by_key(stage_comm_volumes(model, p, w, 0))[("ep", "all_to_all")]
        assert a2a.message_bytes == 4096 // 4 * 2 * 6144 * 2 == 25_165_824
        assert model.routed_tokens(4096, 4, etp, 1.0) == 4096 // 4 * 2 * etp


def test_expert_tp_gathers_and_scatters_the_routed_rows():
    """With etp > 1 the alltoall dispatcher all-gathers the routed rows over the expert-TP group after the all-to-all
    and reduce-scatters the experts' output before the combine; backward mirrors both. Mixtral-8x7B tp 2 = etp 2,
    ep 2, on 4 GPUs, 4096 tokens, one micro-batch, by hand: the gathered tensor is 4096 / 2 x 2 (top-2) x 2 (etp)
    rows x 4096 x 2 bytes = 64 MiB, gathered and scattered twice per layer (forward, backward), half of it on the
    wire each time: 32 layers x 4 x 32 MiB = 4 GiB. None with etp = 1, nor with the allgather dispatcher (its etp x ep
    gather counts under ep)."""
    model = load_model_spec("Mixtral-8x7B")
    w = Workload(seq_length=4096, global_batch_size=2)
    p = ParallelConfig(num_gpus=4, tp=2, ep=2, etp=2, sequence_parallel=True)
    volumes = by_key(stage_comm_volumes(model, p, w, 0))
    for collective in ("all_gather", "reduce_scatter"):
        v = volumes[("etp", collective)]
        assert v.message_bytes == 4096 // 2 * 2 * 2 * 4096 * 2 == 64 * 2**20
        assert v.calls == 2 * 32
    assert comm_bytes_by_dimension(list(volumes.values()))["etp"] == 4 * 2**30
    for other in (p.replace(etp=1), p.replace(moe_dispatcher="allgather")):
        assert "etp" not in comm_bytes_by_dimension(stage_comm_volumes(model, other, w, 0))


def test_routed_experts_add_no_tp_gathers_shared_experts_do():
    """With SP, each residual block with TP linears all-gathers before its first linear and reduce-scatters after its
    last (backward: the mirror and, for the weight gradients, a re-gather). A MoE block's routed experts take the
    sequence-parallel shard and move tokens in the dispatcher, so only the attention block counts for Mixtral; shared
    experts (Qwen1.5-MoE) are TE linears like a dense MLP. 2 layers, 1 micro-batch, training: 3 gathers and 2
    scatters per block."""
    w = Workload(seq_length=4096, global_batch_size=2)
    for name, blocks_per_layer in (("Mixtral-8x7B", 1), ("Qwen1.5-MoE-A2.7B", 2), ("Llama-3.1-8B", 2)):
        model = load_model_spec(name).replace(num_layers=2)
        p = ParallelConfig(num_gpus=8, tp=4, ep=2 if model.num_moe_experts else 1, sequence_parallel=True)
        hidden = 2 * 4096 * model.hidden_size
        per_block = [v for v in stage_comm_volumes(model, p, w, 0) if v.dimension == "tp"][:2]
        assert [(v.collective, v.message_bytes) for v in per_block] == [
            ("all_gather", hidden),
            ("reduce_scatter", hidden),
        ]
        n = 2 * blocks_per_layer
        assert [v.calls for v in per_block] == [3 * n, 2 * n], name
