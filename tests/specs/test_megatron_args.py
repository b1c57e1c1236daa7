"""Megatron-LM flags in and out: the catalogue, reading real launches, Megatron's defaults, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import load_model_spec
from megatron_autotuner.specs.megatron_args import (
    FLAG_TABLE,
    NO_EFFECT_DESTS,
    catalog,
    launch_to_specs,
    moe_layer_pattern,
    read_launch,
    read_launch_file,
)

LAUNCHES = Path(__file__).resolve().parents[1] / "fixtures" / "launches"


def test_every_table_and_no_effect_flag_is_a_real_megatron_lm_argument():
    _, _, by_dest = catalog()
    assert not [d for d in FLAG_TABLE if d not in by_dest]
    assert not [d for d in NO_EFFECT_DESTS if d not in by_dest]
    # names and defaults exactly as Megatron-LM's argparse has them
    assert by_dest["overlap_grad_reduce"].default is False
    assert by_dest["fp8"].flags == ("--fp8-format",)
    assert by_dest["add_bias_linear"].flags == ("--disable-bias-linear",)
    assert by_dest["hidden_dropout"].default == 0.1 and by_dest["normalization"].default == "LayerNorm"


def test_llama_405b_recipe_reads_as_nvidias_layout():
    launch = read_launch_file(str(LAUNCHES / "llama31_405b_h100_1024gpu_fp8cs.sh"))
    imp = launch_to_specs(launch)
    p, w, m = imp.parallel, imp.workload, imp.model
    assert (p.num_gpus, p.tp, p.pp, p.vpp, p.cp, p.dp) == (1024, 8, 8, 8, 2, 8)  # torchrun 8 x 128 nodes
    assert p.pipeline_layout.describe() == "embedding+loss accounted"
    assert p.pipeline_layout.stage(0, 0) == "Et" and p.pipeline_layout.stage(7, 7) == "tL"
    assert (m.num_layers, m.hidden_size, m.num_query_groups, m.ffn_hidden_size) == (126, 16384, 8, 53248)
    assert (w.precision, w.fp8_recipe, w.fp8_param, w.global_batch_size) == ("fp8", "tensorwise", True, 1536)
    assert p.sequence_parallel and p.tp_comm_overlap and not p.grad_reduce_in_fp32
    assert imp.options["overlap_grad_reduce"] and imp.options["expandable_segments"]


def test_deepseek_v3_recipe_reads_its_layout_string_and_notes_what_is_not_modelled():
    imp = launch_to_specs(read_launch_file(str(LAUNCHES / "deepseek_v3_h100_1024gpu.sh")))
    p, m = imp.parallel, imp.model
    assert (p.tp, p.pp, p.vpp, p.ep, p.etp) == (2, 8, 4, 64, 1)
    assert p.pipeline_layout.to_string() == "Et|(tt|)*30mL"
    assert m.moe_layer_pattern[:4] == (0, 0, 0, 1) and m.mtp_num_layers == 1 and m.multi_latent_attention
    assert imp.workload.recompute.modules == ("mla_up_proj", "mlp")
    assert imp.options["overlap_grad_reduce"] is False  # the recipe turns it off; Megatron's default is off
    # the flex dispatcher over HybridEP is modelled (`collectives.dispatch_time_s`); the SMs it takes are not
    assert p.moe_dispatcher == "hybridep" and "--moe-hybridep-num-sms" in imp.not_modelled


def test_a_launch_without_the_vocabulary_takes_it_from_model_and_says_the_flags_win():
    launch = read_launch_file(str(LAUNCHES / "qwen3_235b_a22b_h100_256gpu_fp8cs.sh"))
    alone = launch_to_specs(launch)  # the tokenizer it names gives the vocabulary, with a note
    assert alone.model.vocab_size == 151936 and any(n.startswith("vocab_size: no --vocab-size") for n in alone.notes)
    imp = launch_to_specs(launch, load_model_spec("Qwen3-235B-A22B"))
    assert imp.model.vocab_size == 151936 and imp.model.num_layers == 94
    assert any("override --model" in n for n in imp.notes)
    assert (imp.parallel.ep, imp.parallel.pipeline_layout.describe()) == (32, "embedding+loss accounted")


def test_megatron_defaults_apply_to_what_a_launch_does_not_say():
    text = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --vocab-size 1000 --seq-length 512"
    text += " --micro-batch-size 2"
    imp = launch_to_specs(read_launch(text), num_gpus=2)
    m = imp.model
    # Megatron-LM: LayerNorm, GeLU 4h MLP, biases, learned absolute positions, tied embeddings, dropout 0.1
    assert (m.normalization, m.activation, m.gated_linear_unit, m.ffn_hidden_size) == ("LayerNorm", "gelu", False, 1024)
    assert m.add_bias_linear and m.tie_embeddings and m.position_embedding_type == "learned_absolute"
    assert (m.hidden_dropout, m.attention_dropout, m.num_query_groups) == (0.1, 0.1, 8)
    assert imp.options["overlap_grad_reduce"] is False and imp.options["overlap_param_gather"] is False
    assert imp.options["fused_cross_entropy"] is False
    assert not imp.parallel.use_distributed_optimizer and imp.workload.global_batch_size == 4  # mbs x dp
    swiglu = launch_to_specs(read_launch(text + " --swiglu"), num_gpus=1).model
    assert swiglu.ffn_hidden_size == int(4 * 256 * 2 / 3 / 64) * 64  # Megatron-LM validate_args


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 10 --seq-length 8 "
            "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|tx|L'",
            "invalid layer character 'x'",
        ),
        (
            "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 10 --seq-length 8 "
            "--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout 'Et|t|t|t||L'",
            "has 6 virtual stages, not divisible by pipeline_model_parallel_size=4",
        ),
        (
            "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 10 --seq-length 8 "
            "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
            "--pipeline-model-parallel-layout 'Et|tt|tL'",
            "at most one of",
        ),
        (
            "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 10 --seq-length 8 "
            "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|ttL'",
            "holds 3 decoder layers 't', the model has num_layers=4",
        ),
        ("just some words", "holds no Megatron-LM flags"),
        (
            "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 10 --multi-latent-attention "
            "--kv-lora-rank x",
            "kv_lora_rank: must be an integer, got 'x'",
        ),
    ],
)
def test_bad_launches_are_one_line_config_errors(text, needle):
    with pytest.raises(ConfigError) as info:
        launch_to_specs(read_launch(text), num_gpus=4)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_flag_megatron_lm_lacks_is_a_note_and_an_error_only_when_strict():
    text = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --tensor-model-parralel-size 2 --use_flash_attn"
    launch = read_launch(text)
    assert "tensor_model_parallel_size" not in launch.args and launch.args["num_layers"] == "4"
    assert (
        "--tensor-model-parralel-size: not a Megatron-LM flag (did you mean --tensor-model-parallel-size?), ignored"
        in launch.notes
    )
    with pytest.raises(ConfigError, match="unknown Megatron-LM flag --tensor-model-parralel-size"):
        read_launch(text, strict=True)


def test_an_unset_variable_leaves_its_flag_without_a_value_and_says_so():
    launch = read_launch("--num-layers ${LAYERS} --hidden-size 64 --num-attention-heads 4 --hidden-dropout ${DROP}")
    assert "num_layers" not in launch.args and "hidden_dropout" not in launch.args
    assert "$LAYERS is not set: read as empty" in launch.notes
    assert "--num-layers has no value (an empty variable?): ignored" in launch.notes
    assert read_launch("--num-layers ${LAYERS}", variables={"LAYERS": "6"}).args["num_layers"] == "6"


def test_what_a_launch_leaves_out_is_assumed_and_noted():
    """No GPU count, no sequence length, no vocabulary: assumptions, each in a note, never a refusal; a launch whose
    GPUs cannot hold its layout is read with the fewest that can."""
    text = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --tensor-model-parallel-size 2 "
    imported = launch_to_specs(read_launch(text + "--tokenizer-model /models/Qwen3-8B"))
    assert imported.parallel.num_gpus == 2 and imported.workload.seq_length == 4096
    assert imported.model.vocab_size == 151936
    assert any("vocab_size" in n and "Qwen3-8B" in n for n in imported.notes)
    small = launch_to_specs(read_launch("torchrun --nproc_per_node 4 pretrain_gpt.py " + text + "--seq-length 8 "
                                        "--pipeline-model-parallel-size 4"))  # fmt: skip
    assert small.parallel.num_gpus == 8 and any("cannot hold" in n for n in small.notes)


def test_moe_layer_freq_forms():
    assert moe_layer_pattern("[0]*3+[1]*5", 8) == (0, 0, 0, 1, 1, 1, 1, 1)
    assert moe_layer_pattern("([1]*3+[0]*1)*2", 8) == (1, 1, 1, 0, 1, 1, 1, 0)  # Megatron-LM's docstring example
    assert moe_layer_pattern(2, 4) == (1, 0, 1, 0)
    with pytest.raises(ConfigError, match="only integer lists"):
        moe_layer_pattern("[1]*__import__('os')", 4)


def test_launch_forms_one_line_several_lines_backslashes_and_torchrun():
    flags = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 128 --seq-length 32"
    one_line = read_launch(flags)
    several = read_launch(flags.replace(" --", "\n--"))
    backslashes = read_launch(flags.replace(" --", " \\\n  --"))
    torchrun = read_launch(
        "# my run\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
        "torchrun --nproc_per_node=8 --nnodes 2 pretrain_gpt.py \\\n  " + flags.replace(" --", " \\\n  --")
    )
    assert one_line.args == several.args == backslashes.args == torchrun.args
    assert torchrun.num_gpus == 16 and torchrun.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


# ---------------------------------------------------------------------------------------------------------------
# Activation offloading
# ---------------------------------------------------------------------------------------------------------------
_LLAMA_8B_LAUNCH = (
    "torchrun --nproc-per-node 1 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
    "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope "
    "--vocab-size 128256 --seq-length 4096 --micro-batch-size 1 --global-batch-size 8 --bf16 "
)


def _offload_of(flags: str, mode: str = "train"):
    return launch_to_specs(read_launch(_LLAMA_8B_LAUNCH + flags), mode=mode)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("--cpu-offloading-num-layers 4", {"num_layers": 4, "modules": ()}),
        (
            "--fine-grained-activation-offloading --offload-modules core_attn attn_proj "
            "--min-offloaded-tensor-size 4096 --activation-offload-fraction 0.5",
            {"num_layers": 0, "modules": ("core_attn", "attn_proj"), "min_tensor_elements": 4096, "fraction": 0.5},
        ),
    ],
)
def test_activation_offload_flags_round_trip(flags, expected):
    from megatron_autotuner.specs.megatron_args import render_flags, specs_to_megatron_args

    imp = _offload_of(flags)
    off = imp.workload.activation_offload
    assert {k: getattr(off, k) for k in expected} == expected
    assert not [n for n in imp.not_modelled if "offload" in n]
    rendered = " ".join(render_flags(specs_to_megatron_args(imp.model, imp.parallel, imp.workload)))
    again = launch_to_specs(read_launch("torchrun --nproc-per-node 1 pretrain_gpt.py " + rendered))
    assert again.workload.activation_offload == off


def test_activation_offload_import_notes_and_forward_mode():
    imp = _offload_of("--fine-grained-activation-offloading --offload-modules core_attn fused_group_mlp")
    assert imp.workload.activation_offload.modules == ("core_attn",)
    assert any("fused_group_mlp" in n for n in imp.not_modelled)
    assert any("--offload-modules without" in n for n in _offload_of("--offload-modules core_attn").not_modelled)
    fwd = _offload_of("--cpu-offloading-num-layers 4", mode="forward")
    assert not fwd.workload.activation_offload.enabled and any("offloading" in n for n in fwd.notes)


@pytest.mark.parametrize(
    "flags, needle",
    [
        ("--fine-grained-activation-offloading", "offload_modules: --fine-grained-activation-offloading needs"),
        ("--fine-grained-activation-offloading --offload-modules attn_proj", "without core_attn"),
        ("--fine-grained-activation-offloading --offload-modules mlp", "unknown module 'mlp'"),
        ("--fine-grained-activation-offloading --offload-modules core_attn --transformer-impl local", "_engine"),
        ("--cpu-offloading-num-layers 2 --fine-grained-activation-offloading --offload-modules core_attn", "combined"),
        ("--cpu-offloading-num-layers 2 --recompute-granularity selective", "recomputation"),
        ("--cpu-offloading-num-layers 2 --cuda-graph-impl transformer_engine", "CUDA graphs"),
        ("--fine-grained-activation-offloading --offload-modules core_attn --activation-offload-fraction 2", "[0, 1]"),
    ],
)
def test_activation_offload_validity_errors(flags, needle):
    with pytest.raises(ConfigError) as err:
        _offload_of(flags)
    assert needle in str(err.value)


LEGACY_BASE = (
    "--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
    "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16"
)


def test_legacy_flags_are_read_as_megatron_lm_rewrites_them():
    """validate_args turns --recompute-activations into selective recompute (over a granularity given beside it)
    and --use-rotary-position-embeddings into rope; --use-mcore-models does nothing. Each rewrite is a note."""
    recompute = launch_to_specs(read_launch(LEGACY_BASE + " --recompute-activations --recompute-granularity full"))
    assert recompute.workload.recompute.granularity == "selective"
    said = "--recompute-activations: read as --recompute-granularity selective"
    assert any(n.startswith(said) for n in recompute.notes)
    rope = launch_to_specs(read_launch(LEGACY_BASE + " --use-rotary-position-embeddings --use-mcore-models"))
    assert rope.model.position_embedding_type == "rope"
    assert not rope.not_modelled


@pytest.mark.parametrize("optimizer", ["sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"])
def test_an_optimizer_other_than_adam_is_said_to_be_priced_as_adam(optimizer):
    """The optimizer state memory (fp32 master weights + Adam's two fp32 moments) and the optimizer step are Adam's;
    --optimizer sgd / muon / ... (Megatron-LM's choices) keep other states, which is not modelled: a `not modelled`
    line says so (it was read as a flag with no effect). --optimizer adam, given or not, says nothing."""
    other = launch_to_specs(read_launch(f"{LEGACY_BASE} --optimizer {optimizer}"))
    assert f"--optimizer {optimizer} (its state memory and step priced as Adam's)" in other.not_modelled
    for flags in (LEGACY_BASE, LEGACY_BASE + " --optimizer adam"):
        assert not [n for n in launch_to_specs(read_launch(flags)).not_modelled if "optimizer" in n]
    # a fork's value (Pai-Megatron-Patch's host-offloaded hybridadam) is read with one note, not refused
    fork = launch_to_specs(read_launch(f"{LEGACY_BASE} --optimizer hybridadam"))
    assert [n for n in fork.notes if n.startswith("optimizer: ")][0].endswith("priced as Adam's on the GPU")
    assert not [n for n in fork.not_modelled if "optimizer" in n]


def test_a_real_launch_with_the_legacy_rope_flag_is_read_with_rope():
    """MindSpeed-LLM's Qwen3-8B pretraining launch gives rope only as --use-rotary-position-embeddings."""
    path = LAUNCHES / "real/megatron/Ascend__MindSpeed-LLM__examples__mcore__qwen3__pretrain_qwen3_8b_4K_ptd.sh"
    imported = launch_to_specs(read_launch_file(str(path)))
    assert imported.model.position_embedding_type == "rope"
    assert not any("rotary" in flag or "mcore" in flag for flag in imported.not_modelled)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--window-size abc", "mat: error: window_size: must be LEFT,RIGHT integers, got 'abc'"),
        ("--window-size 127", "mat: error: window_size: must be LEFT,RIGHT integers, got '127'"),
        ("--window-size 127,5",
         "mat: error: window_size: 127,5: a window to the right (bidirectional) is not modelled"),
        ("--window-size 127,0 --window-attn-skip-freq 0", "mat: error: window_attn_skip_freq: must be >= 1, got 0"),
        ("--window-size 127,0 --window-attn-skip-freq [1]*3",
         "mat: error: window_attn_skip_freq: has 3 entries, the model has num_layers=4"),
        ("--activation-func-clamp-value -1",
         "mat: error: activation_clamp_value: must be > 0 (megatron-core TransformerConfig)"),
        ("--glu-linear-offset x", "mat: error: glu_linear_offset: must be a number, got 'x'"),
        ("--window-size 127,0 --context-parallel-size 2",
         "mat: error: cp_comm_type: p2p: sliding-window attention with cp > 1 runs with a2a or allgather"),
    ],
)  # fmt: skip
def test_bad_window_sink_and_glu_flags_are_one_line_errors(flags, message, tmp_path, capsys):
    from megatron_autotuner.cli import main

    launch = tmp_path / "launch.sh"
    launch.write_text("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 1024 "
                      f"--micro-batch-size 1 --global-batch-size 8 --vocab-size 1000 {flags}\n")  # fmt: skip
    assert main(["estimate", "--megatron-args", str(launch), "--gpu", "H100-SXM", "--num-gpus", "2"]) == 2
    assert capsys.readouterr().err.strip() == message


MOE_FLAGS = (
    "--num-layers 2 --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 8 --seq-length 2048 "
    "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --num-experts 8 --moe-router-topk 2 "
    "--moe-ffn-hidden-size 1024 --expert-model-parallel-size 4 --vocab-size 32000 --bf16 "
)


def test_a_negative_capacity_factor_is_dropless_as_megatron_core_reads_it():
    """megatron-core's TransformerConfig turns a negative --moe-expert-capacity-factor into None (dropless)."""
    imp = launch_to_specs(read_launch(MOE_FLAGS + "--moe-expert-capacity-factor -1"), num_gpus=8)
    assert imp.workload.moe_routing.capacity_factor is None
    assert any("--moe-expert-capacity-factor -1: read as dropless" in n for n in imp.notes)
    with pytest.raises(ConfigError, match="moe_expert_capacity_factor"):
        launch_to_specs(read_launch(MOE_FLAGS + "--moe-expert-capacity-factor 0"), num_gpus=8)


def test_a_flex_backend_without_the_flex_dispatcher_is_said_ignored():
    imp = launch_to_specs(read_launch(MOE_FLAGS + "--moe-flex-dispatcher-backend hybridep"), num_gpus=8)
    assert imp.parallel.moe_dispatcher == "allgather"
    assert any("--moe-flex-dispatcher-backend hybridep: ignored, the dispatcher is allgather" in n for n in imp.notes)
    flex = MOE_FLAGS + "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep"
    imp = launch_to_specs(read_launch(flex), num_gpus=8)
    assert imp.parallel.moe_dispatcher == "hybridep" and not any("ignored, the dispatcher" in n for n in imp.notes)
    # a launch that never names a backend gets no such note (its default had been said ignored; a CLI audit)
    imp = launch_to_specs(read_launch(MOE_FLAGS), num_gpus=8)
    assert not any("--moe-flex-dispatcher-backend" in n for n in imp.notes)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--moe-token-dispatcher-type flex --moe-enable-deepep", "deepep"),  # as slime's GLM-4.7 / Qwen3-Next launch
        ("--moe-enable-deepep", "moe_enable_deepep"),  # the default allgather
        ("--moe-token-dispatcher-type alltoall --moe-enable-deepep", "moe_enable_deepep"),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-enable-deepep",
         "moe_enable_deepep"),
    ],
)  # fmt: skip
def test_the_deprecated_deepep_switch_is_read_as_megatron_core_reads_it(flags, expected):
    """--moe-enable-deepep sets the flex backend to DeepEP, and megatron-core's TransformerConfig refuses it without
    the flex dispatcher or beside HybridEP ("DeepEP backend is only supported with flex token dispatcher",
    core_v0.13.0 to core_v0.19.0); it had been read as flex whatever the dispatcher flag said."""
    text = MOE_FLAGS + flags
    if expected == "moe_enable_deepep":
        with pytest.raises(ConfigError) as exc:
            launch_to_specs(read_launch(text), num_gpus=8)
        assert exc.value.field == expected
    else:
        assert launch_to_specs(read_launch(text), num_gpus=8).parallel.moe_dispatcher == expected
