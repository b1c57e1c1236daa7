"""The Megatron-Bridge and verl exports, checked with the frameworks' own code where it installs on CPU.

Plain tests need neither framework. The framework tests skip without them; install them with
`pip install -e .[frameworks]` plus `pip install --no-deps megatron-bridge==0.3.1 verl==0.9.1` (see pyproject).

- Megatron-Bridge 0.3.1: its override loader (`process_config_with_overrides`: OmegaConf.merge of the yaml file
  into the ConfigContainer, then `apply_overrides`) on a ConfigContainer built as Bridge's unit tests build one,
  then `runtime_config_update` (MixedPrecisionConfig / CommOverlapConfig setup and ConfigContainer.validate).
  Bridge imports `transformer_engine.pytorch` at module level, which needs CUDA (transformer-engine-torch has no
  wheel, only a CUDA build), so the check runs in a subprocess with an import stub for TE when TE is absent.
- verl 0.9.1: its Hydra config (`ppo_trainer.yaml`, model_engine=megatron) composed with the override lines or
  merged with the yaml, `validate_config` as `verl.trainer.main_ppo` calls it, and the actor / ref configs
  instantiated as verl's engine workers do.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import subprocess
import sys

import pytest
import yaml

from megatron_autotuner.export.bridge import MegatronArgs, bridge_overrides, bridge_overrides_yaml, layout_num_stages
from megatron_autotuner.export.verl import MCORE_LAYOUT_KEYS, verl_override_lines, verl_overrides, verl_overrides_yaml

from .verl_checks import VERL_BASE, engine_worker_configs

# The brief's example launch (Megatron-LM argparse dests and values).
EXAMPLE: dict = {
    "num_layers": 126,
    "hidden_size": 16384,
    "ffn_hidden_size": 53248,
    "num_attention_heads": 128,
    "group_query_attention": True,
    "num_query_groups": 8,
    "swiglu": True,
    "normalization": "RMSNorm",
    "untie_embeddings_and_output_weights": True,
    "position_embedding_type": "rope",
    "seq_length": 8192,
    "max_position_embeddings": 8192,
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 8,
    "context_parallel_size": 2,
    "num_virtual_stages_per_pipeline_rank": 8,
    "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True,
    "sequence_parallel": True,
    "use_distributed_optimizer": True,
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "tp_comm_overlap": True,
    "cp_comm_type": ["p2p"],
    "micro_batch_size": 1,
    "global_batch_size": 512,
    "recompute_granularity": "selective",
    "recompute_modules": ["core_attn"],
    "bf16": True,
    "fp8": "hybrid",
    "fp8_recipe": "tensorwise",
    "fp8_param_gather": True,
    "grad_reduce_in_bf16": True,
    "num_experts": 128,
    "moe_router_topk": 8,
    "moe_ffn_hidden_size": 1536,
    "expert_model_parallel_size": 32,
    "expert_tensor_parallel_size": 1,
    "moe_token_dispatcher_type": "alltoall",
    "moe_grouped_gemm": True,
    "moe_permute_fusion": True,
    "cross_entropy_loss_fusion": True,
    "gradient_accumulation_fusion": True,
    "overlap_p2p_comm": True,
    "pipeline_model_parallel_layout": None,
    "decoder_first_pipeline_num_layers": None,
    "decoder_last_pipeline_num_layers": None,
    "num_layers_per_virtual_pipeline_stage": None,
}

# 61 decoder layers + one MTP layer in 32 stages: pp=8 gives vpp=4.
LAYOUT = "Et|(tt|)*30mL"


def example(**changes) -> dict:
    args = copy.deepcopy(EXAMPLE)
    args.update(changes)
    return args


def layout_args(**changes) -> dict:
    """A launch with an explicit pipeline layout (no account_for_*, which a layout excludes), MTP, full
    recompute and delayed fp8."""
    return example(
        num_layers=61,
        pipeline_model_parallel_layout=LAYOUT,
        num_virtual_stages_per_pipeline_rank=None,
        account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
        mtp_num_layers=1,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
        recompute_modules=None,
        fp8_recipe="delayed",
        fp8_param_gather=False,
        **changes,
    )


def mla_args(**changes) -> dict:
    """An MLA (DeepSeek-style) launch with VPP given as layers per virtual stage and blockwise fp8."""
    return example(
        num_layers=62,  # + embedding + loss = 64 = 8 stages x 8 layers; 2 layers a virtual stage -> vpp 4
        num_virtual_stages_per_pipeline_rank=None,
        num_layers_per_virtual_pipeline_stage=2,
        multi_latent_attention=True,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        fp8_recipe="blockwise",
        **changes,
    )


# --------------------------------------------------------------------------------------------------------
# Plain tests (no framework needed)
# --------------------------------------------------------------------------------------------------------


def test_bridge_overrides_are_nested_sections():
    out = bridge_overrides(EXAMPLE)
    assert set(out) == {"model", "train", "dataset", "ddp", "optimizer", "mixed_precision", "comm_overlap"}
    assert not any("." in key for section in out.values() if isinstance(section, dict) for key in section)
    model = out["model"]
    assert model["tensor_model_parallel_size"] == 8
    assert model["pipeline_model_parallel_size"] == 8
    assert model["virtual_pipeline_model_parallel_size"] == 8
    assert model["context_parallel_size"] == 2
    assert model["expert_model_parallel_size"] == 32
    assert model["expert_tensor_parallel_size"] == 1
    assert model["account_for_embedding_in_pipeline_split"] is True
    assert model["account_for_loss_in_pipeline_split"] is True
    assert model["cp_comm_type"] == "p2p"
    assert model["recompute_granularity"] == "selective"
    assert model["recompute_modules"] == ["core_attn"]
    assert model["moe_token_dispatcher_type"] == "alltoall"
    assert model["moe_grouped_gemm"] is True and model["moe_permute_fusion"] is True
    assert model["cross_entropy_loss_fusion"] is True
    assert model["num_moe_experts"] == 128
    assert model["num_query_groups"] == 8
    assert model["share_embeddings_and_output_weights"] is False
    assert out["train"] == {"micro_batch_size": 1, "global_batch_size": 512}
    # --grad-reduce-in-bf16: bf16 gradient reduction on DDP and in the MixedPrecisionConfig that setup() copies.
    assert out["ddp"]["grad_reduce_in_fp32"] is False
    assert out["mixed_precision"]["grad_reduce_in_fp32"] is False


def test_bridge_dataset_seq_length_equals_model():
    for args in (EXAMPLE, layout_args(), mla_args(), example(seq_length=4096)):
        out = bridge_overrides(args)
        assert out["dataset"]["seq_length"] == out["model"]["seq_length"] == args["seq_length"]
    with pytest.raises(ValueError, match="seq_length"):
        bridge_overrides(example(seq_length=None))


def test_bridge_mixed_precision_and_comm_overlap_forms():
    out = bridge_overrides(EXAMPLE)
    mp = out["mixed_precision"]
    assert mp["_target_"] == "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"
    assert mp["bf16"] is True and mp["fp16"] is False
    assert mp["params_dtype"] == {"_target_": "torch.bfloat16", "_call_": False}
    assert (mp["fp8"], mp["fp8_recipe"]) == ("hybrid", "tensorwise")
    assert mp["fp8_param_gather"] is True and mp["fp8_param"] is True
    co = out["comm_overlap"]
    assert co["_target_"] == "megatron.bridge.training.comm_overlap.CommOverlapConfig"
    assert co["tp_comm_overlap"] is True and co["tp_comm_overlap_cfg"] is None
    assert (co["overlap_p2p_comm"], co["batch_p2p_comm"]) == (True, False)
    assert co["overlap_grad_reduce"] is True and co["overlap_param_gather"] is True


def test_bridge_tp_comm_overlap_cfg_file_goes_on_the_model():
    out = bridge_overrides(EXAMPLE, tp_comm_overlap_cfg=UB_CFG)
    assert out["comm_overlap"] is None
    assert out["model"]["tp_comm_overlap"] is True
    assert out["model"]["tp_comm_overlap_cfg"] == "/ckpt/tp_comm_overlap.yaml"
    # the args' own --tp-comm-overlap-cfg is used when no path is passed
    assert bridge_overrides(example(tp_comm_overlap_cfg="ub.yaml"))["model"]["tp_comm_overlap_cfg"] == "ub.yaml"
    # without --tp-comm-overlap the file is ignored, as Megatron-LM ignores it
    assert bridge_overrides(example(tp_comm_overlap=False), tp_comm_overlap_cfg="ub.yaml")["comm_overlap"] is not None


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise"])
def test_bridge_fp8_recipes(recipe):
    out = bridge_overrides(example(fp8_recipe=recipe))
    assert out["mixed_precision"]["fp8_recipe"] == recipe
    assert out["mixed_precision"]["fp8"] == "hybrid"


def test_bridge_bf16_only_and_missing_precision_keys():
    out = bridge_overrides(example(fp8=None, fp8_param_gather=False, grad_reduce_in_bf16=False))
    mp = out["mixed_precision"]
    assert mp["fp8"] is None and mp["fp8_param_gather"] is False
    assert mp["grad_reduce_in_fp32"] is True and out["ddp"]["grad_reduce_in_fp32"] is True
    # no bf16 / fp16 key: Megatron's default is fp32
    fp32 = {k: v for k, v in EXAMPLE.items() if k not in ("bf16", "fp8")}
    assert bridge_overrides(fp32)["mixed_precision"]["params_dtype"]["_target_"] == "torch.float32"


def test_layout_num_stages_and_vpp():
    assert layout_num_stages(LAYOUT) == 32
    assert layout_num_stages("Ettt|(tt|)*29,m|L") == 32
    assert layout_num_stages("E|t*4|tL") == 3
    with pytest.raises(ValueError, match="unknown layer"):
        layout_num_stages("Ex|tL")
    out = bridge_overrides(layout_args())
    assert out["model"]["virtual_pipeline_model_parallel_size"] == 4
    assert out["model"]["pipeline_model_parallel_layout"] == LAYOUT
    assert out["model"]["mtp_num_layers"] == 1
    assert MegatronArgs(layout_args(pipeline_model_parallel_size=32)).vpp is None  # one stage a rank
    with pytest.raises(ValueError, match="only one of"):
        MegatronArgs(example(pipeline_model_parallel_layout=LAYOUT))


def test_vpp_from_layers_per_virtual_stage():
    # Megatron-LM: (126 + embedding + loss) / pp 8 = 16 layers a stage, 2 per virtual stage -> vpp 8
    args = example(num_virtual_stages_per_pipeline_rank=None, num_layers_per_virtual_pipeline_stage=2)
    assert bridge_overrides(args)["model"]["virtual_pipeline_model_parallel_size"] == 8
    no_account = example(
        num_virtual_stages_per_pipeline_rank=None,
        num_layers_per_virtual_pipeline_stage=2,
        num_layers=128,
        account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
    )
    assert MegatronArgs(no_account).vpp == 8
    assert MegatronArgs(mla_args()).vpp == 4
    uneven = MegatronArgs(example(num_virtual_stages_per_pipeline_rank=None, num_layers_per_virtual_pipeline_stage=3))
    with pytest.raises(ValueError):
        _ = uneven.vpp


def uneven_args(**changes) -> dict:
    """Uneven PP without VPP: 15 + 6 x 16 + 15 = 126 layers."""
    return example(
        num_virtual_stages_per_pipeline_rank=None,
        decoder_first_pipeline_num_layers=15,
        decoder_last_pipeline_num_layers=15,
        account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
        **changes,
    )


def test_uneven_pipeline_and_no_vpp():
    args = uneven_args()
    model = bridge_overrides(args)["model"]
    assert model["num_layers_in_first_pipeline_stage"] == 15
    assert model["num_layers_in_last_pipeline_stage"] == 15
    assert model["virtual_pipeline_model_parallel_size"] is None
    # Megatron-LM turns P2P overlap and aligned param gather off without VPP
    co = bridge_overrides(args)["comm_overlap"]
    assert (co["overlap_p2p_comm"], co["batch_p2p_comm"], co["align_param_gather"]) == (False, True, False)


def test_bridge_recompute_full_and_mla_mtp_keys():
    model = bridge_overrides(layout_args())["model"]
    assert (model["recompute_granularity"], model["recompute_method"], model["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    mla = bridge_overrides(mla_args())["model"]
    assert mla["multi_latent_attention"] is True
    assert (mla["q_lora_rank"], mla["kv_lora_rank"], mla["v_head_dim"]) == (1536, 512, 128)
    assert "q_lora_rank" not in bridge_overrides(EXAMPLE)["model"]


def test_bridge_gets_moe_layer_freq_as_the_list_megatron_lm_evaluates():
    """Megatron-LM's command line writes '[0]*3+[1]*58' (argparse evaluates it); Bridge's TransformerConfig takes
    the list itself: the string passed validate() and failed the model build ('Invalid moe_layer_freq')."""
    args = example(num_layers=8, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64, moe_layer_freq="[0]*3+[1]*5")
    assert bridge_overrides(args)["model"]["moe_layer_freq"] == [0, 0, 0, 1, 1, 1, 1, 1]


def test_bridge_yaml_round_trip():
    text = bridge_overrides_yaml(EXAMPLE)
    assert text.startswith("#")
    assert yaml.safe_load(text) == bridge_overrides(EXAMPLE)


def test_verl_cp_division_and_keys():
    out = verl_overrides(EXAMPLE, mode="train", max_token_len=16384)["actor_rollout_ref"]
    actor, ref, rollout = out["actor"], out["ref"], out["rollout"]
    # verl multiplies the per-GPU budgets by CP (2 here)
    assert actor["ppo_max_token_len_per_gpu"] == 8192
    assert ref["log_prob_max_token_len_per_gpu"] == 8192
    assert rollout["log_prob_max_token_len_per_gpu"] == 8192
    assert actor["use_dynamic_bsz"] is True
    assert ref["log_prob_use_dynamic_bsz"] is True and rollout["log_prob_use_dynamic_bsz"] is True
    assert "use_dynamic_bsz" not in ref
    # actor and ref share one layout
    for key, value in ref["megatron"].items():
        assert actor["megatron"][key] == value
    otc = actor["megatron"]["override_transformer_config"]
    assert otc["recompute_granularity"] == "selective" and otc["recompute_modules"] == ["core_attn"]
    assert otc["account_for_embedding_in_pipeline_split"] is True
    assert otc["moe_token_dispatcher_type"] == "alltoall"
    assert (otc["fp8"], otc["fp8_recipe"], otc["fp8_param"]) == ("hybrid", "tensorwise", True)
    assert actor["megatron"]["override_ddp_config"] == {
        "grad_reduce_in_fp32": False,
        "overlap_grad_reduce": True,
        "fp8_param_gather": True,
    }
    assert actor["optim"] == {"override_optimizer_config": {"fp8_recipe": "tensorwise"}}
    with pytest.raises(ValueError):
        verl_overrides(EXAMPLE, mode="train", max_token_len=1)


def test_verl_fixed_micro_batch_and_forward_mode():
    train = verl_overrides(EXAMPLE, mode="train", max_token_len=None)["actor_rollout_ref"]
    assert train["actor"]["ppo_micro_batch_size_per_gpu"] == 1
    assert train["actor"]["use_dynamic_bsz"] is False
    assert train["ref"]["log_prob_micro_batch_size_per_gpu"] == 1
    assert train["rollout"]["log_prob_micro_batch_size_per_gpu"] == 1
    fwd = verl_overrides(example(micro_batch_size=4), mode="forward", max_token_len=None)["actor_rollout_ref"]
    assert fwd["ref"]["log_prob_micro_batch_size_per_gpu"] == 4
    assert fwd["rollout"]["log_prob_micro_batch_size_per_gpu"] == 4
    assert not any(k.startswith("ppo_") for k in fwd["actor"])
    assert "override_ddp_config" not in fwd["actor"]["megatron"] and "optim" not in fwd["actor"]
    assert "recompute_granularity" not in fwd["actor"]["megatron"]["override_transformer_config"]
    assert fwd["ref"]["megatron"]["tensor_model_parallel_size"] == 8
    with pytest.raises(ValueError, match="mode"):
        verl_overrides(EXAMPLE, mode="rollout", max_token_len=None)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        verl_overrides(example(bf16=False), mode="train", max_token_len=None)


def test_verl_override_lines_syntax():
    lines = verl_override_lines(layout_args(), mode="train", max_token_len=None)
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8" in lines
    assert "actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size=4" in lines
    otc = "++actor_rollout_ref.actor.megatron.override_transformer_config"
    assert f"{otc}.pipeline_model_parallel_layout='{LAYOUT}'" in lines
    assert "++actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full" in lines
    assert "++actor_rollout_ref.actor.megatron.override_transformer_config.recompute_modules=null" in lines
    assert all(line.startswith("++") == (".override_" in line) for line in lines)
    loaded = yaml.safe_load(verl_overrides_yaml(EXAMPLE, mode="forward", max_token_len=4096))
    assert loaded.pop("defaults") == ["ppo_trainer", {"override model_engine": "megatron"}, "_self_"]
    assert loaded.pop("hydra") == {"searchpath": ["pkg://verl.trainer.config"]}
    assert loaded == verl_overrides(EXAMPLE, mode="forward", max_token_len=4096)


# --------------------------------------------------------------------------------------------------------
# verl's own config code
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,max_token_len",
    [(EXAMPLE, 16384), (EXAMPLE, None), (layout_args(), 32768), (mla_args(), None)],
    ids=["example-dynamic", "example-fixed", "layout-dynamic", "mla-fixed"],
)
def test_verl_train_lines_pass_verl_validation(verl_env, args, max_token_len):
    compose, validate, to_dataclass = verl_env
    cfg = compose(verl_override_lines(args, mode="train", max_token_len=max_token_len))
    validate(cfg)
    actor, ref = engine_worker_configs(cfg, to_dataclass)
    expected = verl_overrides(args, mode="train", max_token_len=max_token_len)["actor_rollout_ref"]
    for key in MCORE_LAYOUT_KEYS:
        assert getattr(actor.megatron, key) == expected["actor"]["megatron"][key]
        assert getattr(ref.megatron, key) == getattr(actor.megatron, key), key
    # the reference model reads the actor's transformer overrides (ref/megatron_ref.yaml interpolation)
    otc = dict(actor.megatron.override_transformer_config)
    assert dict(ref.megatron.override_transformer_config) == otc
    for key, value in expected["actor"]["megatron"]["override_transformer_config"].items():
        assert otc[key] == value, key
    assert dict(actor.megatron.override_ddp_config) == expected["actor"]["megatron"]["override_ddp_config"]
    cp = MegatronArgs(args).cp
    if max_token_len is None:
        assert actor.ppo_micro_batch_size_per_gpu == args["micro_batch_size"]
        assert ref.ppo_micro_batch_size_per_gpu == args["micro_batch_size"]
        assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == args["micro_batch_size"]
    else:
        # verl multiplies these by context_parallel_size: the product is the micro-batch budget
        assert actor.ppo_max_token_len_per_gpu * actor.megatron.context_parallel_size == max_token_len
        assert ref.use_dynamic_bsz is True
        assert ref.ppo_max_token_len_per_gpu * cp == max_token_len
        assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu * cp == max_token_len


@pytest.mark.parametrize("max_token_len", [None, 8192])
def test_verl_forward_lines_pass_with_the_users_training_batch(verl_env, max_token_len):
    compose, validate, to_dataclass = verl_env
    lines = verl_override_lines(example(micro_batch_size=2), mode="forward", max_token_len=max_token_len)
    user = [] if max_token_len else ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]
    cfg = compose([*user, *lines])
    validate(cfg)
    actor, ref = engine_worker_configs(cfg, to_dataclass)
    assert ref.megatron.tensor_model_parallel_size == actor.megatron.tensor_model_parallel_size == 8
    if max_token_len is None:
        assert ref.ppo_micro_batch_size_per_gpu == 2
        assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 2
        assert actor.ppo_micro_batch_size_per_gpu == 1  # the user's, untouched
    else:
        assert ref.ppo_max_token_len_per_gpu == 4096


def test_verl_yaml_config_composes_like_the_lines(verl_env, tmp_path):
    """The yaml is a Hydra primary config over verl's ppo_trainer.yaml (found through its search path)."""
    import hydra
    from omegaconf import OmegaConf

    compose, validate, to_dataclass = verl_env
    for mode in ("train", "forward"):
        from_lines = compose(verl_override_lines(EXAMPLE, mode=mode, max_token_len=16384))
        (tmp_path / f"{mode}.yaml").write_text(verl_overrides_yaml(EXAMPLE, mode=mode, max_token_len=16384))
        with hydra.initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            # the same run settings as VERL_BASE; model_engine comes from the file's defaults
            from_file = hydra.compose(mode, overrides=VERL_BASE[1:])
        validate(from_file)
        engine_worker_configs(from_file, to_dataclass)
        assert OmegaConf.to_container(from_file.actor_rollout_ref, resolve=True) == OmegaConf.to_container(
            from_lines.actor_rollout_ref, resolve=True
        )


def test_verl_rejects_the_old_ref_key(verl_env):
    """The negative control: verl has no `ref.use_dynamic_bsz` key (its key is log_prob_use_dynamic_bsz)."""
    compose, _, _ = verl_env
    with pytest.raises(Exception, match="use_dynamic_bsz"):
        compose(["actor_rollout_ref.ref.use_dynamic_bsz=true"])


def test_verl_pass_through_keys_are_megatron_core_fields():
    """verl hands override_transformer_config / override_ddp_config / override_optimizer_config to megatron-core's
    TransformerConfig (through the Megatron-Bridge provider), DistributedDataParallelConfig and OptimizerConfig."""
    pytest.importorskip("megatron.core", exc_type=ImportError)
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import MLATransformerConfig

    tc_fields = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    ddp_fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    opt_fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    for args in (EXAMPLE, layout_args(), mla_args()):
        actor = verl_overrides(args, mode="train", max_token_len=None)["actor_rollout_ref"]["actor"]
        assert set(actor["megatron"]["override_transformer_config"]) <= tc_fields
        assert set(actor["megatron"]["override_ddp_config"]) <= ddp_fields
        assert set(actor.get("optim", {}).get("override_optimizer_config", {})) <= opt_fields
        # and Bridge's model / ddp / optimizer sections are megatron-core field names too
        bridge = bridge_overrides(args)
        assert set(bridge["ddp"]) <= ddp_fields
        assert set(bridge["optimizer"]) <= opt_fields


# --------------------------------------------------------------------------------------------------------
# Megatron-Bridge's own loader and validation (in a subprocess: see the module docstring)
# --------------------------------------------------------------------------------------------------------

BRIDGE_CHECK = r'''
import importlib.abc, importlib.machinery, importlib.util, json, logging, sys, traceback, types


def install_te_stub():
    """Bridge imports transformer_engine.pytorch at module level (peft/lora_layers.py); it needs CUDA."""
    try:
        import transformer_engine.pytorch  # noqa: F401
        return False
    except Exception:
        pass

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Meta(name, (_Dummy,), {})

    class _Dummy(metaclass=_Meta):
        def __init__(self, *args, **kwargs):
            pass

    class _Module(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = _Meta(name, (_Dummy,), {})
            setattr(self, name, value)
            return value

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname == "transformer_engine" or fullname.startswith("transformer_engine."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = _Module(spec.name)
            module.__path__ = []
            module.__version__ = "2.12.0"  # megatron-core reads te.__version__; a TE Bridge 0.3.1 accepts
            return module

        def exec_module(self, module):
            pass

    # megatron-core looks for TE when first imported: let it find none, then add the stub for Bridge.
    import megatron.core.transformer.transformer_config  # noqa: F401
    from megatron.core.transformer.moe import moe_utils

    sys.meta_path.insert(0, _Finder())
    # TransformerConfig.__post_init__ requires TE's fused MoE permutation with moe_permute_fusion.
    for name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
        if getattr(moe_utils, name, None) is None:
            setattr(moe_utils, name, lambda *args, **kwargs: None)
    return True


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(f"{record.name}: {record.getMessage()}")


def snapshot(cfg, read):
    import torch
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    values = {}
    for section, fields in read.items():
        obj = getattr(cfg, section)
        for name in fields:
            value = getattr(obj, name, "<missing>")
            if isinstance(value, torch.dtype):
                value = str(value)
            elif isinstance(value, PipelineParallelLayerLayout):
                value = {
                    "pp": value.pipeline_model_parallel_size,
                    "vpp": value.virtual_pipeline_model_parallel_size,
                    "layers": len(value.flatten_layout),
                }
            elif not isinstance(value, (int, float, str, bool, list, dict, type(None))):
                value = repr(value)
            values[f"{section}.{name}"] = value
    return values


def main():
    request = json.load(sys.stdin)
    stubbed = install_te_stub()
    import megatron.bridge.training.config as config_module
    from megatron.bridge.models import DeepSeekModelProvider, GPTModelProvider
    from megatron.bridge.training.comm_overlap import (
        CommOverlapConfig,
        userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192,
    )
    from megatron.bridge.training.config import (
        CheckpointConfig, ConfigContainer, DistributedDataParallelConfig, DistributedInitConfig, GPTDatasetConfig,
        LoggerConfig, OptimizerConfig, SchedulerConfig, TokenizerConfig, TrainingConfig, runtime_config_update,
    )
    from megatron.bridge.training.mixed_precision import bf16_mixed
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    results = []
    for case in request["cases"]:
        handler = Records()
        logging.getLogger().addHandler(handler)
        out = {"name": case["name"], "stubbed_te": stubbed}
        try:
            provider = DeepSeekModelProvider if case["provider"] == "deepseek" else GPTModelProvider
            model = provider(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=4096,
                             apply_rope_fusion=False)
            # As Bridge's unit tests build one (tests/unit_tests/training/test_config.py
            # create_test_config_container), with recipes/common.py's defaults for precision and overlap.
            cfg = ConfigContainer(
                train=TrainingConfig(global_batch_size=32, micro_batch_size=2, train_iters=1000),
                model=model,
                optimizer=OptimizerConfig(lr=1e-4, use_distributed_optimizer=True),
                scheduler=SchedulerConfig(lr_decay_style="linear", lr_warmup_iters=0),
                dataset=GPTDatasetConfig(random_seed=1234, seq_length=4096, reset_position_ids=False,
                                         reset_attention_mask=False, eod_mask_loss=False),
                logger=LoggerConfig(),
                tokenizer=TokenizerConfig(),
                checkpoint=CheckpointConfig(ckpt_format="torch_dist"),
                dist=DistributedInitConfig(use_gloo_process_groups=True, lazy_init=False),
                ddp=DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                                  overlap_param_gather=True, use_distributed_optimizer=True),
                comm_overlap=None,
                mixed_precision="bf16_mixed",
            )
            if case["base"] == "resolved":
                # as recipes that resolve precision and set TP overlap (recipes/llama/llama3.py, 70B)
                cfg.mixed_precision = bf16_mixed()
                cfg.comm_overlap = CommOverlapConfig(
                    tp_comm_overlap=True, tp_comm_overlap_cfg=userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192
                )
            cfg = process_config_with_overrides(cfg, config_filepath=case["yaml_path"])
            out["mixed_precision_type"] = type(cfg.mixed_precision).__name__
            out["comm_overlap_type"] = type(cfg.comm_overlap).__name__
            out["loaded"] = snapshot(cfg, case["read"])
            config_module.get_world_size_safe = lambda: case["world_size"]  # as Bridge's unit tests patch it
            runtime_config_update(cfg)
            out["final"] = snapshot(cfg, case["read_final"])
            out["data_parallel_size"] = cfg.data_parallel_size
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2500:]}"
        logging.getLogger().removeHandler(handler)
        out["warnings"] = handler.messages
        results.append(out)
    print("BRIDGE_RESULT " + json.dumps(results))


main()
'''

# What runtime_config_update must leave on the model / DDP / optimizer (MixedPrecisionConfig.setup and
# CommOverlapConfig.setup copy their fields there) and what validate() derives.
READ_FINAL = {
    "model": [
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "sequence_parallel",
        "pipeline_model_parallel_layout",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "account_for_embedding_in_pipeline_split",
        "seq_length",
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "bf16",
        "params_dtype",
        "fp8",
        "fp8_recipe",
        "fp8_param",
        "tp_comm_overlap",
        "tp_comm_overlap_cfg",
        "overlap_p2p_comm",
        "batch_p2p_comm",
        "moe_token_dispatcher_type",
        "cross_entropy_loss_fusion",
        "mtp_num_layers",
        "multi_latent_attention",
    ],
    "ddp": ["grad_reduce_in_fp32", "overlap_grad_reduce", "overlap_param_gather", "fp8_param_gather"],
    "optimizer": ["use_distributed_optimizer", "overlap_param_gather", "bf16"],
    "dataset": ["seq_length"],
    "train": ["micro_batch_size", "global_batch_size"],
}

# Warnings that are not about the overrides: Bridge disabling fused kernels this CPU machine lacks, and
# CommOverlapConfig.setup saying TE's default userbuffers config is used (tp_comm_overlap_cfg None, as launched).
IGNORED_WARNINGS = ("megatron.bridge.utils.fusions", "Initializing TP comm overlap with the default config")
UB_CFG = "/ckpt/tp_comm_overlap.yaml"


def _bridge_case(name, args, ub_cfg=None, *, base="recipe-common", provider="gpt", world_size=256):
    overrides = bridge_overrides(args, tp_comm_overlap_cfg=ub_cfg)
    read = {s: [k for k in v if k != "_target_"] for s, v in overrides.items() if isinstance(v, dict)}
    return {
        "name": name,
        "yaml_text": bridge_overrides_yaml(args, tp_comm_overlap_cfg=ub_cfg),
        "base": base,
        "provider": provider,
        "world_size": world_size,
        "read": read,
        "read_final": READ_FINAL,
    }


def _bridge_cases():
    cases = [_bridge_case(f"example-{base}", EXAMPLE, base=base) for base in ("recipe-common", "resolved")]
    cases.append(_bridge_case("layout-mtp-full-recompute-delayed", layout_args()))
    cases.append(_bridge_case("mla-blockwise-vpp-by-layers", mla_args(), provider="deepseek"))
    cases.append(_bridge_case("uneven-pp-no-vpp", uneven_args()))
    for base in ("recipe-common", "resolved"):
        cases.append(_bridge_case(f"ub-cfg-file-{base}", EXAMPLE, UB_CFG, base=base))
    # Negative controls, to show the checks see the defects: flat keys (the old export's form) and plain
    # mixed_precision keys merged onto a recipe's precision name.
    flat = _bridge_case("negative-flat-keys", EXAMPLE)
    flat["yaml_text"] = yaml.safe_dump({f"model.{k}": v for k, v in bridge_overrides(EXAMPLE)["model"].items()})
    plain = _bridge_case("negative-plain-mixed-precision", EXAMPLE)
    plain["yaml_text"] = yaml.safe_dump({"mixed_precision": {"fp8": "hybrid", "fp8_recipe": "tensorwise"}})
    for case in (flat, plain):
        case["read"] = {}
    return [*cases, flat, plain]


def run_bridge_check(cases: list[dict], folder) -> dict[str, dict]:
    """Each case's `yaml_text` through Bridge's loader and runtime_config_update in a subprocess (BRIDGE_CHECK);
    {case name: result}. Skips the test when Bridge is not installed."""
    try:
        installed = importlib.util.find_spec("megatron.bridge") is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        pytest.skip("megatron-bridge is not installed")
    # Bridge's import chain needs these besides megatron-core (importing megatron.bridge itself needs TE).
    for module in ("omegaconf", "hydra", "transformers", "datasets", "einops", "triton"):
        pytest.importorskip(module, exc_type=ImportError)
    script = folder / "bridge_check.py"
    script.write_text(BRIDGE_CHECK)
    for k, case in enumerate(cases):
        path = folder / f"{k}.yaml"
        path.write_text(case.pop("yaml_text"))
        case["yaml_path"] = str(path)
    proc = subprocess.run(
        [sys.executable, str(script)],
        input=json.dumps({"cases": cases}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BRIDGE_RESULT ")), None)
    assert line is not None, f"Bridge check failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return {r["name"]: r for r in json.loads(line[len("BRIDGE_RESULT ") :])}


@pytest.fixture(scope="module")
def bridge_results(tmp_path_factory):
    return run_bridge_check(_bridge_cases(), tmp_path_factory.mktemp("bridge"))


def _loader_warnings(result):
    return [w for w in result["warnings"] if not any(text in w for text in IGNORED_WARNINGS)]


def _expected_loaded(overrides):
    expected = {}
    for section, fields in overrides.items():
        if not isinstance(fields, dict):
            continue
        for key, value in fields.items():
            if key == "_target_":
                continue
            if isinstance(value, dict) and "_target_" in value:  # a torch.dtype node
                value = value["_target_"]
            elif key == "pipeline_model_parallel_layout" and value is not None:
                continue  # parsed into a PipelineParallelLayerLayout only by finalize()
            expected[f"{section}.{key}"] = value
    return expected


# the ConfigContainers the Bridge subprocess loads (names match `bridge_results`)
BRIDGE_CASES = [
    ("example-recipe-common", EXAMPLE, None),
    ("example-resolved", EXAMPLE, None),
    ("layout-mtp-full-recompute-delayed", layout_args(), None),
    ("mla-blockwise-vpp-by-layers", mla_args(), None),
    ("uneven-pp-no-vpp", uneven_args(), None),
    ("ub-cfg-file-recipe-common", EXAMPLE, UB_CFG),
    ("ub-cfg-file-resolved", EXAMPLE, UB_CFG),
]


@pytest.mark.parametrize("name,args,ub_cfg", BRIDGE_CASES)
def test_bridge_loader_applies_every_override(bridge_results, name, args, ub_cfg):
    result = bridge_results[name]
    assert "error" not in result, result.get("error")
    assert _loader_warnings(result) == []
    overrides = bridge_overrides(args, tp_comm_overlap_cfg=ub_cfg)
    loaded = result["loaded"]
    for key, value in _expected_loaded(overrides).items():
        assert loaded[key] == value, key
    assert result["mixed_precision_type"] == "MixedPrecisionConfig"
    assert result["comm_overlap_type"] == ("NoneType" if ub_cfg else "CommOverlapConfig")


@pytest.mark.parametrize("name,args,ub_cfg", BRIDGE_CASES)
def test_bridge_runtime_update_and_validate_keep_the_launch(bridge_results, name, args, ub_cfg):
    result = bridge_results[name]
    final = result["final"]
    a = MegatronArgs(args)
    assert result["data_parallel_size"] == 256 // (a.tp * a.pp * a.cp)
    assert final["model.tensor_model_parallel_size"] == a.tp
    assert final["model.pipeline_model_parallel_size"] == a.pp
    assert final["model.virtual_pipeline_model_parallel_size"] == a.vpp
    assert final["model.context_parallel_size"] == a.cp
    assert final["model.expert_model_parallel_size"] == a.ep
    assert final["model.expert_tensor_parallel_size"] == a.etp
    assert final["dataset.seq_length"] == final["model.seq_length"] == args["seq_length"]
    assert final["train.micro_batch_size"] == 1 and final["train.global_batch_size"] == 512
    assert final["model.recompute_granularity"] == args["recompute_granularity"]
    assert final["model.recompute_method"] == args.get("recompute_method")
    assert final["model.num_layers_in_first_pipeline_stage"] == args["decoder_first_pipeline_num_layers"]
    assert final["model.num_layers_in_last_pipeline_stage"] == args["decoder_last_pipeline_num_layers"]
    assert final["model.account_for_embedding_in_pipeline_split"] is args["account_for_embedding_in_pipeline_split"]
    if args.get("pipeline_model_parallel_layout"):
        assert final["model.pipeline_model_parallel_layout"] == {"pp": 8, "vpp": 4, "layers": 64}  # E + 61 t + m + L
        assert final["model.mtp_num_layers"] == 1
    assert final["model.multi_latent_attention"] is bool(args.get("multi_latent_attention"))
    # MixedPrecisionConfig.setup copied precision onto model, optimizer and DDP
    assert final["model.bf16"] is True and final["optimizer.bf16"] is True
    assert final["model.params_dtype"] == "torch.bfloat16"
    assert (final["model.fp8"], final["model.fp8_recipe"]) == ("hybrid", args["fp8_recipe"])
    assert final["model.fp8_param"] is args["fp8_param_gather"]
    assert final["ddp.fp8_param_gather"] is args["fp8_param_gather"]
    assert final["ddp.grad_reduce_in_fp32"] is False  # --grad-reduce-in-bf16
    # comm overlap as launched (CommOverlapConfig.setup would otherwise pick its own)
    assert final["model.tp_comm_overlap"] is True
    assert final["model.tp_comm_overlap_cfg"] == ub_cfg
    # Megatron-LM overlaps P2P only with the interleaved schedule (VPP)
    assert (final["model.overlap_p2p_comm"], final["model.batch_p2p_comm"]) == (a.vpp is not None, a.vpp is None)
    assert final["ddp.overlap_grad_reduce"] is True and final["ddp.overlap_param_gather"] is True
    assert final["optimizer.overlap_param_gather"] is True
    assert final["model.cross_entropy_loss_fusion"] is True
    assert final["model.moe_token_dispatcher_type"] == "alltoall"


def test_bridge_negative_controls(bridge_results):
    flat = bridge_results["negative-flat-keys"]
    assert any("model.tensor_model_parallel_size" in w and "not found" in w for w in flat["warnings"])
    assert flat["final"]["model.tensor_model_parallel_size"] == 1  # the flat key was skipped
    plain = bridge_results["negative-plain-mixed-precision"]
    assert plain["mixed_precision_type"] == "dict"
    assert "error" in plain
