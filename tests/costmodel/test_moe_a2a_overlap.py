"""Megatron's batch-level EP all-to-all overlap (`costmodel.moe_overlap`): the combined forward / backward step of one
MoE layer on two streams, in the order TransformerLayerSchedulePlan.run issues it, by hand and as properties; the
flags read from a launch and written back; the search trying it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.cli import main
from megatron_autotuner.costmodel.estimate import estimate
from megatron_autotuner.costmodel.moe_overlap import MoeLayerPieces, overlapped_pair_s, warmup_chunks
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export import megatron_args
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch_file
from megatron_autotuner.specs.parallel import ParallelConfig, RecomputeConfig, Workload, validate_layout

LAUNCHES = Path(__file__).resolve().parents[1] / "fixtures/launches"
H100 = get_gpu_spec("H100-SXM")


def pieces(pre_f, e_f, pre_b, e_d, e_w, a2a) -> MoeLayerPieces:
    return MoeLayerPieces(pre_f, e_f, pre_b, e_d, e_w, a2a)


@pytest.mark.parametrize(
    "p,delay,expected",
    [
        # compute-bound: every all-to-all hides; 19 s serial -> the 15 s of computation
        (pieces(2, 3, 4, 3, 3, 1), False, 15.0),
        (pieces(2, 3, 4, 3, 3, 1), True, 15.0),
        # communication-bound: the four all-to-alls back to back (the computation hides)
        (pieces(1, 1, 1, 1, 1, 5), False, 20.0),
        # the experts' long weight gradient holds the backward dispatch back unless delayed:
        # combine_bwd 0-3, dispatch_fwd 3-6, dgrad 3-4, wgrad 4-7; dispatch_bwd 7-10 (6-9 delayed), experts_fwd 7-8,
        # combine_fwd 10-13 (9-12), pre_dispatch_bwd 10-11 (9-10)
        (pieces(1, 1, 1, 1, 3, 3), False, 13.0),
        (pieces(1, 1, 1, 1, 3, 3), True, 12.0),
        # no communication: the computation, serial
        (pieces(2, 3, 4, 3, 3, 0), False, 15.0),
    ],
)
def test_combined_step_by_hand(p, delay, expected):
    assert overlapped_pair_s(p, delay) == pytest.approx(expected)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=6, max_size=6))
def test_combined_step_is_between_its_two_streams_and_the_serial_step(values):
    p = pieces(*values)
    compute = p.pre_dispatch_fwd + p.experts_fwd + p.pre_dispatch_bwd + p.experts_bwd_dgrad + p.experts_bwd_wgrad
    for delay in (False, True):
        pair = overlapped_pair_s(p, delay)
        assert max(compute, 4 * p.all_to_all) - 1e-9 <= pair <= p.serial_s + 1e-9
    assert overlapped_pair_s(p, True) <= overlapped_pair_s(p, False) + 1e-9


def test_warmup_forwards_as_megatron_core_counts_them():
    assert warmup_chunks(1, 1, 0) == 1
    # schedules.get_pp_rank_microbatches: (pp - rank - 1) * 2 + (vpp - 1) * pp, plus one with the overlap
    assert warmup_chunks(4, 2, 0) == 3 * 2 + 1 * 4 + 1
    assert warmup_chunks(4, 2, 3) == 0 + 4 + 1


def test_megatron_core_s_conditions_are_one_line_errors():
    with pytest.raises(ConfigError, match="delay_wgrad_compute"):
        ParallelConfig(num_gpus=8, ep=8, delay_wgrad_compute=True)
    with pytest.raises(ConfigError, match="ep > 1"):
        ParallelConfig(num_gpus=8, moe_a2a_overlap=True)
    with pytest.raises(ConfigError, match="vpp"):
        ParallelConfig(num_gpus=8, pp=2, ep=4, moe_a2a_overlap=True)
    moe = load_model_spec("Qwen3-30B-A3B")
    full = Workload(4096, 1, 64, recompute=RecomputeConfig("full", "uniform", 1))
    with pytest.raises(ConfigError, match="full recompute"):
        validate_layout(moe, ParallelConfig(num_gpus=8, ep=8, moe_a2a_overlap=True), full)


def test_the_overlap_hides_all_to_all_where_the_gpu_sets_the_pace_only():
    moe = load_model_spec("Qwen3-30B-A3B")
    gpu_bound, host_bound = Workload(8192, 4, 256), Workload(4096, 1, 256)
    for work, saves in ((gpu_bound, True), (host_bound, False)):
        serial, combined = (
            estimate(moe, ParallelConfig(num_gpus=32, ep=32, moe_a2a_overlap=ov, delay_wgrad_compute=ov), work, H100)
            for ov in (False, True)
        )
        ep = [e.to_dict()["time_breakdown_s"]["exposed_comm"]["ep"] for e in (serial, combined)]
        if saves:
            assert combined.step_time_s < serial.step_time_s and ep[1] < ep[0]
        else:  # eager MoE layers paced by their host: the host issues both passes either way, and now also waits
            # for the output layer at each combined micro-batch's first token-count sync (`head_drain_s`)
            assert combined.step_time_s > serial.step_time_s


def test_the_overlap_hides_no_more_than_the_blocks_gpu_time_over_their_host_floor():
    """NVIDIA's Qwen3-235B recipe on 256 H100 (4 local experts at EP 32, micro-batch 1): each eager MoE block's GPU
    time is above its host floor by less than the all-to-all the overlap would hide. Without host floors the overlap
    hides it all; with them it takes off no more than the blocks' slack, the rest shows as the host's time, and the
    step lands in the range Megatron-Bridge published for the recipe (1611-1712 tokens/s/GPU: 76.6-81.4 s)."""
    from dataclasses import replace

    from megatron_autotuner.costmodel.estimate import CostOptions

    launch = read_launch_file("tests/fixtures/launches/qwen3_235b_a22b_h100_256gpu_fp8cs.sh")
    imported = launch_to_specs(launch, load_model_spec("Qwen3-235B-A22B"))
    options = CostOptions(**imported.options)
    no_host = replace(options, host_floor=False, moe_host_bound=False)
    steps = {}
    for name, opts in (("with host", options), ("without host", no_host)):
        for overlap in (False, True):
            parallel = replace(imported.parallel, moe_a2a_overlap=overlap, delay_wgrad_compute=overlap)
            steps[name, overlap] = estimate(imported.model, parallel, imported.workload, H100, opts)
    hidden_without_host = steps["without host", False].step_time_s - steps["without host", True].step_time_s
    hidden_with_host = steps["with host", False].step_time_s - steps["with host", True].step_time_s
    assert 0.0 < hidden_with_host < 0.5 * hidden_without_host
    assert steps["with host", False].time.breakdown["host_bound"] == 0.0  # serially the GPU paces every block
    assert steps["with host", True].time.breakdown["host_bound"] > 0.2 * steps["with host", True].step_time_s
    assert 8192 * 4096 / (1712 * 256) < steps["with host", True].step_time_s < 8192 * 4096 / (1611 * 256)


def test_a_recipe_s_flags_are_read_and_written_back():
    launch = launch_to_specs(read_launch_file(str(LAUNCHES / "qwen3_235b_a22b_h100_256gpu_fp8cs.sh")))
    assert launch.parallel.moe_a2a_overlap and launch.parallel.delay_wgrad_compute
    assert not any("overlap-moe-expert-parallel-comm" in n or "delay-wgrad" in n for n in launch.not_modelled)
    args = megatron_args(launch.model, launch.parallel, launch.workload)
    assert args["overlap_moe_expert_parallel_comm"] is True and args["delay_wgrad_compute"] is True


def test_mat_plan_tries_the_overlap_for_a_moe_model(capsys, tmp_path):
    argv = ["plan", "--model", "Qwen3-30B-A3B", "--gpu", "H100-SXM", "--num-gpus", "32", "--seq-len", "8192",
            "--global-batch-size", "256", "--top", "100", "--json", "--output-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "a2a-overlap+delay-wgrad" in out


def test_flex_dispatchers_send_a_token_to_each_other_node_once():
    """Qwen3-30B-A3B's 128 experts top-8 over 2 nodes: the alltoall dispatcher sends 4 of a token's 8 copies across
    on average; DeepEP / HybridEP send it once to a node holding any of its experts (1 - C(64, 8) / C(128, 8) of
    the time). Inside one node (ep 8, 16 experts a rank) they send it once to each rank holding any of its experts:
    8 (1 - C(112, 8) / C(128, 8)) = 5.34 ranks, its own among them, where the alltoall dispatcher moves all 8 copies."""
    from math import comb

    from megatron_autotuner.costmodel.collectives import collective_time_s, dispatch_time_s, remote_nodes_per_token
    from megatron_autotuner.specs import ClusterSpec

    assert remote_nodes_per_token(128, 8, 2) == pytest.approx(1 - comb(64, 8) / comb(128, 8))
    assert remote_nodes_per_token(128, 8, 1) == 0.0
    # a token with more experts than a node holds reaches every other node
    assert remote_nodes_per_token(16, 8, 4) == pytest.approx(3 * (1 - comb(12, 8) / comb(16, 8)))
    routed = 2 * 8192 * 8 * 2048.0
    two_nodes, one_node = ClusterSpec(H100, 16), ClusterSpec(H100, 8)
    flex = dispatch_time_s(routed, 16, two_nodes, 1, 128, 8, True)
    assert flex < 0.5 * dispatch_time_s(routed, 16, two_nodes, 1, 128, 8, False)
    assert dispatch_time_s(routed, 16, two_nodes, 1, 128, 8, False) == collective_time_s(
        "all_to_all", 16, routed, two_nodes, 1
    )
    reached = 8 * (1 - comb(112, 8) / comb(128, 8))
    assert reached == pytest.approx(5.34, abs=0.01)
    assert dispatch_time_s(routed, 8, one_node, 1, 128, 8, True) == pytest.approx(
        collective_time_s("all_to_all", 8, routed * reached / 8, one_node, 1)
    )
    assert dispatch_time_s(routed, 8, one_node, 1, 128, 8, False) == collective_time_s(
        "all_to_all", 8, routed, one_node, 1
    )


def test_ranks_reached_per_token_hand_counted():
    """Expected ranks a token's top-k experts sit on: one for top-1, every rank when it picks every expert, two for
    top-2 of 8 experts on 8 ranks, 2 - 1/15 for top-2 of 16 on 8 (the second pick is the first's rank-mate 1 time in
    15), and never more than min(k, ranks)."""
    from megatron_autotuner.costmodel.collectives import ranks_reached_per_token

    assert ranks_reached_per_token(64, 1, 8) == pytest.approx(1.0)
    assert ranks_reached_per_token(8, 8, 8) == pytest.approx(8.0)
    # 8 experts on 8 ranks, top-2 without repeats: always two different ranks
    assert ranks_reached_per_token(8, 2, 8) == pytest.approx(2.0)
    # 16 experts on 8 ranks (2 a rank), top-2: the second pick shares the first's rank 1 time in 15
    assert ranks_reached_per_token(16, 2, 8) == pytest.approx(2 - 1 / 15)
    assert ranks_reached_per_token(128, 8, 1) == 1.0
    for experts, k, ranks in ((128, 8, 8), (256, 8, 64), (32, 4, 2), (64, 6, 16)):
        assert 1.0 <= ranks_reached_per_token(experts, k, ranks) <= min(k, ranks)


def test_group_limited_routing_caps_the_nodes_a_token_reaches():
    """DeepSeek-V3 (256 experts top-8, 8 groups, 4 of them per token) over 8 nodes: each node holds one group, so a
    token reaches 4 of the 8 nodes, its own among them half the time: 3.5 other nodes, where unlimited routing gives
    7 (1 - C(224, 8) / C(256, 8)) = 4.63. With 16 groups (2 per node) the picks are 4 of 16 groups."""
    from math import comb

    from megatron_autotuner.costmodel.collectives import dispatch_time_s, remote_nodes_per_token
    from megatron_autotuner.specs import ClusterSpec

    assert remote_nodes_per_token(256, 8, 8) == pytest.approx(7 * (1 - comb(224, 8) / comb(256, 8)))
    assert remote_nodes_per_token(256, 8, 8, 8, 4) == pytest.approx(7 * (1 - comb(7, 4) / comb(8, 4))) == 3.5
    assert remote_nodes_per_token(256, 8, 8, 16, 4) == pytest.approx(7 * (1 - comb(14, 4) / comb(16, 4)))
    # groups that span nodes bound nothing the model can count: unlimited
    assert remote_nodes_per_token(256, 8, 8, 4, 2) == remote_nodes_per_token(256, 8, 8)
    routed, cluster = 4096 * 8 * 7168 * 2.0, ClusterSpec(H100, 64)
    limited = dispatch_time_s(routed, 64, cluster, 1, 256, 8, True, 8, 4)
    assert limited < dispatch_time_s(routed, 64, cluster, 1, 256, 8, True)
    assert dispatch_time_s(routed, 64, cluster, 1, 256, 8, False, 8, 4) == dispatch_time_s(
        routed, 64, cluster, 1, 256, 8, False
    )  # the alltoall dispatcher sends every copy either way


def test_router_groups_are_read_checked_and_written():
    model = load_model_spec("DeepSeek-V3")
    assert (model.moe_router_num_groups, model.moe_router_group_topk) == (8, 4)  # HF n_group / topk_group
    assert load_model_spec("Moonlight-16B-A3B").moe_router_num_groups == 0  # n_group 1: no limit
    with pytest.raises(ConfigError, match="moe_router_num_groups"):
        model.replace(moe_router_num_groups=7)
    with pytest.raises(ConfigError, match="moe_router_group_topk"):
        model.replace(moe_router_group_topk=0)
    launch = launch_to_specs(read_launch_file(str(LAUNCHES / "deepseek_v3_h100_1024gpu.sh")))
    assert (launch.model.moe_router_num_groups, launch.model.moe_router_group_topk) == (8, 4)


def test_a_flex_launch_is_read_and_written_back():
    launch = launch_to_specs(read_launch_file(str(LAUNCHES / "deepseek_v3_h100_1024gpu.sh")))
    assert launch.parallel.moe_dispatcher == "hybridep"
    assert not any("dispatcher" in n for n in launch.not_modelled)
    args = megatron_args(launch.model, launch.parallel, launch.workload)
    assert args["moe_token_dispatcher_type"] == "flex" and args["moe_flex_dispatcher_backend"] == "hybridep"
    with pytest.raises(ConfigError, match="moe_dispatcher"):
        ParallelConfig(num_gpus=8, ep=8, moe_dispatcher="ncclep")


def test_the_validate_runner_runs_the_overlap_and_refuses_what_it_cannot_run():
    """A layout predicted with a flex dispatcher or a set routing is refused by the runner's layout in one line, not
    run without it; one with the all-to-all overlap is run with it (`SearchSpace.moe_a2a_overlap` off plans
    without it)."""
    from megatron_autotuner.search.plan import plan
    from megatron_autotuner.search.space import SearchSpace
    from megatron_autotuner.specs.parallel import MoeRouting
    from megatron_autotuner.validate.layout import Layout

    moe = load_model_spec("Qwen3-30B-A3B")
    result = plan(moe, H100, 32, 8192, 256, space=SearchSpace(moe_a2a_overlap=False))
    assert not any(c.estimate.parallel.moe_a2a_overlap for c in result.candidates)
    work = Workload(4096, 1, 64)
    for parallel, workload, field in (
        (ParallelConfig(num_gpus=8, ep=8, moe_dispatcher="deepep"), work, "moe_dispatcher"),
        (ParallelConfig(num_gpus=8, ep=8), work.replace(moe_routing=MoeRouting(1.3)), "moe_load_imbalance"),
    ):
        with pytest.raises(ConfigError) as exc:
            Layout.from_configs("Qwen3-30B-A3B", parallel, workload)
        assert exc.value.field == field and "not run by mat validate" in exc.value.rule
    overlap = Layout.from_configs("Qwen3-30B-A3B", ParallelConfig(num_gpus=8, ep=8, moe_a2a_overlap=True), work)
    assert overlap.moe_a2a_overlap and overlap.parallel().moe_a2a_overlap
    # token dropping it runs: the layout carries the capacity, and predicts with it
    dropping = work.replace(moe_routing=MoeRouting(capacity_factor=1.25, pad_to_capacity=True))
    layout = Layout.from_configs("Qwen3-30B-A3B", ParallelConfig(num_gpus=8, ep=8), dropping)
    assert layout.moe_expert_capacity_factor == 1.25 and layout.moe_pad_expert_input_to_capacity
    assert layout.workload().moe_routing == dropping.moe_routing and "cap1.25-pad" in layout.label


def test_the_overlap_beside_tp_or_cp_before_blackwell_is_said():
    """Megatron-LM warns against the EP all-to-all overlap beside TP or CP on Hopper and before: the overlap wants
    CUDA_DEVICE_MAX_CONNECTIONS above 1, TP / CP communication wants 1 (validate_args, megatron/training/arguments.py
    @ d98e8a6). The estimate says so where it applies, and only there."""
    model = load_model_spec("Qwen3-30B-A3B").replace(num_layers=4)
    work = Workload(seq_length=4096, global_batch_size=32)

    def said(gpu: str, **layout) -> list[str]:
        parallel = ParallelConfig(num_gpus=16, ep=8, **layout)
        return [n for n in estimate(model, parallel, work, get_gpu_spec(gpu)).notes if "MAX_CONNECTIONS" in n]

    (note,) = said("H100-SXM", cp=2, moe_a2a_overlap=True)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=8" in note and "CP's ring exchange is predicted exposed" in note
    (note,) = said("H100-SXM", tp=2, sequence_parallel=True, moe_a2a_overlap=True)
    assert "TP's communication hidden as with 1" in note and "CP" not in note.split(":")[-1]
    assert not said("B200", cp=2, moe_a2a_overlap=True)
    assert not said("H100-SXM", cp=2) and not said("H100-SXM", moe_a2a_overlap=True)


def test_mat_plan_says_it_of_its_best_layout(capsys, tmp_path):
    """The plan's best layout for NVIDIA's DeepSeek-V3 recipe on 1024 H100s: the pairing note is printed exactly when
    the best runs the overlap beside TP or CP."""
    argv = ["plan", "--megatron-args", str(LAUNCHES / "deepseek_v3_h100_1024gpu.sh"), "--gpu", "H100-SXM",
            "--num-gpus", "1024", "--top", "1", "--json", "--output-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    best = doc["candidates"][0]["parallel"]
    pairing = best["moe_a2a_overlap"] and (best["tp"] > 1 or best["cp"] > 1)
    said = [n for n in doc["notes"] if n.startswith("best layout: the EP all-to-all overlap")]
    assert len(said) == int(pairing)


def test_a_forward_only_pass_says_it_runs_without_the_overlap():
    model = load_model_spec("Mixtral-8x7B").replace(num_layers=2)
    parallel = ParallelConfig(num_gpus=8, ep=8, moe_a2a_overlap=True, delay_wgrad_compute=True)
    work = Workload(seq_length=4096, global_batch_size=8, mode="forward")
    plain = estimate(model, ParallelConfig(num_gpus=8, ep=8), work, H100)
    est = estimate(model, parallel, work, H100)
    assert est.step_time_s == plain.step_time_s
    assert any("a forward-only pass runs without them" in n for n in est.notes)
    assert not any("forward-only" in n for n in estimate(model, parallel, work.replace(mode="train"), H100).notes)
