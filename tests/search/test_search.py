import json
import time

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export import bridge_overrides, export_all, megatron_lm_args, verl_megatron_snippet
from megatron_autotuner.search import SearchSpace, plan
from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload, get_gpu_spec, load_model_spec

H100 = get_gpu_spec("H100-SXM")


@pytest.fixture(scope="module")
def plan_70b():
    return plan(load_model_spec("Llama-3.1-70B"), H100, 64, 8192, 128)


def test_70b_beats_or_matches_nvidia_recipe(plan_70b):
    recipe = plan_70b.rank_of(
        tp=4,
        pp=4,
        cp=2,
        vpp=5,
        micro_batch_size=1,
        recompute="none",
        use_distributed_optimizer=True,
        sequence_parallel=True,
    )
    assert recipe is not None
    assert plan_70b.best.estimate.step_time_s <= recipe.estimate.step_time_s
    assert recipe.rank <= 10


def test_ranked_and_all_fit(plan_70b):
    times = [c.estimate.step_time_s for c in plan_70b.candidates]
    assert times == sorted(times)
    usable = H100.hbm_gib * 0.95
    assert all(c.estimate.peak_memory_gib <= usable for c in plan_70b.candidates)
    assert all(r.reason for r in plan_70b.rejections)
    assert plan_70b.considered == len(plan_70b.candidates) + len(plan_70b.rejections)


def test_margin_prunes_more():
    m = load_model_spec("Llama-3.1-8B")
    loose = plan(m, H100, 8, 8192, 64, memory_margin=0.0)
    tight = plan(m, H100, 8, 8192, 64, memory_margin=0.3)
    assert len(tight.candidates) < len(loose.candidates)


def test_forward_mode_allows_bigger_micro_batches():
    m = load_model_spec("Llama-3.1-8B")
    r = plan(m, H100, 8, 4096, 256, mode="forward", space=SearchSpace(sequence_parallel=(True,)))
    assert max(c.workload.micro_batch_size for c in r.candidates) > 8
    assert all(c.workload.recompute.granularity == "none" for c in r.candidates)


def test_impossible_inputs_say_what_would_work():
    m = load_model_spec("Llama-3.1-8B")
    even_only = SearchSpace(uneven_pipelines=False)
    with pytest.raises(ConfigError, match="nearest GPU counts that work: 4 or 8"):
        plan(m, H100, 7, 8192, 64, space=even_only)
    # an uneven pipeline splits 32 layers over 7 ranks (first / last stage counts)
    seven = plan(m, H100, 7, 8192, 63)
    assert seven.best.parallel.pp == 7 and seven.best.parallel.pipeline_layout is not None
    with pytest.raises(ConfigError, match="nearest that works"):
        plan(load_model_spec("Llama-3.1-70B"), H100, 2, 8192, 64)


@pytest.mark.parametrize(
    ("name", "gpus", "seq", "gbs", "precision"),
    [
        ("Llama-3.1-405B", 1024, 8192, 512, "fp8"),
        ("DeepSeek-V3", 1024, 4096, 8192, "bf16"),
        ("Qwen3-235B-A22B", 256, 4096, 2048, "bf16"),
    ],
)
def test_flagship_models_plan_with_uneven_pipelines_in_seconds(name, gpus, seq, gbs, precision):
    """126, 61 and 94 layers: no even split fits these GPU counts, uneven layouts do (benchmarks/search_speed.py)."""
    start = time.process_time()
    r = plan(load_model_spec(name), H100, gpus, seq, gbs, precision=precision)
    # #39's target is 10 s; benchmarks/search_speed.py measured 2.0 / 9.5 / 7.4 s in fresh processes on the 2-core
    # CI machine (run to run it varies by up to a third there). The bound catches a regression. It is this process's
    # CPU time: the tests run two at a time, and a plan beside a CPU torchrun job took 20.9 s of wall time where alone
    # it took 15
    assert time.process_time() - start < 20
    assert r.best.parallel.pp > 1 and r.best.parallel.pipeline_layout is not None


def test_exports():
    m = load_model_spec("Llama-3.1-70B")
    p = ParallelConfig(64, tp=4, pp=4, cp=2, vpp=5, sequence_parallel=True, tp_comm_overlap=True)
    w = Workload(8192, 1, 128, RecomputeConfig("selective"))
    args = " ".join(megatron_lm_args(m, p, w))
    assert "--tensor-model-parallel-size 4" in args and "--num-virtual-stages-per-pipeline-rank 5" in args
    assert "--tp-comm-overlap" in args and "--recompute-granularity selective" in args
    assert bridge_overrides(m, p, w)["model"]["virtual_pipeline_model_parallel_size"] == 5
    verl = verl_megatron_snippet(m, p, w.replace(max_token_len=16384, recompute=RecomputeConfig(), mode="forward"))
    # verl multiplies the per-GPU token budget by the CP size: the export divides it (cp=2)
    assert verl["actor_rollout_ref"]["ref"]["log_prob_max_token_len_per_gpu"] == 16384 // 2
    files = export_all(m, p, w)
    assert "tp_comm_overlap.yaml" in files
    assert "tp_comm_overlap.yaml" not in export_all(m, p.replace(tp_comm_overlap=False), w)


def test_exports_of_bf16_main_grads_and_fp8():
    """--grad-reduce-in-bf16 reaches every launcher: Megatron-LM's flag, Bridge's ddp and mixed_precision fields
    (MixedPrecisionConfig.setup copies its own over the DDP config's), verl's override_ddp_config for the actor
    (a forward-only ref has no gradients). fp8 is the same format / recipe in Megatron-LM and Bridge."""
    import yaml

    m = load_model_spec("Llama-3.1-8B")
    p = ParallelConfig(8, grad_reduce_in_fp32=False)
    w = Workload(8192, 1, 64, precision="fp8")
    assert "--grad-reduce-in-bf16" in megatron_lm_args(m, p, w)
    assert "--grad-reduce-in-bf16" not in megatron_lm_args(m, p.replace(grad_reduce_in_fp32=True), w)
    files = export_all(m, p, w)
    bridge = yaml.safe_load(files["bridge_overrides.yaml"])
    assert bridge == bridge_overrides(m, p, w)
    mp = bridge["mixed_precision"]
    assert bridge["ddp"]["grad_reduce_in_fp32"] is False and mp["grad_reduce_in_fp32"] is False
    assert (mp["fp8"], mp["fp8_recipe"]) == ("hybrid", "delayed")
    assert "--fp8-format hybrid" in megatron_lm_args(m, p, w) and "--fp8-recipe delayed" in megatron_lm_args(m, p, w)
    plain = yaml.safe_load(
        export_all(m, p.replace(grad_reduce_in_fp32=True), w.replace(precision="bf16"))["bridge_overrides.yaml"]
    )
    assert plain["mixed_precision"]["fp8"] is None and plain["ddp"]["grad_reduce_in_fp32"] is True
    actor = verl_megatron_snippet(m, p, w)["actor_rollout_ref"]["actor"]["megatron"]
    assert actor["override_ddp_config"]["grad_reduce_in_fp32"] is False
    ref = verl_megatron_snippet(m, p, w.replace(mode="forward"))["actor_rollout_ref"]["ref"]["megatron"]
    assert "override_ddp_config" not in ref


def test_plan_applies_bf16_main_grads_to_every_layout():
    m = load_model_spec("Llama-3.1-8B")
    everything = SearchSpace(screen_slack=float("inf"))  # count every layout that fits, not just the fast ones
    fp32 = plan(m, H100, 8, 8192, 64, space=everything)
    bf16 = plan(m, H100, 8, 8192, 64, grad_reduce_in_fp32=False, space=everything)
    assert all(not c.parallel.grad_reduce_in_fp32 for c in bf16.candidates)
    assert all(c.parallel.grad_reduce_in_fp32 for c in fp32.candidates)
    # 2 bytes per parameter less: more layouts fit
    assert len(bf16.candidates) > len(fp32.candidates)


def test_exports_of_fp8_recipe_and_fp8_params():
    """--fp8-recipe / --fp8-param-gather reach every launcher: Megatron-LM's flags; Bridge's mixed_precision
    fields (all written: Bridge defaults to tensorwise); verl's override_transformer_config, override_ddp_config
    and the actor optimizer's fp8_recipe (the distributed optimizer casts master weights by recipe)."""
    m = load_model_spec("Llama-3.1-8B")
    p = ParallelConfig(8)
    w = Workload(8192, 1, 64, precision="fp8", fp8_recipe="tensorwise", fp8_param=True)
    args = megatron_lm_args(m, p, w)
    assert "--fp8-recipe tensorwise" in args and "--fp8-param-gather" in args
    assert "--fp8-param-gather" not in megatron_lm_args(m, p, w.replace(fp8_param=False))
    blockwise = w.replace(fp8_recipe="blockwise")
    assert "--fp8-recipe blockwise" in megatron_lm_args(m, p, blockwise)
    assert bridge_overrides(m, p, blockwise)["mixed_precision"]["fp8_recipe"] == "blockwise"
    mp = bridge_overrides(m, p, w)["mixed_precision"]
    assert mp["fp8_recipe"] == "tensorwise" and mp["fp8_param_gather"] is True
    assert bridge_overrides(m, p, w.replace(fp8_param=False))["mixed_precision"]["fp8_param_gather"] is False
    role = verl_megatron_snippet(m, p, w)["actor_rollout_ref"]["actor"]
    tc = role["megatron"]["override_transformer_config"]
    assert (tc["fp8"], tc["fp8_recipe"], tc["fp8_param"]) == ("hybrid", "tensorwise", True)
    assert role["megatron"]["override_ddp_config"]["fp8_param_gather"] is True
    assert role["optim"] == {"override_optimizer_config": {"fp8_recipe": "tensorwise"}}
    # the ref shares the actor's layout and transformer overrides (verl links them); it has no optimizer
    ref = verl_megatron_snippet(m, p, w.replace(mode="forward"))["actor_rollout_ref"]["ref"]
    assert "override_ddp_config" not in ref["megatron"] and "optim" not in ref
    bf16 = verl_megatron_snippet(m, p, Workload(8192, 1, 64))["actor_rollout_ref"]["actor"]
    assert "fp8" not in bf16["megatron"]["override_transformer_config"] and "optim" not in bf16


def test_plan_with_fp8_params_needs_the_distributed_optimizer(capsys, tmp_path):
    """`mat plan --precision fp8 --fp8-param-gather`: every ranked layout keeps the distributed optimizer (Megatron-LM
    refuses fp8 parameters without it), weighs less than with cached fp8 weights, and exports the flags."""
    m = load_model_spec("Llama-3.1-70B")
    everything = SearchSpace(screen_slack=float("inf"))
    cached = plan(m, H100, 32, 8192, 128, precision="fp8", space=everything)
    params = plan(m, H100, 32, 8192, 128, precision="fp8", fp8_recipe="tensorwise", fp8_param=True, space=everything)
    assert all(c.parallel.use_distributed_optimizer and c.workload.fp8_param for c in params.candidates)
    assert any("fp8_param: needs the distributed optimizer" in r.reason for r in params.rejections)
    assert len(params.candidates) > len(cached.candidates)  # 2 bytes per TE weight less: more layouts fit
    args = ["plan", "--model", "Llama-3.1-8B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "8192"]
    args += ["--global-batch-size", "64", "--top", "1", "--no-chart", "--output-dir", str(tmp_path)]
    args += ["--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]
    assert main(args) == 0
    assert "fp8-tensorwise fp8-params" in " ".join(capsys.readouterr().out.split())
    exported = (tmp_path / "rank_1" / "megatron_lm_args.txt").read_text()
    assert "--fp8-recipe tensorwise" in exported and "--fp8-param-gather" in exported
    assert main(args[:-5] + ["--fp8-param-gather"]) == 2  # without --precision fp8
    assert "fp8_param: needs precision fp8" in capsys.readouterr().err


def test_launch_environment_is_sourceable(tmp_path):
    """launch_env.sh sets what Megatron-LM asserts for TP / CP (CUDA_DEVICE_MAX_CONNECTIONS=1) and the allocator
    setting the memory prediction assumed (by default expandable segments, as the cost model's options); a DP-only
    layout with the default allocator needs nothing."""
    import subprocess

    m = load_model_spec("Llama-3.1-70B")
    w = Workload(8192, 1, 128)
    tp_cp = ParallelConfig(64, tp=4, pp=4, cp=2, sequence_parallel=True)
    script = tmp_path / "launch_env.sh"
    script.write_text(export_all(m, tp_cp, w, expandable_segments=True)["launch_env.sh"])
    shown = subprocess.run(
        ["bash", "-c", f"source {script}; echo $CUDA_DEVICE_MAX_CONNECTIONS $PYTORCH_CUDA_ALLOC_CONF"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert shown == ["1", "expandable_segments:True"]
    dp_only = export_all(load_model_spec("Llama-3.1-8B"), ParallelConfig(8), w, expandable_segments=False)
    assert "export" not in dp_only["launch_env.sh"] and "needs no environment variables" in dp_only["launch_env.sh"]
    default = export_all(load_model_spec("Llama-3.1-8B"), ParallelConfig(8), w)["launch_env.sh"]
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in default


def test_cli_plan_and_estimate(tmp_path, capsys):
    rc = main(
        [
            "plan",
            "--model",
            "Llama-3.1-8B",
            "--gpu",
            "H100-SXM",
            "--num-gpus",
            "8",
            "--seq-len",
            "8192",
            "--global-batch-size",
            "64",
            "--top",
            "3",
            "--json",
            "--output-dir",
            str(tmp_path),
            "--expandable-segments",
        ]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["candidates"]) == 3
    written = json.loads((tmp_path / "plan.json").read_text())
    assert len(written["rejections"]) == written["rejected"] > 200  # every rejection, with its reason
    assert (tmp_path / "plan.png").exists() and (tmp_path / "rank_1" / "megatron_lm_args.txt").exists()
    assert (
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in (tmp_path / "rank_1" / "launch_env.sh").read_text()
    )
    rc = main(
        [
            "estimate",
            "--model",
            "Llama-3.1-8B",
            "--gpu",
            "H100-SXM",
            "--num-gpus",
            "8",
            "--seq-len",
            "8192",
            "--global-batch-size",
            "64",
            "--tp",
            "2",
            "--pp",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    est = json.loads(capsys.readouterr().out)
    assert est["fits"] is True and est["step_time_s"] > 0
    rc = main(
        [
            "estimate",
            "--model",
            "Llama-3.1-8B",
            "--gpu",
            "H100-SXM",
            "--num-gpus",
            "8",
            "--seq-len",
            "8192",
            "--tp",
            "3",
        ]
    )
    assert rc == 2
    assert "tp" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "gpus", "seq", "gbs", "precision"),
    [("Llama-3.1-70B", 64, 8192, 128, "bf16"), ("Llama-3.1-405B", 1024, 8192, 512, "fp8")],
)
def test_screening_keeps_the_best_layout_of_the_full_search(name, gpus, seq, gbs, precision):
    """Screening structures at their smallest micro-batch finds the same best layout as searching every variant of
    every structure (also true of DeepSeek-V3 on 1024 and Qwen3-235B on 256 H100, too slow to repeat here)."""
    model = load_model_spec(name)
    screened = plan(model, H100, gpus, seq, gbs, precision=precision)
    full = plan(model, H100, gpus, seq, gbs, precision=precision, space=SearchSpace(screen_slack=float("inf")))
    assert screened.best.label == full.best.label
    assert screened.best.estimate.step_time_s == pytest.approx(full.best.estimate.step_time_s)


def test_the_plan_assumes_and_writes_expandable_segments_unless_told_otherwise(tmp_path, capsys):
    """The allocator setting is one of the plan's assumptions: on by default (the setting under which the held-out
    4-GPU peaks came within 5%), written into launch_env.sh, and what estimate predicts for the same layout;
    --no-expandable-segments predicts PyTorch's default allocator and writes nothing."""
    moe = ["--model", "Qwen3-30B-A3B", "--num-layers", "8", "--gpu", "H200", "--num-gpus", "4"]
    shape = ["--seq-len", "4096", "--global-batch-size", "32"]
    peaks = {}
    for flag in ([], ["--no-expandable-segments"]):
        out = tmp_path / ("off" if flag else "on")
        assert main(["plan", *moe, *shape, "--top", "1", "--no-chart", "--json", "--output-dir", str(out), *flag]) == 0
        (best,) = json.loads(capsys.readouterr().out)["candidates"]
        env = (out / "rank_1" / "launch_env.sh").read_text()
        assert ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env) is not bool(flag)
        p = best["parallel"]
        layout = ["--tp", str(p["tp"]), "--pp", str(p["pp"]), "--cp", str(p["cp"]), "--ep", str(p["ep"])]
        layout += ["--micro-batch-size", str(best["micro_batch_size"]), "--recompute", best["recompute"]]
        assert main(["estimate", *moe, *shape, *layout, "--json", *flag]) == 0
        est = json.loads(capsys.readouterr().out)
        assert est["peak_memory_gib"] == pytest.approx(best["peak_memory_gib"], rel=1e-9)
        peaks[bool(flag)] = est["peak_memory_gib"]
    # the default allocator's larger reserved-but-unallocated allowance
    assert peaks[True] > peaks[False]


def test_te_graphs_with_expandable_segments_export_a_launch_megatron_lm_accepts(tmp_path):
    """Megatron-LM refuses transformer_engine CUDA graphs beside expandable segments unless NCCL_GRAPH_REGISTER=0:
    the exported launch_env.sh sets it, and the launch reader (which applies Megatron-LM's check) accepts the
    exported launch; without it the reader refuses."""
    from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch_file
    from megatron_autotuner.specs.parallel import CudaGraphConfig

    model = load_model_spec("Llama-3.1-8B")
    w = Workload(4096, 1, 64, cuda_graph=CudaGraphConfig(impl="transformer_engine", scope=("attn",)))
    files = export_all(model, ParallelConfig(8, tp=2, sequence_parallel=True), w, expandable_segments=True)
    assert "export NCCL_GRAPH_REGISTER=0" in files["launch_env.sh"]
    flags = files["megatron_lm_args.txt"].strip()
    for env, accepted in (
        (files["launch_env.sh"], True),
        ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n", False),
    ):
        script = tmp_path / "launch.sh"
        script.write_text(env + f"torchrun --nproc-per-node 8 pretrain_gpt.py {flags}\n")
        if accepted:
            assert launch_to_specs(read_launch_file(str(script))).workload.cuda_graph.impl == "transformer_engine"
        else:
            with pytest.raises(ConfigError, match="NCCL_GRAPH_REGISTER"):
                launch_to_specs(read_launch_file(str(script)))


@pytest.mark.parametrize(
    ("model", "n", "gbs"), [("Llama-3.1-8B", 7, 64), ("Llama-3.1-8B", 37, 6), ("Qwen3-30B-A3B", 11, 48)]
)
def test_the_nearest_gpu_counts_are_those_a_scan_of_every_count_finds(model, n, gbs):
    """The refusal's nearest valid GPU counts come from the counts a layout can have (tp*pp*cp x a divisor of the
    global batch), which is what trying every count finds, without the scan (55 s at 100,000 GPUs)."""
    from megatron_autotuner.search.plan import _has_valid_layout, _nearest_gpu_count_message

    spec = load_model_spec(model)
    for space in (SearchSpace(uneven_pipelines=False), SearchSpace()):
        valid = [m for m in range(1, 4 * n + 9) if m != n and _has_valid_layout(spec, H100, m, 4096, gbs, space)]
        below, above = max((m for m in valid if m < n), default=None), min((m for m in valid if m > n), default=None)
        expected = " or ".join(str(m) for m in (below, above) if m is not None) or "none found"
        assert _nearest_gpu_count_message(spec, H100, n, 4096, gbs, space).endswith(f"that work: {expected}")


def test_a_huge_gpu_count_is_refused_in_a_second():
    import time

    started = time.process_time()
    with pytest.raises(ConfigError, match="nearest GPU counts that work"):
        plan(load_model_spec("Llama-3.1-8B"), H100, 100_000, 4096, 7)
    assert time.process_time() - started < 5


@pytest.mark.parametrize("model", ["Qwen3-30B-A3B", "Llama-3.1-8B", "DeepSeek-V3", "Llama-3.1-405B"])
def test_no_two_pipeline_choices_put_the_same_layers_on_the_same_stages(model):
    """At pp 2 the embedding + loss accounting of an even layer count is the even split; the plan listed both,
    same numbers, as two ranks."""
    from megatron_autotuner.search.space import layout_choices
    from megatron_autotuner.specs.pipeline import even_layout

    spec = load_model_spec(model)
    for pp in (2, 3, 4, 8, 16):
        choices = layout_choices(spec, pp, SearchSpace(), 4096)
        splits = [(v, (f or even_layout(spec.num_layers, pp, v, spec.mtp_num_layers)).stages) for v, f in choices]
        assert len(set(splits)) == len(splits)
    assert (None, None) in layout_choices(load_model_spec("Qwen3-30B-A3B"), 2, SearchSpace(), 4096)
