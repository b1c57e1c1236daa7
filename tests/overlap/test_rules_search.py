"""Candidate rules (TE userbuffers), bracketing search, lockstep planner, YAML round trip, scaling check."""

import math
import random

import pytest
import yaml

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.overlap import (
    UB_NAMES,
    SearchSpace,
    UbVariant,
    cfg_violations,
    dump_ub_yaml,
    gemm_shapes,
    load_ub_yaml,
    minimize,
    plan_searches,
    scaling_check,
    slots_for,
    te_default,
    validate_cfg,
    variant_violations,
)
from megatron_autotuner.specs import load_model_spec

ILLEGAL = [  # (name, variant, kwargs, fragment of the expected violation)
    ("qkv_fprop", UbVariant("pipeline", num_sm=8, num_splits=4), {}, "not supported for an all-gather"),
    ("fc1_fprop", UbVariant("bulk", num_sm=8), {}, "not allowed"),
    ("proj_dgrad", UbVariant("pipeline", num_splits=4), {}, "not supported for an all-gather"),
    ("fc2_dgrad", UbVariant("bulk"), {}, "not allowed"),
    ("proj_fprop", UbVariant("bulk", num_sm=4), {}, "not allowed"),
    ("qkv_wgrad", UbVariant("ring_exchange"), {}, "not allowed"),
    ("qkv_dgrad", UbVariant("pipeline", num_splits=4), {}, "not supported for an all-gather"),
    ("proj_wgrad", UbVariant("ring_exchange"), {}, "not allowed"),
    ("proj_fprop", UbVariant("pipeline", num_splits=4, atomic_gemm=True), {}, "needs FP8"),
    ("qkv_dgrad", UbVariant("bulk", atomic_gemm=True), {"fp8": True}, "not supported for bulk"),
    ("proj_fprop", UbVariant("pipeline", num_splits=4, aggregate=True), {}, "ring_exchange only"),
    ("qkv_fprop", UbVariant("ring_exchange", num_splits=2), {}, "num_splits does not apply"),
    ("qkv_fprop", UbVariant("ring_exchange", aggregate=True), {"tp": 3}, "even tp"),
    ("fc1_dgrad", UbVariant("bulk", num_sm=6, cga_size=4), {}, "must divide num_sm"),
    ("fc1_dgrad", UbVariant("bulk", num_sm=40), {}, "num_sm must be in"),
    ("fc1_dgrad", UbVariant("bulk", num_sm=16, cga_size=16), {}, "cga_size must be in"),
    ("fc1_dgrad", UbVariant("bulk", num_sm=8, num_splits=2), {}, "bulk overlap is one GEMM"),
    ("fc2_fprop", UbVariant("pipeline", num_splits=3), {"tokens": 8192}, "not divisible"),
    ("fc2_fprop", UbVariant("pipeline", num_splits=0), {}, "num_splits must be >= 1"),
    ("fc2_wgrad", UbVariant("external", num_sm=4), {}, "takes no num_sm"),
    ("proj_fprop", UbVariant("warp_speed"), {}, "unknown method"),
]


@pytest.mark.parametrize("name,variant,kw,fragment", ILLEGAL)
def test_illegal_variants_are_rejected(name, variant, kw, fragment):
    args = {"tp": 2, "tokens": None, **kw}
    problems = variant_violations(name, variant, **args)
    assert any(fragment in p for p in problems), problems


def test_cross_gemm_rules():
    with pytest.raises(ConfigError, match="external overlap needs proj_dgrad on ring_exchange"):
        validate_cfg({"proj_dgrad": UbVariant("bulk"), "proj_wgrad": UbVariant("external")}, tp=2)
    rs = {"qkv_dgrad": UbVariant("pipeline", num_splits=4), "qkv_wgrad": te_default("qkv_wgrad", 2)}
    assert any("must not be configured" in p for p in cfg_violations(rs, tp=2, rs_dgrad=True))
    atomic = {"qkv_fprop": UbVariant("ring_exchange", atomic_gemm=True), "proj_fprop": te_default("proj_fprop", 2)}
    assert any("both GEMMs of the pair" in p for p in cfg_violations(atomic, tp=2, fp8=True))
    paired = {
        "qkv_fprop": UbVariant("ring_exchange", atomic_gemm=True),
        "proj_fprop": UbVariant("ring_exchange", atomic_gemm=True),
    }
    assert cfg_violations(paired, tp=2, fp8=True) == []


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_te_defaults_are_legal(tp):
    assert cfg_violations({n: te_default(n, tp) for n in UB_NAMES}, tp=tp, tokens=8192) == []


def _run_planner(space, cost):
    planner, _ = plan_searches(slots_for(), space)
    seen = []
    while (cfg := planner.next_round()) is not None:
        seen.append(cfg)
        planner.tell({s.key: cost(s, cfg) for s in slots_for()})
    return planner, seen


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_every_generated_candidate_is_legal_and_defaults_come_first(tp):
    space = SearchSpace(tp=tp, tokens=8192, min_num_sm=2, max_num_sm=16)
    rng = random.Random(tp)
    planner, seen = _run_planner(space, lambda s, cfg: rng.uniform(1, 2))
    assert seen[0] == {n: te_default(n, tp) for n in seen[0]}
    for cfg in seen:
        assert cfg_violations(cfg, tp=tp, tokens=8192) == []
    if tp >= 4:  # aggregate is tried from tp=4 on
        assert any(c["qkv_fprop"].aggregate for c in seen)
    else:
        assert not any(c["qkv_fprop"].aggregate for c in seen)
    full = sum(space.full_grid_size(s) for s in slots_for())
    assert len(seen) < full / 50


def test_planner_finds_synthetic_optimum_and_keeps_default_on_ties():
    space = SearchSpace(tp=2, tokens=8192, min_num_sm=1, max_num_sm=16, cga_sizes=(1, 2))

    def cost(slot, cfg):
        c = 1.0
        for n in slot.names:
            v = cfg[n]
            if n.endswith("_dgrad") and v.method == "bulk":
                c += 0.01 * (v.num_sm - 6) ** 2
            if n.endswith("_wgrad") and v.method == "bulk":
                c += 0.01 * (v.num_sm - 12) ** 2
            if v.method == "pipeline":
                c += 0.2 + 0.05 * abs(v.num_splits - 8) + 0.01 * (v.num_sm - 10) ** 2
        return c

    planner, _ = _run_planner(space, cost)
    best = planner.best_cfg()
    assert best["qkv_dgrad"].num_sm == 6 and best["qkv_wgrad"].num_sm == 12
    assert best["fc2_fprop"].method == "ring_exchange"  # pipeline costs 0.2 more anywhere
    # ring slots: every variant costs the same -> TE's default is kept
    assert best["qkv_fprop"] == te_default("qkv_fprop", 2)


def test_failed_round_is_isolated_per_slot():
    space = SearchSpace(tp=2, tokens=8192, min_num_sm=2, max_num_sm=8, cga_sizes=(2,))
    planner, _ = plan_searches(slots_for(), space)
    rounds = failures = 0
    while (cfg := planner.next_round()) is not None:
        rounds += 1
        bad = cfg["fc2_fprop"].method == "pipeline" and cfg["fc2_fprop"].num_splits == 8
        failures += bad
        planner.tell({s.key: 1.0 for s in slots_for()}, failed=bad)
    assert failures >= 2  # the mixed round, then fc2.fwd alone
    assert planner.best_cfg()["fc2_fprop"].num_splits != 8
    assert planner.results["qkv.bwd"][1] == 1.0  # other slots were not sunk by fc2's failure


@pytest.mark.parametrize("center", [1, 5, 9, 16, 23, 32])
def test_bracketing_finds_minimum_of_unimodal_curve(center):
    xs = list(range(1, 33))
    best, cost, probes = minimize(xs, lambda x: (x - center) ** 2 + 3.0)
    assert best == center and cost == 3.0
    assert probes <= 12 < len(xs)


def test_bracketing_on_noisy_curve_lands_near_minimum():
    rng = random.Random(7)
    for trial in range(30):
        center = rng.randint(2, 30)

        def f(x, center=center):
            return 1.0 + 0.01 * (x - center) ** 2 + rng.gauss(0, 0.002)

        best, _, probes = minimize(list(range(1, 33)), f)
        true = [1.0 + 0.01 * (x - center) ** 2 for x in range(1, 33)]
        assert true[best - 1] <= min(true) + 0.02, (trial, center, best)
        assert probes <= 12


def test_bracketing_flat_and_single():
    assert minimize([4], lambda x: 1.0)[0] == 4
    assert minimize([1, 2, 3, 4, 5], lambda x: 1.0)[0] == 1  # ties: the first value


def test_yaml_round_trip(tmp_path):
    cfg = {n: te_default(n, 2) for n in UB_NAMES}
    cfg["fc1_dgrad"] = UbVariant("bulk", num_sm=6, cga_size=2, set_sm_margin=False)
    cfg["proj_fprop"] = UbVariant("pipeline", num_sm=8, cga_size=2, set_sm_margin=True, num_splits=8)
    path = dump_ub_yaml(cfg, tmp_path / "ub.yaml", header=["test"])
    raw = yaml.safe_load(path.read_text())  # what Megatron-LM hands to initialize_ub
    assert raw["fc1_dgrad"] == {"method": "bulk", "num_sm": 6, "cga_size": 2, "set_sm_margin": False}
    assert "proj_wgrad" not in raw  # external: TE's fixed default, not written
    allowed = {
        "method",
        "is_reduce_scatter",
        "num_sm",
        "cga_size",
        "set_sm_margin",
        "num_splits",
        "aggregate",
        "atomic_gemm",
        "use_ce",
        "fp8_buf",
        "comm_priority",
        "gemm_priority",
        "pipeline_rs_overlap_first_gemm",
    }
    assert all(set(v) <= allowed for v in raw.values())  # keys TE's add_ub() accepts
    back = load_ub_yaml(path)
    assert back == {n: v for n, v in cfg.items() if v.method != "external"}
    assert cfg_violations(back, tp=2, tokens=8192) == []


def test_gemm_shapes_llama_tp2():
    shapes = {s.op: s for s in gemm_shapes(load_model_spec("Llama-3.1-8B"), 2, 8192)}
    assert (shapes["qkv"].in_features, shapes["qkv"].out_features) == (4096, 4096 + 2 * 8 * 128)
    assert shapes["fc1"].local_out == 14336  # 2 x 14336 (SwiGLU) / 2
    assert shapes["fc2"].local_in == 7168
    assert shapes["proj"].gemm_flops == 2 * 8192 * 4096 * 4096 / 2
    with pytest.raises(ConfigError):
        gemm_shapes(load_model_spec("Llama-3.1-8B"), 16, 8192)  # 8 query groups


def test_scaling_check_tp8_from_recorded_data():
    res = scaling_check("layer", 20.0, {2: (10.5, "tuned", 0.1), 4: (5.6, "tuned", 0.3), 8: (3.5, "nccl", 0.6)})
    assert res.largest_efficient_tp == 4
    assert "TP=8" in res.reason and "0.600 ms of communication" in res.reason
    ok = scaling_check("fc1", 8.0, {2: (4.1, "tuned", None), 8: (1.15, "tuned", None)})
    assert ok.largest_efficient_tp == 8 and "scales to TP=8" in ok.reason
    bad = scaling_check("proj", 1.0, {2: (0.9, "nccl", None)}, tolerance=0.2)
    assert bad.largest_efficient_tp == 1 and math.isclose(bad.points[0].efficiency, 0.5 / 0.9)
