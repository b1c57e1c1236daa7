"""MoE routing imbalance and expert capacity (`specs.parallel.MoeRouting`): the busiest expert-parallel rank's share
sets the pace of its expert GEMMs and all-to-all and the size of its expert activations; capacity drops what is past
it, padding computes all of it (megatron-core moe_utils.get_capacity)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.costmodel.collectives import collective_time_s
from megatron_autotuner.costmodel.estimate import estimate
from megatron_autotuner.costmodel.layer import E_BF16, LayerContext, gemm_shapes, layer_cost
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export import megatron_args
from megatron_autotuner.specs import ClusterSpec, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch
from megatron_autotuner.specs.parallel import MoeRouting, ParallelConfig, Workload
from megatron_autotuner.theory.memory import mlp_activation_bytes

H100 = get_gpu_spec("H100-SXM")
MOE = load_model_spec("Qwen3-30B-A3B")


@pytest.mark.parametrize(
    "routing,load",
    [
        (MoeRouting(), 1.0),
        (MoeRouting(1.5), 1.5),  # dropless: the busiest rank takes all its tokens
        (MoeRouting(1.5, 1.2), 1.2),  # dropping: at most the capacity
        (MoeRouting(1.1, 1.2), 1.1),
        (MoeRouting(1.0, 1.25, True), 1.25),  # padded: every expert computes its whole capacity
        (MoeRouting(1.0, 0.8), 0.8),  # a capacity under the mean drops tokens even when balanced
    ],
)
def test_expert_load(routing, load):
    assert routing.expert_load(8) == pytest.approx(load)
    # one rank holds every expert: no imbalance between ranks, the capacity still bounds and pads
    one_rank = routing.capacity_factor if routing.drop_and_pad else min(1.0, routing.capacity_factor or 1.0)
    assert routing.expert_load(1) == pytest.approx(one_rank)


def test_routing_bounds_on_the_layout():
    """The busiest of ep ranks takes at most ep x the mean (more is refused; at ep 1 there is nothing to imbalance);
    a padded capacity past num_experts / top-k rows per expert holds padding only; a dense model takes no routing.
    Huge values had overflowed into a traceback (found by a CLI audit)."""
    from megatron_autotuner.errors import ConfigError
    from megatron_autotuner.specs import ParallelConfig, Workload
    from megatron_autotuner.specs.parallel import validate_layout

    def check(model, ep, routing):
        validate_layout(
            model,
            ParallelConfig(num_gpus=8, ep=ep),
            Workload(seq_length=4096, global_batch_size=64, moe_routing=routing),
        )

    check(MOE, 1, MoeRouting(3.0))
    check(MOE, 8, MoeRouting(8.0))
    for ep, routing, field in (
        (8, MoeRouting(8.5), "moe_load_imbalance"),
        (8, MoeRouting(1e308), "moe_load_imbalance"),
        (8, MoeRouting(1.0, 17.0, True), "moe_expert_capacity_factor"),  # 128 experts / top-8 = 16
    ):
        with pytest.raises(ConfigError) as err:
            check(MOE, ep, routing)
        assert err.value.field == field
    check(MOE, 8, MoeRouting(1.0, 16.0, True))
    with pytest.raises(ConfigError) as err:
        check(load_model_spec("Llama-3.1-8B"), 1, MoeRouting(1.5))
    assert err.value.field == "moe_load_imbalance"


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"load_imbalance": 0.9}, "moe_load_imbalance"),
        ({"load_imbalance": float("inf")}, "moe_load_imbalance"),
        ({"capacity_factor": 0.0}, "moe_expert_capacity_factor"),
        ({"pad_to_capacity": True}, "moe_pad_expert_input_to_capacity"),
    ],
)
def test_bad_routing_is_refused(kwargs, field):
    with pytest.raises(ConfigError) as exc:
        MoeRouting(**kwargs)
    assert exc.value.field == field


def test_the_busiest_rank_s_experts_and_all_to_all_scale_with_its_load():
    ctx = LayerContext(cluster=ClusterSpec(H100, 16), ep=16, tokens=8192, seq_length=8192)
    busy = LayerContext(cluster=ClusterSpec(H100, 16), ep=16, tokens=8192, seq_length=8192, expert_load=2.0)
    base, doubled = gemm_shapes(MOE, 0, ctx), gemm_shapes(MOE, 0, busy)
    assert doubled["experts_fc1"][0] == 2 * base["experts_fc1"][0]
    assert doubled["router"] == base["router"]  # the router sees the rank's own tokens
    routed = 8192 * MOE.moe_router_topk * 2.0
    a2a = collective_time_s("all_to_all", 16, E_BF16 * routed * MOE.hidden_size, ctx.cluster, 1)
    assert layer_cost(MOE, 0, busy).fwd.parts["ep"] == pytest.approx(2 * a2a)


def test_expert_activations_scale_with_the_load():
    parallel = ParallelConfig(num_gpus=16, ep=16)
    parts = [
        mlp_activation_bytes(MOE, parallel, Workload(4096, 1, 16, moe_routing=MoeRouting(r)), 0) for r in (1.0, 1.5)
    ]
    assert parts[1]["experts_input"] == pytest.approx(1.5 * parts[0]["experts_input"])
    assert parts[1]["moe_input"] == parts[0]["moe_input"]


def test_imbalance_slows_the_step_and_padding_at_capacity_one_changes_nothing_when_balanced():
    parallel = ParallelConfig(num_gpus=32, ep=32)

    def step(routing: MoeRouting) -> float:
        return estimate(MOE, parallel, Workload(8192, 4, 256, moe_routing=routing), H100).step_time_s

    balanced = step(MoeRouting())
    assert step(MoeRouting(1.5)) > 1.2 * balanced
    # NVIDIA's token-drop benchmarks: capacity 1.0, padded, force-balanced routing
    assert step(MoeRouting(1.0, 1.0, True)) == pytest.approx(balanced)


def test_capacity_flags_are_read_and_written_back():
    flags = (
        "--num-layers 48 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 4 --kv-channels 128 "
        "--ffn-hidden-size 6144 --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --seq-length 4096 "
        "--micro-batch-size 1 --global-batch-size 64 --expert-model-parallel-size 8 --vocab-size 151936 --bf16 "
        "--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity --world-size 8"
    )
    imported = launch_to_specs(read_launch(flags), num_gpus=8)
    assert imported.workload.moe_routing == MoeRouting(1.0, 1.25, True)
    args = megatron_args(imported.model, imported.parallel, imported.workload)
    assert args["moe_expert_capacity_factor"] == 1.25 and args["moe_pad_expert_input_to_capacity"] is True


def test_cli_takes_the_imbalance_and_refuses_a_bad_one_in_one_line(capsys):
    argv = ["estimate", "--model", "Qwen3-30B-A3B", "--gpu", "H100-SXM", "--num-gpus", "32", "--ep", "32",
            "--seq-len", "8192", "--micro-batch-size", "4", "--global-batch-size", "256", "--json"]  # fmt: skip
    assert main([*argv, "--moe-load-imbalance", "1.5"]) == 0
    assert '"load_imbalance": 1.5' in capsys.readouterr().out
    assert main([*argv, "--moe-load-imbalance", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mat: error: moe_load_imbalance: ") and "\n" not in err


def test_a_launch_plan_keeps_its_capacity(tmp_path, capsys):
    launch = Path(__file__).resolve().parents[1] / "fixtures/launches/qwen3_235b_a22b_h100_256gpu_fp8cs.sh"
    argv = ["plan", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--moe-load-imbalance", "1.2", "--json",
            "--output-dir", str(tmp_path), "--top", "1"]  # fmt: skip
    assert main(argv) == 0
    assert '"load_imbalance": 1.2' in capsys.readouterr().out


def test_the_moe_module_recompute_already_holds_the_activation():
    """Recomputing `moe` re-runs the whole block, its activation included: adding `moe_act` costs nothing more (the
    activation had been counted twice; a CLI audit)."""
    from megatron_autotuner.costmodel.estimate import estimate
    from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload

    def recompute_s(modules):
        w = Workload(seq_length=4096, global_batch_size=64, recompute=RecomputeConfig("selective", modules=modules))
        est = estimate(MOE, ParallelConfig(num_gpus=8, ep=8), w, H100)
        return est.to_dict()["time_breakdown_s"]["compute"]["recompute"]

    assert recompute_s(("moe",)) > recompute_s(("moe_act",)) > 0
    assert recompute_s(("moe", "moe_act")) == pytest.approx(recompute_s(("moe",)))
