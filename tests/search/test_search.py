import json

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
    with pytest.raises(ConfigError, match="nearest GPU counts that work: 4 or 8"):
        plan(m, H100, 7, 8192, 64)
    with pytest.raises(ConfigError, match="nearest that works"):
        plan(load_model_spec("Llama-3.1-70B"), H100, 2, 8192, 64)


def test_search_speed_on_1024_gpus():
    r = plan(load_model_spec("DeepSeek-V3"), H100, 1024, 4096, 8192)
    assert r.elapsed_s < 10
    assert r.candidates


def test_exports():
    m = load_model_spec("Llama-3.1-70B")
    p = ParallelConfig(64, tp=4, pp=4, cp=2, vpp=5, sequence_parallel=True, tp_comm_overlap=True)
    w = Workload(8192, 1, 128, RecomputeConfig("selective"))
    args = " ".join(megatron_lm_args(m, p, w))
    assert "--tensor-model-parallel-size 4" in args and "--num-layers-per-virtual-pipeline-stage 4" in args
    assert "--tp-comm-overlap" in args and "--recompute-granularity selective" in args
    assert bridge_overrides(m, p, w)["model.virtual_pipeline_model_parallel_size"] == 5
    verl = verl_megatron_snippet(m, p, w.replace(max_token_len=16384, recompute=RecomputeConfig(), mode="forward"))
    assert verl["actor_rollout_ref"]["ref"]["log_prob_max_token_len_per_gpu"] == 16384
    files = export_all(m, p, w)
    assert "tp_comm_overlap.yaml" in files
    assert "tp_comm_overlap.yaml" not in export_all(m, p.replace(tp_comm_overlap=False), w)


def test_launch_environment_is_sourceable(tmp_path):
    """launch_env.sh sets what Megatron-LM asserts for TP / CP (CUDA_DEVICE_MAX_CONNECTIONS=1) and the allocator
    setting the memory prediction assumed; a DP-only layout with the default allocator needs nothing."""
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
    dp_only = export_all(load_model_spec("Llama-3.1-8B"), ParallelConfig(8), w)["launch_env.sh"]
    assert "export" not in dp_only and "needs no environment variables" in dp_only


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
