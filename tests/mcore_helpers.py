"""Build real megatron-core `GPTModel`s on CPU from a `ModelSpec` and count their parameters per rank.

The parent (pytest) never imports torch or megatron-core from here: `run_worlds` starts one
subprocess per rank (`python -m tests.mcore_helpers ...`), each joins a gloo process group
(file:// rendezvous, CUDA hidden), runs `initialize_model_parallel` for every case, builds the
model chunks of its pipeline rank (virtual stages included) exactly as Megatron-LM's
`model_provider` does with the local (non-TE) layer spec, and writes its counts to
`rank<r>.json`. Running even world size 1 in a subprocess keeps the global
`torch.distributed` / `parallel_state` of the pytest process untouched.

Parameters are counted by module path, mirroring `theory.params.ParameterCounts`:
`embedding.*` -> embedding, `decoder.layers.*` -> decoder_dense / expert (routed experts live
under `.mlp.experts.`), `decoder.final_layernorm.*` -> final_norm, `output_layer.*` ->
output_layer, `mtp.*` -> mtp_dense / mtp_expert. `model.parameters()` deduplicates shared
tensors, so tied embeddings on one stage count once. Routed-expert parameters are also
counted through megatron's own marker (`allreduce=False`, set when ep > 1). Each rank also records its
decoder layers' (dense, expert) counts by global layer index and every parameter's shape by name.

A model with gated-DeltaNet layers (`linear_attention_pattern`, Qwen3-Next) is built through megatron-core's own
`get_transformer_block_with_experimental_attention_variant_spec`, as Megatron-LM's `gpt_builders` does; that
builder accepts only the TE backend, so it is handed the local one (see `_experimental_attention_block_spec`).

A hybrid model (`hybrid_layer_pattern`, Nemotron-H) is built as megatron-core's own `MambaModel` with
`hybrid_override_pattern`, through a local copy of `mamba_layer_specs.mamba_stack_spec` (which names TE modules
only; see `_local_mamba_stack_spec`), mamba_ssm's gated norm stood in for (see `_patch_mamba_for_cpu`). Its
MLP / attention / MoE layers carry stage-local layer numbers, so layers are indexed through MambaStack's own
pipeline split (`_decoder_layer_indices`); its final norm (`decoder.final_norm`) counts as final_norm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]

COUNT_FIELDS = ("embedding", "decoder_dense", "expert", "final_norm", "output_layer", "mtp_dense", "mtp_expert")


@dataclass(frozen=True)
class McoreCase:
    """One model x one parallel layout, built on `world` ranks (dp = world / (tp * pp))."""

    name: str
    spec: dict[str, Any]  # ModelSpec.to_dict()
    world: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None
    vpp: int | None = None
    padded_vocab_size: int | None = None
    # megatron-core's uneven-pipeline settings, as TransformerConfig fields: pipeline_model_parallel_layout,
    # num_layers_in_first/last_pipeline_stage, account_for_embedding/loss_in_pipeline_split
    pipeline: tuple[tuple[str, Any], ...] = ()
    marks: tuple[Any, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "world": self.world,
            "tp": self.tp,
            "pp": self.pp,
            "ep": self.ep,
            "etp": self.etp,
            "vpp": self.vpp,
            "padded_vocab_size": self.padded_vocab_size,
            "pipeline": dict(self.pipeline),
        }


# --------------------------------------------------------------------------------------------
# Parent side: what a test checks of a case's ranks (theory imported lazily: the ranks never need it).
# --------------------------------------------------------------------------------------------
def rank_results(counts: dict[str, list[dict[str, Any]]], case: McoreCase) -> list[dict[str, Any]]:
    """The case's per-rank results: every rank built, and no parameter outside the counted components."""
    ranks = counts.get(case.name)
    assert ranks, f"no result for {case.name}"
    errors = [r["error"] for r in ranks if "error" in r]
    assert not errors, f"megatron-core failed to build {case.name}:\n{errors[0]}"
    assert len(ranks) == case.world
    for rank in ranks:
        assert rank["other"] == {}, f"parameters outside the counted components: {rank['other']}"
    return ranks


def check_total_and_active(rank: dict[str, Any], spec_dict: dict[str, Any]) -> None:
    """A one-rank build's total equals `total_parameters`, and its active count (dense + top-k of the experts)."""
    from megatron_autotuner.specs.model import ModelSpec
    from megatron_autotuner.theory.params import total_parameters

    spec = ModelSpec.from_dict(spec_dict)
    theory, measured = total_parameters(spec), rank["counts"]
    assert theory.total == measured["total"]
    active = measured["dense"]
    if spec.is_moe:
        active += measured["experts"] // spec.num_moe_experts * spec.moe_router_topk
    assert theory.active == active


def check_layers_and_stages(ranks: list[dict[str, Any]], case: McoreCase) -> None:
    """Every rank's decoder layers are `stage_layer_range`'s, each layer's (dense, expert) count is
    `decoder_layer_parameters`', and the rank's counts are `stage_parameters`'."""
    from megatron_autotuner.specs.model import ModelSpec
    from megatron_autotuner.specs.parallel import ParallelConfig
    from megatron_autotuner.theory.params import decoder_layer_parameters, stage_layer_range, stage_parameters

    spec = ModelSpec.from_dict(case.spec)
    parallel = ParallelConfig(num_gpus=case.world, tp=case.tp, pp=case.pp, ep=case.ep)
    assert sorted({r["pp_rank"] for r in ranks}) == list(range(case.pp))
    for rank in ranks:
        where = f"{case.name}: rank {rank['rank']} (tp_rank {rank['tp_rank']}, pp_rank {rank['pp_rank']})"
        assert rank["layers"] == stage_layer_range(spec, parallel, rank["pp_rank"]), where
        assert rank["counts"] == stage_parameters(spec, parallel, rank["pp_rank"]).to_dict(), where
        for layer in rank["layers"]:
            theory = decoder_layer_parameters(spec, layer, tp=case.tp, ep=case.ep)
            assert theory == tuple(rank["layer_counts"][str(layer)]), f"{where}: layer {layer}"


# --------------------------------------------------------------------------------------------
# Parent side: launch the ranks.
# --------------------------------------------------------------------------------------------
def _rank_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), src, env.get("PYTHONPATH", "")) if p)
    env.update(
        CUDA_VISIBLE_DEVICES="",
        MASTER_ADDR="127.0.0.1",
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"),
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    return env


def run_worlds(cases: list[McoreCase], workdir: Path, timeout_s: float = 300.0) -> dict[str, list[dict[str, Any]]]:
    """Run every case on its world size (all worlds concurrently); returns {case name: per-rank results}."""
    by_world: dict[int, list[McoreCase]] = {}
    for case in cases:
        by_world.setdefault(case.world, []).append(case)
    procs: list[tuple[subprocess.Popen, Path]] = []
    out_dirs: list[Path] = []
    env = _rank_env()
    try:
        for world, world_cases in sorted(by_world.items()):
            out_dir = workdir / f"world{world}"
            out_dir.mkdir(parents=True, exist_ok=True)
            cases_path = out_dir / "cases.json"
            cases_path.write_text(json.dumps([c.to_dict() for c in world_cases]))
            init_file = out_dir / "rendezvous"
            out_dirs.append(out_dir)
            for rank in range(world):
                log_path = out_dir / f"rank{rank}.log"
                with open(log_path, "w") as log:
                    cmd = [sys.executable, "-m", "tests.mcore_helpers", "--rank", str(rank), "--world", str(world)]
                    cmd += ["--init-file", str(init_file), "--cases", str(cases_path), "--out", str(out_dir)]
                    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                procs.append((proc, log_path))
        deadline = time.monotonic() + timeout_s
        for proc, log_path in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as exc:
                raise RuntimeError(f"rank timed out after {timeout_s}s; log {log_path}:\n{_tail(log_path)}") from exc
            if proc.returncode != 0:
                raise RuntimeError(f"rank exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results: dict[str, list[dict[str, Any]]] = {}
    for out_dir in out_dirs:
        for rank_file in sorted(out_dir.glob("rank*.json")):
            for entry in json.loads(rank_file.read_text()):
                results.setdefault(entry["name"], []).append(entry)
    return results


def _tail(path: Path, n: int = 6000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-n:]


# --------------------------------------------------------------------------------------------
# Rank side: torch / megatron-core are imported only here.
# --------------------------------------------------------------------------------------------
def transformer_config(
    spec: dict[str, Any], tp: int, pp: int, ep: int, etp: int | None, vpp: int | None, pipeline: dict | None = None
):
    """A megatron-core `TransformerConfig` (`MLATransformerConfig` for MLA) equal to the ModelSpec, with the
    uneven-pipeline fields of `pipeline`."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from megatron_autotuner.testbench.operators import activation_function

    if spec.get("softmax_type", "vanilla") != "vanilla" and not torch.cuda.is_available():
        # megatron-core 0.16.1's local DotProductAttention allocates softmax_offset on torch.cuda.current_device()
        # (dot_product_attention.py:132); a CPU build has none, so it goes on the CPU: only its shape is counted
        torch.cuda.current_device = lambda: "cpu"
    moe = spec["num_moe_experts"] > 0
    kwargs: dict[str, Any] = dict(
        num_layers=spec["num_layers"],
        hidden_size=spec["hidden_size"],
        num_attention_heads=spec["num_attention_heads"],
        num_query_groups=spec["num_query_groups"],
        kv_channels=spec["kv_channels"],
        ffn_hidden_size=spec["ffn_hidden_size"],
        gated_linear_unit=spec["gated_linear_unit"],
        activation_func=activation_function(spec["activation"]),
        normalization=spec["normalization"],
        add_bias_linear=spec["add_bias_linear"],
        add_qkv_bias=spec["add_qkv_bias"],
        qk_layernorm=spec["qk_layernorm"],
        hidden_dropout=spec["hidden_dropout"],
        attention_dropout=spec["attention_dropout"],
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp if etp is not None else tp,
        # megatron-core requires sequence parallelism with MoE + TP + EP; see below.
        sequence_parallel=moe and tp > 1 and ep > 1,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        mtp_num_layers=spec["mtp_num_layers"] or None,
        # attention sinks and sliding windows (gpt-oss); the window changes no parameter
        softmax_type=spec.get("softmax_type", "vanilla"),
        window_size=(spec["window_size"] - 1, 0) if spec.get("window_size") else None,
        window_attn_skip_freq=list(spec.get("window_layer_pattern") or ()) or None,
        # gated attention (Qwen3-Next): linear_qkv also projects one gate per head x head dim
        attention_output_gate=spec.get("attention_output_gate", False),
        **(pipeline or {}),
    )
    if any(spec.get("linear_attention_pattern") or ()):
        kwargs.update(
            experimental_attention_variant="gated_delta_net",
            linear_attention_freq=list(spec["linear_attention_pattern"]),
            linear_conv_kernel_dim=spec["linear_conv_kernel_dim"],
            linear_key_head_dim=spec["linear_key_head_dim"],
            linear_value_head_dim=spec["linear_value_head_dim"],
            linear_num_key_heads=spec["linear_num_key_heads"],
            linear_num_value_heads=spec["linear_num_value_heads"],
        )
    if "M" in spec.get("hybrid_layer_pattern", ""):
        kwargs.update(
            mamba_num_heads=spec["mamba_num_heads"],
            mamba_head_dim=spec["mamba_head_dim"],
            mamba_state_dim=spec["mamba_state_dim"],
            mamba_num_groups=spec["mamba_num_groups"],
        )
    if moe:
        kwargs.update(
            num_moe_experts=spec["num_moe_experts"],
            moe_router_topk=spec["moe_router_topk"],
            moe_ffn_hidden_size=spec["moe_ffn_hidden_size"],
            moe_shared_expert_intermediate_size=spec["moe_shared_expert_intermediate_size"] or None,
            moe_shared_expert_gate=spec["moe_shared_expert_gate"],
            moe_layer_freq=list(spec["moe_layer_pattern"]) or 1,
            moe_grouped_gemm=False,
            moe_aux_loss_coeff=0.0,
            moe_router_pre_softmax=spec["moe_router_topk"] == 1,  # megatron-core requires it for top-1
        )
    if spec["multi_latent_attention"]:
        # The TE spec always builds the q / kv latent norms (fused into the up projections); the
        # local spec builds them only with qk_layernorm=True, so ask for them explicitly.
        kwargs.update(
            qk_layernorm=True,
            q_lora_rank=spec["q_lora_rank"],
            kv_lora_rank=spec["kv_lora_rank"],
            qk_head_dim=spec["qk_head_dim"],
            qk_pos_emb_head_dim=spec["qk_pos_emb_head_dim"],
            v_head_dim=spec["v_head_dim"],
            rope_type="rope",
        )
        config = MLATransformerConfig(**kwargs)
    else:
        config = TransformerConfig(**kwargs)
    # The local spec's torch norms refuse sequence parallelism (only TE / apex norms support it).
    # It changes no parameter shape, so switch it off once the config has passed its checks.
    config.sequence_parallel = False
    return config


def _use_mla_core_attention(block_spec) -> None:
    """Let the local MLA spec build: its `DotProductAttention` does not take MLA's k/v head sizes.

    megatron-core 0.16 passes `k_channels` / `v_channels` to the core attention of
    `MLASelfAttention`, which only TE's attention accepts. Core attention holds no parameters, so a
    `DotProductAttention` that drops those keywords changes no count.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)

    for layer_spec in block_spec.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = MLADotProductAttention


def _local_layer_norm_column_parallel_linear():
    """A local stand-in for TE's `TELayerNormColumnParallelLinear`: the input norm's `layer_norm_weight` (and
    `layer_norm_bias` for LayerNorm) of `input_size`, replicated over TP, in front of a `ColumnParallelLinear`."""
    import torch
    import torch.nn.functional as F
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    class LocalLayerNormColumnParallelLinear(ColumnParallelLinear):
        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size, dtype=config.params_dtype))
            self.layer_norm_bias = None
            if config.normalization == "LayerNorm":
                self.layer_norm_bias = torch.nn.Parameter(torch.zeros(input_size, dtype=config.params_dtype))

        def forward(self, input_, *args, **kwargs):
            shape, eps = (input_.shape[-1],), self.config.layernorm_epsilon
            if self.layer_norm_bias is None:
                input_ = F.rms_norm(input_, shape, self.layer_norm_weight, eps)
            else:
                input_ = F.layer_norm(input_, shape, self.layer_norm_weight, self.layer_norm_bias, eps)
            return super().forward(input_, *args, **kwargs)

    return LocalLayerNormColumnParallelLinear


def _experimental_attention_block_spec(config, vp_stage):
    """megatron-core's decoder block spec for experimental attention (gated DeltaNet) with local modules.

    `get_transformer_block_with_experimental_attention_variant_spec` asserts the TE backend: its
    `_get_backend_spec_provider` gets the local provider instead, whose `column_parallel_layer_norm_linear`
    (None locally) is the local fused norm + linear above, so GDN's `in_proj` carries its input norm as with TE;
    its softmax-attention layers take the local GPT layer spec's self-attention (input norm separate, the same
    parameters as TE's fused one). The layer patterns, MoE / dense choice and pipeline slicing stay megatron's.
    """
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt import experimental_attention_variant_module_specs as eav
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    _patch_gated_delta_net_for_cpu()
    fused = _local_layer_norm_column_parallel_linear()

    class LocalBackend(LocalSpecProvider):
        def column_parallel_layer_norm_linear(self):
            return fused

    def self_attention_spec(config, backend=None):
        layer_spec = get_gpt_layer_local_spec(
            qk_layernorm=config.qk_layernorm, qk_l2_norm=config.qk_l2_norm, normalization=config.normalization
        )
        attention = layer_spec.submodules.self_attention
        attention.metainfo["fuse_input_layernorm"] = False
        return attention

    saved = eav._get_backend_spec_provider, eav._get_self_attention_module_spec
    eav._get_backend_spec_provider = lambda config: LocalBackend()
    eav._get_self_attention_module_spec = self_attention_spec
    try:
        return eav.get_transformer_block_with_experimental_attention_variant_spec(config, vp_stage=vp_stage)
    finally:
        eav._get_backend_spec_provider, eav._get_self_attention_module_spec = saved


def _patch_gated_delta_net_for_cpu() -> None:
    """Let megatron-core 0.16.1's `GatedDeltaNet` be constructed on CPU, only to count its parameters.

    Its constructor raises ImportError unless flash-linear-attention (`fla`, whose kernels only its forward
    uses) imported, so the module's HAVE_FLA is set; and it allocates conv1d / dt_bias / A_log on
    `torch.cuda.current_device()`, so without CUDA that returns "cpu". Neither changes a parameter shape; the
    model built here cannot run GDN's forward.
    """
    import torch
    from megatron.core.ssm import gated_delta_net

    gated_delta_net.HAVE_FLA = True
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"


def _local_mamba_stack_spec(num_moe_experts: int):
    """megatron-core 0.16.1's `mamba_layer_specs.mamba_stack_spec` with local modules for its TE ones.

    That spec names TE modules only (TE is not installed here), so each is replaced by the local module with the
    same parameters: TELayerNormColumnParallelLinear (Mamba's in_proj, attention's linear_qkv, the MLP layer's
    linear_fc1) by the local fused norm + ColumnParallelLinear above (`layer_norm_weight` of the input width, the
    linear's weight), TERowParallelLinear by RowParallelLinear, TEDotProductAttention by DotProductAttention (no
    parameters), TENorm (the MoE layer's pre_mlp_layernorm) by WrappedTorchNorm, and the TE grouped-GEMM MoE spec
    by the local one (SequentialMLP: the same fc1 / fc2 per expert; router and shared expert alike). The layer
    classes, the MambaMixer and how MambaStack places them are megatron-core's own.
    """
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.tensor_parallel.layers import RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import (
        MoETransformerLayer,
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    fused = _local_layer_norm_column_parallel_linear()
    moe_layer = None
    if num_moe_experts:
        moe = get_moe_module_spec(use_te=False, num_experts=num_moe_experts, moe_grouped_gemm=False)
        moe_layer = ModuleSpec(
            module=MoETransformerLayer,
            submodules=TransformerLayerSubmodules(
                pre_mlp_layernorm=WrappedTorchNorm, mlp=moe, mlp_bda=get_bias_dropout_add
            ),
        )
    mixer = ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(in_proj=fused, out_proj=RowParallelLinear))
    attention = ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=fused, core_attention=DotProductAttention, linear_proj=RowParallelLinear
        ),
    )
    submodules = MambaStackSubmodules(
        mamba_layer=ModuleSpec(
            module=MambaLayer, submodules=MambaLayerSubmodules(mixer=mixer, mamba_bda=get_bias_dropout_add)
        ),
        attention_layer=ModuleSpec(
            module=TransformerLayer,
            submodules=TransformerLayerSubmodules(self_attention=attention, self_attn_bda=get_bias_dropout_add),
        ),
        mlp_layer=ModuleSpec(
            module=MLPLayer,
            submodules=TransformerLayerSubmodules(
                mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=fused, linear_fc2=RowParallelLinear)),
                mlp_bda=get_bias_dropout_add,
            ),
        ),
    )
    if moe_layer is not None:
        submodules.moe_layer = moe_layer
    return ModuleSpec(module=MambaStack, submodules=submodules)


def _patch_mamba_for_cpu() -> None:
    """Let megatron-core 0.16.1's `MambaMixer` and `MambaStack` be constructed on CPU without mamba_ssm, einops or
    TE, only to count their parameters; the model built here cannot run a forward.

    - `MambaMixer.__init__` (and the `MambaContextParallel` it makes, which holds no parameters) raise ImportError
      unless mamba_ssm (its scan / conv kernels, used only in forward) and einops (forward only) imported: their
      HAVE_MAMBA_SSM / HAVE_EINOPS are set.
    - Its gated norm `ExtendedRMSNorm` subclasses mamba_ssm's `layernorm_gated.RMSNorm`, a MagicMock without
      mamba_ssm: it is replaced by a module with that class's parameters, a `weight` of `hidden_size` (mamba_ssm
      registers its bias as None).
    - conv1d, dt_bias, A_log, D and the norm are allocated on `torch.cuda.current_device()`: "cpu" without CUDA.
      Their initial values are drawn inside `get_cuda_rng_tracker().fork()`, whose CUDA RNG state is never added
      on CPU (model_parallel_cuda_manual_seed needs CUDA): MambaMixer's tracker forks into a null context, which
      changes only the random initial values.
    - MambaStack builds its final norm as TENorm directly (not from the spec), which raises without TE: it gets
      WrappedTorchNorm, the same `weight` (and `bias` for LayerNorm) of hidden_size.
    - mamba_mixer.py imports three Triton kernels of megatron's inference contexts (attention_context/triton/
      tensor_ops.py, `import triton` at its top; used only by MambaMixer's dynamic-batching inference paths):
      without triton (the CPU torch wheel has none) that module is stood in for by one whose functions raise.
    """
    import contextlib
    import importlib.util
    import sys
    import types

    import torch

    if importlib.util.find_spec("triton") is None:
        name = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"

        def inference_only(*args, **kwargs):
            raise RuntimeError("triton is not installed: MambaMixer's inference state updates cannot run")

        stand_in = types.ModuleType(name)
        stand_in.tensor_get_slice_after = stand_in.tensor_masked_update = stand_in.tensor_merge = inference_only
        sys.modules.setdefault(name, stand_in)

    from megatron.core.ssm import mamba_block, mamba_context_parallel, mamba_mixer
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    class RMSNormGatedParameters(torch.nn.Module):
        def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
            self.register_parameter("bias", None)

    class NoForkRNGTracker:
        def fork(self, *args, **kwargs):
            return contextlib.nullcontext()

    mamba_mixer.get_cuda_rng_tracker = NoForkRNGTracker
    mamba_mixer.HAVE_MAMBA_SSM = True
    mamba_mixer.HAVE_EINOPS = mamba_context_parallel.HAVE_EINOPS = True
    mamba_mixer.ExtendedRMSNorm = RMSNormGatedParameters
    mamba_block.TENorm = WrappedTorchNorm
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"


def build_mamba_model(spec: dict[str, Any], config, padded_vocab_size: int | None = None):
    """This pipeline rank's megatron-core `MambaModel` (no virtual stages: MambaStack refuses them), built with
    `hybrid_override_pattern` as Megatron-LM's `mamba_builders` does."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.mamba import MambaModel

    _patch_mamba_for_cpu()
    return MambaModel(
        config=config,
        mamba_stack_spec=_local_mamba_stack_spec(spec["num_moe_experts"]),
        vocab_size=padded_vocab_size or spec["vocab_size"],
        max_sequence_length=spec["max_position_embeddings"],
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        hybrid_override_pattern=spec["hybrid_layer_pattern"],
        share_embeddings_and_output_weights=spec["tie_embeddings"],
        position_embedding_type=spec["position_embedding_type"],
    )


def _decoder_layer_indices(chunk) -> list[int]:
    """Global 0-based indices of a chunk's decoder layers, in order. A GPT layer's `layer_number` is global
    (1-based); MambaStack numbers its MLP / attention / MoE layers within the stage, so its layers are located by
    its own pipeline split (`_select_layers_for_pipeline_parallel` slices the list it is given)."""
    decoder = chunk.decoder
    if hasattr(decoder, "layer_type_list"):  # MambaStack
        indices = list(range(decoder.config.num_layers))
        if decoder.pp_group.size() > 1:
            _, indices = decoder._select_layers_for_pipeline_parallel(indices)
        assert len(indices) == len(decoder.layers)
        return indices
    return [layer.layer_number - 1 for layer in decoder.layers]


def build_gpt_chunks(spec: dict[str, Any], config, padded_vocab_size: int | None = None) -> list:
    """The `GPTModel` chunk(s) of this pipeline rank (one per virtual stage), local layer spec."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )

    if spec.get("hybrid_layer_pattern"):
        return [build_mamba_model(spec, config, padded_vocab_size)]
    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for vp_stage in range(vpp) if vpp else [None]:
        if config.experimental_attention_variant is not None:
            block_spec = _experimental_attention_block_spec(config, vp_stage)
        else:
            block_spec = get_gpt_decoder_block_spec(
                config, use_transformer_engine=False, normalization=spec["normalization"], vp_stage=vp_stage
            )
        if spec["multi_latent_attention"]:
            _use_mla_core_attention(block_spec)
        mtp_spec = None
        if spec["mtp_num_layers"]:
            # the MTP layer is shaped like the model's last decoder layer; a chunk that holds no decoder layer (a
            # layout stage such as "mL") gets that layer's spec on its own, as Megatron-LM's model provider does
            layer_for_mtp = block_spec
            if not block_spec.layer_specs:
                last_is_moe = spec["num_moe_experts"] and (
                    not spec["moe_layer_pattern"] or spec["moe_layer_pattern"][-1]
                )
                layer_for_mtp = get_gpt_layer_local_spec(
                    num_experts=spec["num_moe_experts"] if last_is_moe else None,
                    qk_layernorm=spec["qk_layernorm"],
                    multi_latent_attention=spec["multi_latent_attention"],
                    normalization=spec["normalization"],
                )
            mtp_spec = get_gpt_mtp_block_spec(config, layer_for_mtp, use_transformer_engine=False, vp_stage=vp_stage)
        chunks.append(
            GPTModel(
                config=config,
                transformer_layer_spec=block_spec,
                vocab_size=padded_vocab_size or spec["vocab_size"],
                max_sequence_length=spec["max_position_embeddings"],
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                share_embeddings_and_output_weights=spec["tie_embeddings"],
                position_embedding_type=spec["position_embedding_type"],
                mtp_block_spec=mtp_spec,
                vp_stage=vp_stage,
            )
        )
    return chunks


def count_parameters(chunks: list) -> dict[str, Any]:
    """Per-rank counts by component (the `ParameterCounts` fields) plus totals and megatron's expert marker."""
    counts = dict.fromkeys(COUNT_FIELDS, 0)
    other: dict[str, int] = {}
    total = marked_expert = 0
    # {global 0-based layer index: [dense, expert]} (json keys are strings)
    layer_counts: dict[str, list[int]] = {}
    shapes: dict[str, list[int]] = {}
    for vp, chunk in enumerate(chunks):
        for index, layer in zip(_decoder_layer_indices(chunk), chunk.decoder.layers, strict=True):
            per_layer = layer_counts.setdefault(str(index), [0, 0])
            for name, param in layer.named_parameters():
                per_layer[1 if name.startswith("mlp.experts.") else 0] += param.numel()
        for name, param in chunk.named_parameters():
            shapes[f"chunk{vp}.{name}" if len(chunks) > 1 else name] = list(param.shape)
        for name, param in chunk.named_parameters():
            n = param.numel()
            total += n
            if getattr(param, "allreduce", True) is False:
                marked_expert += n
            routed = ".mlp.experts." in name
            if name.startswith("embedding."):
                counts["embedding"] += n
            elif name.startswith("output_layer."):
                counts["output_layer"] += n
            elif name.startswith(("decoder.final_layernorm.", "decoder.final_norm.")):  # GPT / MambaStack
                counts["final_norm"] += n
            elif name.startswith("decoder.layers."):
                counts["expert" if routed else "decoder_dense"] += n
            elif name.startswith("mtp."):
                counts["mtp_expert" if routed else "mtp_dense"] += n
            else:
                other[name] = n
    counts["dense"] = sum(counts[k] for k in COUNT_FIELDS if k not in ("expert", "mtp_expert"))
    counts["experts"] = counts["expert"] + counts["mtp_expert"]
    counts["total"] = total
    return {
        "counts": counts,
        "marked_expert": marked_expert,
        "other": other,
        "layer_counts": layer_counts,
        "shapes": shapes,
    }


def _run_case(case: dict[str, Any]) -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    tp, pp, ep, etp, vpp = case["tp"], case["pp"], case["ep"], case["etp"], case["vpp"]
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        create_gloo_process_groups=False,
    )
    try:
        config = transformer_config(case["spec"], tp, pp, ep, etp, vpp, case.get("pipeline"))
        chunks = build_gpt_chunks(case["spec"], config, case["padded_vocab_size"])
        result = count_parameters(chunks)
        result.update(
            tp_rank=ps.get_tensor_model_parallel_rank(),
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            ep_rank=ps.get_expert_model_parallel_rank(),
            num_chunks=len(chunks),
            # global 0-based indices of the decoder layers this rank holds
            layers=sorted(index for chunk in chunks for index in _decoder_layer_indices(chunk)),
        )
        return result
    finally:
        ps.destroy_model_parallel()


def _patch_for_cpu_without_te() -> None:
    """Work around megatron-core 0.16 code paths that assume CUDA or TE; none changes a parameter shape."""
    import torch
    from megatron.core.extensions import transformer_engine as te_extension
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer import multi_latent_attention

    if not torch.cuda.is_available():
        # GPTModel.setup_embeddings_and_output_layer moves the duplicated (tied / MTP) word embeddings
        # of a later pipeline stage to CUDA before all-reducing them (`weight.data.cuda()`); make
        # `.cuda()` a no-op so the real gloo all-reduce still runs.
        torch.Tensor.cuda = lambda self, *args, **kwargs: self

        # MLASelfAttention builds its RotaryEmbedding without `use_cpu_initialization`, which then asks
        # for `torch.cuda.current_device()`. The rotary table is a buffer (no parameters): build it on CPU.
        class CPURotaryEmbedding(RotaryEmbedding):
            def __init__(self, *args, **kwargs):
                kwargs["use_cpu_initialization"] = True
                super().__init__(*args, **kwargs)

        multi_latent_attention.RotaryEmbedding = CPURotaryEmbedding

    if not te_extension.HAVE_TE:
        # Without TE, megatron.core.extensions.transformer_engine exports MagicMocks, so MLA's
        # `try: import TELinear` succeeds, sets HAVE_TE = True and `isinstance(x, TELinear)` then fails.
        multi_latent_attention.HAVE_TE = False


def _worker(rank: int, world: int, init_file: str, cases_path: str, out_dir: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    _patch_for_cpu_without_te()
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    results = []
    try:
        for case in json.loads(Path(cases_path).read_text()):
            entry: dict[str, Any] = {"name": case["name"], "rank": rank}
            try:
                entry.update(_run_case(case))
            except Exception:  # recorded so the test shows megatron-core's own error
                entry["error"] = traceback.format_exc()
            results.append(entry)
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results, indent=1))
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    _worker(args.rank, args.world, args.init_file, args.cases, args.out)


if __name__ == "__main__":
    main()
