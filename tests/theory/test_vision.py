"""A vision-language model's vision tower (Qwen2.5-VL): parameters, FLOPs, time and memory on the first stage.

Golden numbers: transformers 4.57.1's meta-device build of the shipped Qwen2.5-VL-7B-Instruct config.json
(`Qwen2_5_VLForConditionalGeneration(AutoConfig.for_model(**config))`) has 8,292,166,656 parameters, 676,550,144
of them in `model.visual` (patch_embed 1,505,280; 32 blocks 630,470,400; merger 44,574,464).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.estimate import estimate
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.hardware import get_gpu_spec
from megatron_autotuner.specs.hf import model_spec_from_hf_config
from megatron_autotuner.specs.loader import load_model_spec
from megatron_autotuner.specs.model import ModelSpec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload
from megatron_autotuner.specs.vision import VisionEncoder
from megatron_autotuner.theory.flops import attention_flops_per_token, iteration_flops, vision_forward_flops
from megatron_autotuner.theory.params import stage_parameters, total_parameters, vision_parameters

PRESET = Path(__file__).parents[2] / "src/megatron_autotuner/specs/presets/models/Qwen2.5-VL-7B-Instruct.json"
H100 = get_gpu_spec("H100-SXM")


@pytest.fixture(scope="module")
def vl() -> ModelSpec:
    return load_model_spec("Qwen2.5-VL-7B-Instruct")


def test_parameters_equal_the_hf_build(vl):
    assert total_parameters(vl).total == 8_292_166_656
    assert vision_parameters(vl.vision) == 676_550_144
    assert total_parameters(vl.replace(vision=None)).total == 8_292_166_656 - 676_550_144


def test_tensor_parallel_split_replicates_only_norms_biases_of_row_parallel_layers_and_the_patch_embedding(vl):
    v = vl.vision
    replicated = (
        v.patch_features * v.hidden_size  # Conv3d, not split
        + v.depth * (2 * v.hidden_size + 2 * v.hidden_size)  # two norms and the proj / fc2 biases per block
        + v.hidden_size  # merger norm
        + v.out_hidden_size  # merger fc2 bias
    )
    for tp in (2, 4):
        assert tp * vision_parameters(v, tp) - (tp - 1) * replicated == vision_parameters(v)


def test_the_tower_sits_on_the_first_pipeline_stage_only(vl):
    parallel = ParallelConfig(num_gpus=2, pp=2)
    first, last = (stage_parameters(vl, parallel, s) for s in (0, 1))
    assert first.vision == vision_parameters(vl.vision) and last.vision == 0


def test_hf_reader_takes_text_config_nesting_as_newer_transformers_write_it(vl):
    flat = json.loads(PRESET.read_text())
    text_keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings")  # fmt: skip
    nested = {k: v for k, v in flat.items() if k not in text_keys}
    nested["text_config"] = {k: flat[k] for k in text_keys}
    assert model_spec_from_hf_config(nested, vl.name) == vl


def test_model_spec_round_trips_through_json(vl):
    assert ModelSpec.from_dict(json.loads(json.dumps(vl.to_dict()))) == vl


def test_tower_and_merger_must_fit_the_language_model(vl):
    with pytest.raises(ConfigError, match="vision.out_hidden_size"):
        vl.replace(vision=VisionEncoder(2, 64, 4, 128, out_hidden_size=vl.hidden_size + 1))
    with pytest.raises(ConfigError, match="full_attention_blocks"):
        VisionEncoder(2, 64, 4, 128, 64, window_patches=2, full_attention_blocks=(2,))


def test_bidirectional_attention_counts_every_key_and_windows_are_disjoint_blocks():
    tower = VisionEncoder(2, 64, 4, 128, 64, window_patches=2, full_attention_blocks=(1,)).tower_model()
    per_key = 2.0 * 4 * (16 + 16)  # 2 x heads x (d_qk + d_v)
    assert attention_flops_per_token(tower, 100, "causal", windowed=False) == per_key * 100
    assert attention_flops_per_token(tower, 100, "causal", windowed=True) == per_key * 4  # a window of 2 x 2
    assert attention_flops_per_token(tower, 3, "causal", windowed=True) == per_key * 3


def test_forward_flops_of_one_image_by_hand():
    """depth 2 (block 0 windowed over 2 x 2 patches, block 1 full), hidden 64, 4 heads, gated ffn 128, merge 2,
    patch 14 x 14 x 2 frames x 3 channels; one image of 4 tokens = 16 patches."""
    v = VisionEncoder(2, 64, 4, 128, 96, window_patches=2, full_attention_blocks=(1,))
    ops = vision_forward_flops(v, 4)
    p = 16
    assert ops["patch_embed"] == 2 * 1176 * 64 * p
    assert ops["qkv"] == 2 * (2 * 64 * 192 * p)
    assert ops["proj"] == 2 * (2 * 64 * 64 * p)
    assert ops["fc1"] == 2 * (2 * 64 * 256 * p) and ops["fc2"] == 2 * (2 * 128 * 64 * p)
    assert ops["core_attention"] == 2 * 4 * 32 * (4 + 16) * p  # windowed block: 4 keys, full block: 16
    assert ops["merger"] == 2 * (256 * 256 + 256 * 96) * 4


def test_iteration_flops_add_the_tower_for_every_image(vl):
    parallel = ParallelConfig(num_gpus=1)
    text = iteration_flops(vl, parallel, Workload(2048, 1, 8))
    images = iteration_flops(vl, parallel, Workload(2048, 1, 8, image_tokens_per_sequence=512))
    tower = sum(vision_forward_flops(vl.vision, 512).values())
    added = images.model_flops - text.model_flops
    # training: 3x forward (core attention's backward is 2x its forward, all dgrad), less the patch embedding's
    # dgrad: the pixels need no gradient
    pixels = vision_forward_flops(vl.vision, 512)["patch_embed"]
    assert added == pytest.approx(8 * (3 * tower - pixels))
    with pytest.raises(ConfigError, match="image_tokens"):
        iteration_flops(vl.replace(vision=None), parallel, Workload(2048, 1, 8, image_tokens_per_sequence=512))


@pytest.mark.parametrize("mode", ["train", "forward"])
def test_images_cost_the_first_stage_time_and_memory_growing_with_their_size(vl, mode):
    parallel = ParallelConfig(num_gpus=4, tp=2, pp=2)
    runs = [
        estimate(vl, parallel, Workload(2048, 1, 16, mode=mode, image_tokens_per_sequence=n), H100)
        for n in (0, 256, 1024)
    ]

    def gpu_work_s(stage) -> float:  # the GPU's (the host may pace the micro-batch: its issue time is "host")
        return sum(v for k, v in (*stage.fwd.items(), *stage.bwd.items()) if k != "host")

    first = [gpu_work_s(r.time.stages[0]) for r in runs]
    assert first[0] < first[1] < first[2]
    assert runs[0].time.stages[0].host_issue_s < runs[1].time.stages[0].host_issue_s  # 32 more eager blocks
    peaks = [r.memory_per_stage_gib[0] for r in runs]
    if mode == "train":  # kept for backward beside the decoder's
        assert peaks[0] < peaks[1] < peaks[2]
    else:  # forward only: the larger of the tower's and the decoder layers' working sets (here the decoder's)
        assert peaks[0] == peaks[1] == peaks[2]
    # the last stage does not hold the tower
    last = [r.time.stages[1].per_microbatch_s for r in runs]
    assert last[0] == last[1] == last[2]
    assert [r.memory_per_stage_gib[1] for r in runs] == [runs[0].memory_per_stage_gib[1]] * 3


def test_a_text_only_workload_runs_no_tower_but_holds_its_weights(vl):
    parallel = ParallelConfig(num_gpus=1)
    work = Workload(2048, 1, 8)
    with_tower, without = estimate(vl, parallel, work, H100), estimate(vl.replace(vision=None), parallel, work, H100)
    assert with_tower.time.stages[0].per_microbatch_s == pytest.approx(without.time.stages[0].per_microbatch_s)
    assert with_tower.peak_memory_gib > without.peak_memory_gib
