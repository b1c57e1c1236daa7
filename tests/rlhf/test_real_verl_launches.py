"""Every real public verl launch of tests/fixtures/launches/real/verl/ (SOURCES.md there says where each comes from),
given as-is (no --var, no --model) to `mat rlhf`: planned, or refused in one line for a reason listed here;
never a traceback."""

from __future__ import annotations

import json
import time

import pytest

from megatron_autotuner.cli import main

from ..specs.real_launches import fixtures, materialize

NOT_MODELLED = "its model's architecture is not modelled yet"
VERL_NOT_PREDICTED = {
    "verl-project__verl__examples__grpo_trainer__run_qwen3_5_397b_megatron.sh": NOT_MODELLED
    + " (Qwen3.5: a gated-DeltaNet hybrid MoE with a Qwen3-VL vision tower; no config.json shipped)",
    "verl-project__verl__examples__grpo_trainer__run_kimi_k2_6_glm5_1_megatron_lite.sh": "no model path in the launch",
    "volcengine__verl__examples__ppo_trainer__run_moonlight16b_a3b_gsm8k_megatron.sh": "the critic's 27 layers do not"
    " split over its pp 2 (only the actor's override sets an uneven split)",
}


@pytest.fixture(scope="module")
def verl_tree(tmp_path_factory):
    return materialize("verl", tmp_path_factory.mktemp("real"))


def test_the_corpus_is_fifteen_launches_and_more():
    names = {p.name for p in fixtures("verl")}
    assert len(names) >= 15 and set(VERL_NOT_PREDICTED) <= names


@pytest.mark.parametrize("name", [p.name for p in fixtures("verl")])
def test_each_verl_launch_is_planned_as_is(name, verl_tree, tmp_path, capsys):
    start = time.process_time()  # CPU time: the tests run two at a time
    rc = main(["rlhf", "--verl-args", str(verl_tree[name]), "--gpu", "H100-SXM", "--json", "--top-k", "1",
               "--output-dir", str(tmp_path / "out")])  # fmt: skip
    # reading and predicting the launch takes well under a second; the search for the best layout of a 235B MoE
    # on 256 GPUs up to ~10 s on a 2-core CI machine
    assert time.process_time() - start < 20.0
    err = capsys.readouterr().err.strip()
    if name in VERL_NOT_PREDICTED:
        assert rc == 2 and err.startswith("mat: error: ") and "\n" not in err
    else:
        assert rc == 0, err


def test_mat_rlhf_reads_back_the_overrides_it_prints_appended_to_the_launch(verl_tree, tmp_path, capsys):
    """verl's Qwen2-7B GRPO example passes `$@` to the trainer: run with the overrides `mat rlhf` prints, it is read
    as the plan's best layout (an interleaved uneven pipeline: its layout string and vpp keys)."""
    import json

    from megatron_autotuner.costmodel import DEFAULT_MEMORY_MARGIN
    from megatron_autotuner.rlhf import evaluate_step, read_verl_file
    from megatron_autotuner.rlhf.launch import launch_inputs, model_from_launch
    from megatron_autotuner.specs import get_gpu_spec

    script = verl_tree["volcengine__verl__examples__grpo_trainer__run_qwen2-7b_math_megatron.sh"]
    assert main(["rlhf", "--verl-args", str(script), "--gpu", "H100-SXM", "--json", "--top-k", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    best, lines = report["best"], report["verl_overrides"]
    assert best["parallel"]["vpp"] and best["parallel"]["pipeline_layout"]["form"] == "string"
    launch = read_verl_file(str(script), args=lines)
    actor = launch.layout("actor")
    assert (actor["pipeline_model_parallel_size"], actor["virtual_pipeline_model_parallel_size"]) == (
        best["parallel"]["pp"], best["parallel"]["vpp"],
    )  # fmt: skip
    overrides = launch.pass_through("actor_transformer_overrides")
    assert overrides["pipeline_model_parallel_layout"] == best["parallel"]["pipeline_layout"]["layout"]
    # one prediction: the launch run with the overrides is predicted at the plan's step (its log-prob passes keep the
    # micro-batch the search gave them, not the actor's)
    inputs = launch_inputs(launch, model_from_launch(launch, None)[0], None, None, None, None, DEFAULT_MEMORY_MARGIN)
    back = evaluate_step(inputs.spec, inputs.choice, get_gpu_spec("H100-SXM"), inputs.options)
    assert back.total_s == pytest.approx(best["total_s"], rel=1e-9)


def test_an_empty_model_path_is_the_model_of_the_dist_checkpoint_the_launch_loads(verl_tree, capsys):
    """verl's Moonlight PPO example leaves model.path empty ($LLM is never set) and loads the Megatron checkpoint it
    converted from Moonlight-16B-A3B-Instruct: the model is read from that checkpoint's folder, said in a note, and
    the launch is then refused for what it is: its critic (no uneven split of its own) cannot split 27 layers over
    pp 2, while its actor's override does."""
    from megatron_autotuner.rlhf import read_verl_file
    from megatron_autotuner.rlhf.launch import model_from_launch

    script = verl_tree["volcengine__verl__examples__ppo_trainer__run_moonlight16b_a3b_gsm8k_megatron.sh"]
    model, note = model_from_launch(read_verl_file(str(script)), None)
    assert model.name == "Moonlight-16B-A3B" and "dist_checkpointing_path=/data/mcore_ckpt/Moonlight" in note
    assert main(["rlhf", "--verl-args", str(script), "--gpu", "H100-SXM", "--top-k", "1"]) == 2
    assert capsys.readouterr().err.startswith("mat: error: critic.megatron (pp): num_layers = 27")


def test_verl_s_nemotron_3_nano_example_is_planned_with_layouts_verl_builds(verl_tree, capsys):
    """The example's model path names the NVIDIA-Nemotron-3-Nano-30B-A3B preset (its -BF16 suffix a word after the
    name); the layouts ranked are ones verl's megatron-core 0.16 MambaStack builds: no virtual stages, an even or
    first / last split (`rlhf.step.verl_builds`)."""
    from megatron_autotuner.rlhf.step import verl_builds
    from megatron_autotuner.specs import load_model_spec
    from megatron_autotuner.specs.parallel import ParallelConfig
    from megatron_autotuner.specs.pipeline import PipelineLayout

    script = verl_tree["verl-project__verl__examples__grpo_trainer__run_nemotron_nano_v3_30b_a3b_megatron.sh"]
    assert main(["rlhf", "--verl-args", str(script), "--gpu", "H100-SXM", "--top-k", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"]["model"] == "NVIDIA-Nemotron-3-Nano-30B-A3B"
    for ranked in report["ranked"]:
        assert ranked["parallel"]["vpp"] is None
        assert (ranked["parallel"]["pipeline_layout"] or {}).get("form") in (None, "first_last")
    nano, layout = load_model_spec("NVIDIA-Nemotron-3-Nano-30B-A3B"), dict(num_gpus=8, pp=2, ep=4)
    assert verl_builds(nano, ParallelConfig(**layout))
    assert not verl_builds(nano, ParallelConfig(vpp=2, **layout))
    assert not verl_builds(nano, ParallelConfig(pipeline_layout=PipelineLayout.from_counts([20, 32], 2), **layout))
    assert verl_builds(nano.replace(hybrid_layer_pattern="", num_moe_experts=0, mamba_num_heads=0, mamba_head_dim=0,
                                    mamba_state_dim=0, mamba_num_groups=0, moe_router_topk=0, moe_ffn_hidden_size=0),
                       ParallelConfig(vpp=2, num_gpus=8, pp=2))  # fmt: skip


@pytest.mark.parametrize("num_gpus,per_node,nodes", [(16, 8, 2), (4, 4, 1)])
def test_mat_rlhf_num_gpus_overrides_run_on_that_many_gpus(num_gpus, per_node, nodes, verl_tree, capsys):
    """`mat rlhf --num-gpus N` plans for N GPUs: the overrides it prints set trainer.n_gpus_per_node x trainer.nnodes
    to N (whole machines of the GPU's gpus_per_node, as the cost model's topology has them), so the launch run with
    them appended runs on N GPUs (verl's resource pool is [n_gpus_per_node] * nnodes), not its own 8."""
    from megatron_autotuner.costmodel import DEFAULT_MEMORY_MARGIN
    from megatron_autotuner.rlhf import read_verl_file
    from megatron_autotuner.rlhf.launch import launch_inputs, model_from_launch

    script = verl_tree["volcengine__verl__examples__grpo_trainer__run_qwen2-7b_math_megatron.sh"]
    assert read_verl_file(str(script)).num_gpus == 8
    argv = ["rlhf", "--verl-args", str(script), "--gpu", "H100-SXM", "--num-gpus", str(num_gpus), "--top-k", "1"]
    assert main([*argv, "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)["verl_overrides"]
    assert f"trainer.n_gpus_per_node={per_node}" in lines and f"trainer.nnodes={nodes}" in lines
    launch = read_verl_file(str(script), args=lines)
    assert launch.num_gpus == num_gpus
    inputs = launch_inputs(launch, model_from_launch(launch, None)[0], None, None, None, None, DEFAULT_MEMORY_MARGIN)
    assert inputs.spec.num_gpus == num_gpus and not [n for n in inputs.notes if n.startswith("num_gpus")]
    assert main(argv) == 0  # the text's overrides are the same lines
    assert f"trainer.nnodes={nodes}" in capsys.readouterr().out


def test_mat_rlhf_refuses_a_gpu_count_verl_cannot_place_on_whole_machines(verl_tree, capsys):
    script = verl_tree["volcengine__verl__examples__grpo_trainer__run_qwen2-7b_math_megatron.sh"]
    assert main(["rlhf", "--verl-args", str(script), "--gpu", "H100-SXM", "--num-gpus", "12"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mat: error: num_gpus: ") and "\n" not in err and "trainer.n_gpus_per_node" in err


def test_verl_s_qwen2_5_vl_example_prices_its_images_on_the_vision_tower(verl_tree, capsys):
    """verl's geo3k example trains Qwen2.5-VL-7B: the tower's work is an assumption (the whole prompt as image, an
    upper bound) until --image-tokens says how many; fewer image tokens, less actor-update time; a text model
    given image tokens is refused in one line."""
    script = str(verl_tree["volcengine__verl__examples__grpo_trainer__run_qwen2_5_vl-7b-megatron.sh"])
    argv = ["rlhf", "--verl-args", script, "--gpu", "H100-SXM", "--json", "--top-k", "1"]
    assert main(argv) == 0
    assumed = json.loads(capsys.readouterr().out)
    assert any("image tokens per prompt assumed = the mean prompt, 1024" in n for n in assumed["launch"]["notes"])
    assert assumed["inputs"]["lengths"]["image_tokens"] == 1024
    assert main([*argv, "--image-tokens", "64"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert not any("image tokens" in n for n in given["launch"]["notes"])

    def phase_s(report: dict, name: str) -> float:
        return next(p["time_s"] for p in report["launch"]["phases"] if p["name"] == name)

    assert phase_s(given, "old log-prob") < phase_s(assumed, "old log-prob")
    assert main([*argv, "--image-tokens", "5000"]) == 2  # more than the longest prompt (data.max_prompt_length)
    err = capsys.readouterr().err.strip()
    assert err.startswith("mat: error: image_tokens: ") and "1024" in err and "\n" not in err
    qwen2 = str(verl_tree["volcengine__verl__examples__grpo_trainer__run_qwen2-7b_math_megatron.sh"])
    assert main(["rlhf", "--verl-args", qwen2, "--gpu", "H100-SXM", "--image-tokens", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mat: error: image_tokens: ") and "no vision encoder" in err and "\n" not in err


def test_verl_s_deepep_overrides_set_the_planned_dispatcher(verl_tree):
    """verl's Qwen3-235B example turns DeepEP on in override_transformer_config (moe_token_dispatcher_type=flex,
    moe_enable_deepep=True): its actor is priced with the deduplicating dispatcher, a launch without them with
    verl's default alltoall."""
    from megatron_autotuner.costmodel import DEFAULT_MEMORY_MARGIN
    from megatron_autotuner.rlhf import read_verl_file
    from megatron_autotuner.rlhf.launch import launch_inputs, model_from_launch

    def dispatcher(name: str) -> str:
        launch = read_verl_file(str(verl_tree[name]))
        model = model_from_launch(launch, None)[0]
        inputs = launch_inputs(launch, model, None, None, None, None, DEFAULT_MEMORY_MARGIN)
        return inputs.choice.parallel.moe_dispatcher

    assert dispatcher("volcengine__verl__examples__grpo_trainer__run_qwen3-235b_megatron_96gb.sh") == "deepep"
    assert dispatcher("volcengine__verl__examples__ppo_trainer__run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh") == "alltoall"


def test_verl_s_allgather_override_is_priced_as_allgather(verl_tree):
    """verl's Moonlight-16B example passes `$@` to the trainer: with megatron-core's allgather dispatcher set in
    override_transformer_config its actor is priced with that dispatcher, as `mat estimate` reads the same flag."""
    from megatron_autotuner.costmodel import DEFAULT_MEMORY_MARGIN
    from megatron_autotuner.rlhf import read_verl_file
    from megatron_autotuner.rlhf.launch import launch_inputs, model_from_launch

    script = str(verl_tree["volcengine__verl__examples__grpo_trainer__run_moonlight16b_math_megatron.sh"])
    override = "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type=allgather"
    for args, want in (([], "alltoall"), ([override], "allgather")):
        launch = read_verl_file(script, args=args)
        model = model_from_launch(launch, None)[0]
        inputs = launch_inputs(launch, model, None, None, None, None, DEFAULT_MEMORY_MARGIN)
        assert inputs.choice.parallel.moe_dispatcher == want
