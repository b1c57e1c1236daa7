"""Predicted vs published throughput of the modern NVIDIA pre-training runs, through the Megatron-LM flag importer.

    python benchmarks/published_modern.py [--csv CSV] [--output PATH] [--json]

Every row of `tests/fixtures/published_runs_modern.csv` (see tests/fixtures/published_runs_README.md) is written
as the Megatron-LM flags a user would launch it with, then imported exactly as `mat estimate --megatron-args`
does (`read_launch` -> `launch_to_specs` -> `estimate`), with the default efficiencies: nothing is fitted to
these rows. A row is *expressible* when import and estimate succeed; `not_modelled` lists the flags the
importer reads but the cost model does not model yet (CUDA graphs, FSDP, flex dispatchers, fp4, mxfp8 ...).

The comparison is on tokens/s per GPU (global batch x seq / step time / GPUs), which has no FLOPs convention.
Model TFLOP/s per GPU is predicted beside the published figure under the row's convention (causal attention
for Megatron-Bridge rows and the dgxc rows whose formula halves attention, full attention for NeMo and the
other dgxc rows); sources differ in their FLOPs formulas, so that column is context, not the comparison.

What a row leaves open is filled from what NVIDIA's recipes do, the same for every row (each filled value
is listed in the record's `assumptions`):
- distributed optimizer with grad-reduce / param-gather overlap; sequence parallelism when tp > 1; TP
  communication overlap when tp > 1 unless the row's notes say `tp_comm_overlap=False`; fused cross entropy
  (TE's kernel on Megatron-Bridge rows, as its performance scripts set it; megatron-core's native one elsewhere);
  MoE: grouped GEMMs, fused permute, the alltoall dispatcher when the row names none;
- bf16 gradient reduction for Megatron-Bridge rows and NeMo 2.0 fp8 rows (their `grad_reduce_in_fp32=False`);
- fp8 recipe: FP8-CS tensorwise (with fp8 parameters for Megatron-Bridge, its `fp8_cs` precision); FP8-MX /
  MXFP8 mxfp8; plain "FP8" delayed on dgxc / NeMo rows, and on Megatron-Bridge rows the recipe named by the
  row's config reference (tensorwise when it names none: Bridge's performance default);
- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True except on B200 (NeMo 2.0 / Megatron-Bridge launchers);
- etp 1 for Megatron-Bridge MoE rows with tp > 1 that state none (its MoE recipes set it; Megatron's default is tp);
- embedding and loss accounting in the pipeline split when the row states no split and its layers only divide
  into the pipeline stages that way (126 layers on pp 8: the only split Megatron-LM accepts).
Architecture traits the CSV columns do not hold (normalisation, biases, tied embeddings, position embedding,
qk-layernorm, MLA ranks, sliding windows) come from the row's `hf_config_family`.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import json
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.errors import ConfigError, SpecNotFoundError
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.loader import preset_names
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch

ROOT = Path(__file__).resolve().parent.parent
CSV_PATH = ROOT / "tests/fixtures/published_runs_modern.csv"
OUT_PATH = ROOT / "benchmarks/results/published_modern.json"

# CSV GPU name -> the tool's preset name (looked up with get_gpu_spec; a missing preset: not expressible)
GPU_PRESET_NAMES = {"H100": "H100-SXM", "B200": "B200", "GB200": "GB200"}
GPU_GROUPS = ("H100", "B200", "GB200")
# dgxc's NeMo-1 Grok-1 proxy (the tables of grok1/README_314b.md, tags v24.11.1 to v25.04.02) runs
# grok1/grok1_314b.yaml through configure.sh, which the rows' columns do not carry: moe_grouped_gemm false (one GEMM per
# expert), no moe_permute_fusion, moe_pad_expert_input_to_capacity true with moe_expert_capacity_factor 1.0 (its
# dropout: `source_dropout`); configure.sh sets model.ub_tp_comm_overlap=true (NVIDIA/dgxc-benchmarking@v24.11.1 and
# @v25.02, grok1/). From v25.05 the tables (grok1/README.md) come from NeMo 2's
# scripts/performance/llm/pretrain_grok1_314b, not this yaml.
DGXC_NEMO1_GROK_TABLES = "grok1/README_314b.md"
DGXC_NEMO1_GROK_FLAGS = (
    "--moe-expert-capacity-factor 1.0",
    "--moe-pad-expert-input-to-capacity",
)

# The rows' model configs set hidden and attention dropout, which the CSV columns do not carry (Megatron-LM's default,
# 0.1 each, is not what these runs had): 0.0 in every source but NeMo 1's GPT-3 175B yaml. Megatron-Bridge: the model
# providers / bridges (llama_provider.py LlamaModelProvider, deepseek_provider.py, gpt_oss_provider.py,
# qwen_provider.py Qwen3MoEModelProvider, mamba_provider.py / hybrid_provider.py; from v0.4.0 AutoBridge copies the HF
# config's attention_dropout, 0.0, and each bridge sets hidden_dropout 0.0: model_bridge.py CONFIG_MAPPING,
# llama_bridge.py, qwen3_moe_bridge.py, gpt_oss_bridge.py, deepseek_v3_bridge.py @ r0.1.0 .. v0.6.0); NeMo 2
# (nemo/collections/llm/gpt/model llama.py LlamaConfig / Llama3Config, mixtral.py, nemotron.py, base.py
# GPTConfig175B, deepseek.py, ssm.py @ v2.2.0 .. v2.4.0, and the commits dgxc v25.04 / v25.05 pin); NeMo 1 yaml
# (NeMo-Framework-Launcher 24.07 .. 24.12 conf/training llama3_1_*, nemotron_*, mixtral_8x7b, grok1_proxy; dgxc
# v24.11.1 / v25.02 llama3.1/*.yaml, nemotron/*.yaml, grok1/grok1_314b.yaml). GPT-3 175B's NeMo 1 yaml keeps 0.1
# (dgxc nemo_megatron/gpt3_175b_hydra.yaml, Launcher conf/training/gpt3/175b.yaml).
DROPOUT_0_1_TABLES = ("nemo_megatron/README_175b.md",)


def source_dropout(row: dict[str, str]) -> float:
    """Hidden and attention dropout of the row's run (`DROPOUT_0_1_TABLES` and the sources above)."""
    return 0.1 if any(table in row["source"] for table in DROPOUT_0_1_TABLES) else 0.0


# Architecture traits by `hf_config_family` (first match wins); the CSV columns do not hold them.
_LLAMA_LIKE = {"norm": "RMSNorm", "bias": False, "tied": False, "pos": "rope", "qk_norm": False}
FAMILIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Qwen3Moe", {**_LLAMA_LIKE, "qk_norm": True}),
    ("DeepseekV3", {**_LLAMA_LIKE, "qk_norm": True}),
    ("GptOss", {**_LLAMA_LIKE, "bias": True}),
    ("NemotronH", {**_LLAMA_LIKE, "pos": "none"}),
    ("Nemotron-4", {**_LLAMA_LIKE, "norm": "LayerNorm"}),
    ("GPT-3", {"norm": "LayerNorm", "bias": True, "tied": True, "pos": "learned_absolute", "qk_norm": False}),
    ("", _LLAMA_LIKE),  # Llama, Grok-1 and anything else
)


def _int(text: str) -> int | None:
    """The leading integer of a cell ("1 (intermediate 3712)" -> 1), None when blank."""
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def is_moe(row: dict[str, str]) -> bool:
    experts = _int(row["num_experts"])
    return bool(experts) if experts is not None else (_int(row["ep"]) or 1) > 1


def is_bridge(row: dict[str, str]) -> bool:
    return row["source"].startswith("NVIDIA-NeMo/Megatron-Bridge")


def flops_convention(row: dict[str, str]) -> str:
    """causal or full: how the row's source counts attention FLOPs."""
    text = row["flops_convention"]
    if text.startswith("MB") or "[CAUSAL]" in text or "= causal" in text:
        return "causal"
    return "full"


def layout_label(row: dict[str, str]) -> str:
    parts = [f"tp{row['tp'] or 1}", f"pp{row['pp'] or 1}", f"cp{row['cp'] or 1}"]
    if is_moe(row):
        parts += [f"ep{row['ep'] or 1}", f"etp{row['etp'] or '-'}"]
    parts += [f"vpp{row['vpp'] or 1}", f"mbs{row['micro_batch']}", f"gbs{row['global_batch']}"]
    return " ".join(parts)


def _fp8_recipe(row: dict[str, str]) -> tuple[str | None, str | None]:
    """(Megatron-LM --fp8-recipe or None, assumption text or None) of the row's precision."""
    p = row["precision"].upper()
    if p.startswith("BF16") or p.startswith("NVFP4"):
        return None, None
    if p.startswith("FP8-CS"):
        return "tensorwise", None
    if p.startswith("FP8-MX") or p.startswith("MXFP8"):
        return "mxfp8", None
    if p.startswith("FP8-DS"):
        return "delayed", None
    if p.startswith("FP8 VARIANT"):
        return "mxfp8", "fp8 recipe: the row's 'likely MXFP8' variant taken as mxfp8"
    if is_bridge(row):
        ref = re.search(r"_FP8_(CS|MX|DS)_", row["notes"])
        if ref:
            return {"CS": "tensorwise", "MX": "mxfp8", "DS": "delayed"}[ref.group(1)], None
        return "tensorwise", "fp8 recipe: not stated, Megatron-Bridge's fp8_cs (tensorwise) assumed"
    return "delayed", None


def _mla_flags(family: str) -> list[str]:
    m = re.search(r"q_lora=(\d+) kv_lora=(\d+) qk_nope=(\d+) qk_rope=(\d+) v_head=(\d+)", family)
    if not m:
        return []
    q, kv, nope, rope, v = m.groups()
    return [
        "--multi-latent-attention",
        f"--q-lora-rank {q}",
        f"--kv-lora-rank {kv}",
        f"--qk-head-dim {nope}",
        f"--qk-pos-emb-head-dim {rope}",
        f"--v-head-dim {v}",
    ]


def with_preset_shape(row: dict[str, str]) -> dict[str, str] | None:
    """The row with the shape of the tool's preset of its model (by its exact name) where the source gives none (the
    published NeMo Mixtral-8x7B rows): the layers, widths and experts of the model's public HF config. None where the
    row has a shape or no preset has the name."""
    if row["hidden"] or row["model"] not in preset_names():
        return None
    spec = load_model_spec(row["model"])
    shape = {
        "hidden": spec.hidden_size, "layers": spec.num_layers, "heads": spec.num_attention_heads,
        "query_groups": spec.num_query_groups, "head_dim": spec.kv_channels, "ffn": spec.ffn_hidden_size,
        "vocab": spec.vocab_size, "gated": "yes" if spec.gated_linear_unit else "no", "activation": spec.activation,
    }  # fmt: skip
    if spec.is_moe:
        shape.update(num_experts=spec.num_moe_experts, top_k=spec.moe_router_topk, moe_ffn=spec.moe_ffn_hidden_size)
    return {**row, **{k: str(v) for k, v in shape.items()}}


def row_launch(row: dict[str, str]) -> tuple[str, list[str], str | None]:
    """(Megatron-LM launch text, assumptions, reason the row cannot be written) of one CSV row."""
    flags: list[str] = []
    assumptions: list[str] = []
    reason = None
    shaped = with_preset_shape(row)
    if shaped is not None:
        row = shaped
        assumptions.append(f"model shape: not in the source, the tool's {row['model']} preset (its HF config)")
    family = row["hf_config_family"]
    traits = next(t for key, t in FAMILIES if key in family)
    moe = is_moe(row)
    layers = _int(row["layers"])
    has_shape = bool(row["hidden"] and row["layers"] and row["heads"])
    if not has_shape:
        reason = "no model shape in the source"

    # model shape
    if has_shape:
        flags += [f"--num-layers {layers}", f"--hidden-size {row['hidden']}"]
        if row["ffn"]:
            flags.append(f"--ffn-hidden-size {row['ffn']}")
        flags.append(f"--num-attention-heads {row['heads']}")
        mla = _mla_flags(family)
        if mla:
            flags += mla
        else:
            if row["query_groups"] and row["query_groups"] != row["heads"]:
                flags += ["--group-query-attention", f"--num-query-groups {row['query_groups']}"]
            if row["head_dim"]:
                flags.append(f"--kv-channels {row['head_dim']}")
        activation = row["activation"].lower()
        clamp = re.search(r"clamp ([0-9.]+)", activation)
        if row["gated"] == "yes" and activation.startswith("quick_gelu"):
            # gpt-oss's GLU as Megatron-LM writes it (Megatron-Bridge GPTOSSProvider: quick_geglu, glu_linear_offset 1,
            # activation_func_clamp_value from the row)
            flags += ["--quick-geglu", "--glu-linear-offset 1.0"]
            if clamp:
                flags.append(f"--activation-func-clamp-value {clamp.group(1)}")
        elif row["gated"] == "yes":
            flags.append("--swiglu")
            if not activation.startswith("silu"):
                assumptions.append(f"activation {row['activation']} written as --swiglu (same GEMM shapes)")
        elif "squared" in activation:
            flags.append("--squared-relu")
        if traits["norm"] != "LayerNorm":
            flags.append(f"--normalization {traits['norm']}")
        if not traits["bias"]:
            flags.append("--disable-bias-linear")
        if traits["qk_norm"]:
            flags.append("--qk-layernorm")
        if not traits["tied"]:
            flags.append("--untie-embeddings-and-output-weights")
        if traits["pos"] != "learned_absolute":
            flags.append(f"--position-embedding-type {traits['pos']}")
        if "sliding window 128" in family:
            flags += ["--window-size 128,0", "--window-attn-skip-freq 2"]
        if "softmax sinks" in family:
            flags.append("--softmax-type learnable")
        if "hybrid pattern" in family:
            pattern = re.search(r"hybrid pattern ([ME*\-]{4,})", family)
            if pattern is None:
                reason = "hybrid Mamba model: its layer pattern is not in the source"
            else:
                flags.append(f"--hybrid-layer-pattern {shlex.quote(pattern.group(1))}")
            mamba = re.search(r"mamba heads (\d+) x head_dim (\d+), state (\d+), groups (\d+)", family)
            if mamba:
                h, d, s, g = mamba.groups()
                flags += [f"--mamba-num-heads {h}", f"--mamba-head-dim {d}", f"--mamba-state-dim {s}"]
                flags.append(f"--mamba-num-groups {g}")
        if row["vocab"]:
            flags.append(f"--vocab-size {row['vocab']}")
        if "1 MTP layer counted" in row["flops_convention"]:
            flags.append("--mtp-num-layers 1")
    if moe and _int(row["num_experts"]):
        flags += [f"--num-experts {row['num_experts']}", f"--moe-router-topk {row['top_k']}"]
        moe_ffn = _int(row["moe_ffn"])
        if moe_ffn:
            flags.append(f"--moe-ffn-hidden-size {moe_ffn}")
        shared = row["shared_experts"]
        explicit = re.search(r"intermediate (\d+)", shared)
        shared_size = int(explicit.group(1)) if explicit else (_int(shared) or 0) * (moe_ffn or 0)
        if shared_size:
            flags.append(f"--moe-shared-expert-intermediate-size {shared_size}")
        k = _int(row["first_k_dense"]) or 0
        if k and layers:
            flags.append(f"--moe-layer-freq {shlex.quote(f'[0]*{k}+[1]*{layers - k}')}")
        if "force-balanced" in row["notes"]:
            flags.append("--moe-router-force-load-balancing")

    # parallelism
    tp, pp, cp, ep = (_int(row[k]) or 1 for k in ("tp", "pp", "cp", "ep"))
    flags += [f"--tensor-model-parallel-size {tp}", f"--pipeline-model-parallel-size {pp}"]
    if cp > 1:
        flags.append(f"--context-parallel-size {cp}")
    if moe:
        flags.append(f"--expert-model-parallel-size {ep}")
        if row["etp"]:
            flags.append(f"--expert-tensor-parallel-size {row['etp']}")
        elif is_bridge(row) and tp > 1:
            flags.append("--expert-tensor-parallel-size 1")
            assumptions.append("etp: not stated, 1 (Megatron-Bridge's MoE recipes)")
    layout = row["pipeline_layout"]
    quoted = re.search(r"pipeline_model_parallel_layout='([^']+)'", layout)
    layout_string = quoted.group(1) if quoted else None
    if "[E+4 | 4x14 | 1+MTP+L]" in layout:  # the recipe's layout_map, as Megatron's layout string
        layout_string = "Et*4|(t*4|)*14tmL"
    if layout_string is not None:
        flags.append(f"--pipeline-model-parallel-layout {shlex.quote(layout_string)}")
    else:
        vpp = _int(row["vpp"]) or 1
        if vpp > 1:
            flags.append(f"--num-virtual-stages-per-pipeline-rank {vpp}")
        account = layout.startswith("account_for_embedding_in_pipeline_split=True")
        stages = pp * vpp
        if not layout and layers and layers % stages and (layers + 2) % stages == 0:
            account = True  # the only even split Megatron-LM allows for these layers (e.g. 126 on pp8)
            assumptions.append(f"pipeline split: not stated, {layers} layers + embedding + loss over {stages} stages")
        if account:
            flags += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    if tp > 1:
        flags.append("--sequence-parallel")
        if "tp_comm_overlap=False" not in row["notes"]:
            flags.append("--tp-comm-overlap")
            if "tp_comm_overlap" not in row["notes"]:
                assumptions.append("TP communication overlap: not stated, on (NVIDIA recipes with tp > 1)")
    flags += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if row["fsdp"].startswith("megatron_fsdp") or row["fsdp"].startswith("FSDP column="):
        flags.append("--use-megatron-fsdp")
        if "optim_grads_params" in row["fsdp"]:
            flags.append("--data-parallel-sharding-strategy optim_grads_params")
        if "fsdp_double_buffer" in row["fsdp"]:
            flags.append("--fsdp-double-buffer")

    # workload
    flags += [
        f"--micro-batch-size {row['micro_batch']}",
        f"--global-batch-size {row['global_batch']}",
        f"--seq-length {row['seq_len']}",
    ]
    recompute = row["recompute"]
    if recompute.startswith("selective"):
        flags.append("--recompute-granularity selective")
        modules = re.match(r"selective:([a-z_+]+)", recompute)
        if modules:
            flags.append("--recompute-modules " + " ".join(modules.group(1).split("+")))
    offload = re.search(r"cpu_offloading_num_layers=(\d+)", recompute)
    if offload:
        flags.append(f"--cpu-offloading-num-layers {offload.group(1)}")

    # precision
    flags.append("--bf16")
    recipe, note = _fp8_recipe(row)
    if note:
        assumptions.append(note)
    if recipe is not None:
        flags += ["--fp8-format hybrid", f"--fp8-recipe {recipe}"]
        if recipe == "tensorwise" and is_bridge(row):
            flags.append("--fp8-param-gather")
    if row["precision"].upper().startswith("NVFP4"):
        flags.append("--fp4-format e2m1")
    nemo2 = bool(re.search(r"NeMo (2\.0|25\.)", row["source"] + " " + row["notes"]))
    if is_bridge(row) or (nemo2 and recipe is not None):
        flags.append("--grad-reduce-in-bf16")
    dropout = source_dropout(row)
    flags += [f"--hidden-dropout {dropout:g}", f"--attention-dropout {dropout:g}"]

    # MoE execution
    if moe:
        dispatcher = row["dispatcher"]
        if dispatcher.startswith("flex/"):
            backend = dispatcher.split(";")[0].split("/")[1].strip()
            flags += ["--moe-token-dispatcher-type flex", f"--moe-flex-dispatcher-backend {backend}"]
        else:
            flags.append("--moe-token-dispatcher-type alltoall")
            if not dispatcher:
                assumptions.append("MoE dispatcher: not stated, alltoall assumed")
        if "moe_a2a_overlap=True" in dispatcher:
            flags += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
        if "token-drop" in dispatcher:
            flags += ["--moe-expert-capacity-factor 1.0", "--moe-pad-expert-input-to-capacity"]
        if DGXC_NEMO1_GROK_TABLES in row["source"]:
            flags += list(DGXC_NEMO1_GROK_FLAGS)  # nor moe_permute_fusion (megatron-core's default: off)
            assumptions.append(
                "grok1_314b.yaml as dgxc ran it (padded to capacity 1.0, one GEMM per expert, no permute fusion); "
                "megatron-core 0.9 / 0.10's padded permute priced as today's unfused one"
            )
        else:
            flags += ["--moe-grouped-gemm", "--moe-permute-fusion"]

    # CUDA graphs
    graph = row["cuda_graph"]
    impl = re.match(r"(transformer_engine|local|full_iteration)\b", graph)
    if impl:
        flags.append(f"--cuda-graph-impl {impl.group(1)}")
        scope = re.search(r"scope=([a-z_+]+)", graph)
        if scope:
            flags.append("--cuda-graph-scope " + " ".join(scope.group(1).split("+")))
        if impl.group(1) == "full_iteration" or (scope and scope.group(1) == "full_iteration"):
            # Bridge turns the NaN check off for full-iteration graphs (scripts/performance/utils/overrides.py
            # _set_cuda_graph_overrides @ Megatron-Bridge 067f987); Megatron-LM requires it (validate_args)
            flags.append("--no-check-for-nan-in-loss-and-grad")
    elif graph == "cuda_graphs=True":
        flags.append("--cuda-graph-impl local")
    elif not graph and "token-drop" in row["dispatcher"]:
        # NeMo's performance scripts (25.09) pair the token-drop callback with their recommended configs'
        # enable_cuda_graph, megatron-core's full-layer graphs, which capture a MoE layer only when it drops and pads;
        # NeMo's model_configs_gb200.csv holds the published Qwen3-235B token-drop layout (tp2 pp1 ep64 mbs1 gbs1024
        # on 64 GPUs) with cuda_graphs=1 (NVIDIA/NeMo@06c0e70 scripts/performance/recommended_model_configs)
        flags.append("--cuda-graph-impl local")
        assumptions.append("CUDA graphs: not stated on a token-drop row, full-layer (NeMo's recommended configs)")
    flags.append("--cross-entropy-loss-fusion")
    if is_bridge(row):
        # Megatron-Bridge's performance scripts run TE's cross-entropy kernel (scripts/performance/utils/overrides.py
        # @ Megatron-Bridge 067f987 sets cross_entropy_fusion_impl "te"); other launchers keep Megatron-LM's native
        flags.append("--cross-entropy-fusion-impl te")

    env = ""
    if row["gpu"] != "B200":
        env = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NCCL_GRAPH_REGISTER=0\n"
    return env + " \\\n".join(flags) + "\n", assumptions, reason


def caveats(row: dict[str, str]) -> list[str]:
    """What the row's source says that no flag can (from its notes and columns)."""
    notes, out = row["notes"], []
    if "PROXY config" in notes:
        out.append("dgxc proxy config (model truncated)")
    if "LoRA" in row["flops_convention"] or "LoRA" in notes:
        out.append("LoRA fine-tuning (frozen base weights), predicted as full training")
    elif "SFT" in row["model"] or "SFT" in notes:
        out.append("SFT on packed sequences, predicted as pre-training")
    if "token-drop" in row["dispatcher"]:
        out.append("token-drop MoE")
    if "hybrid pattern" in row["hf_config_family"]:
        out.append("hybrid Mamba model")
    if "CONFIG MISMATCH" in notes:
        out.append("published layout differs from the recipe file")
    if "look quantized" in notes:
        out.append("tokens/s rounded by the source (prefer TFLOP/s)")
    if _source_step_tokens_per_s(row) is not None:
        out.append("tokens/s disagrees with the source's own step time at its global batch; compared on the step time")
    return out


# a source's tokens/s and its step time at the stated global batch agree to rounding (79 of the 80 rows that state
# both agree within 1%)
STEP_TIME_AGREEMENT = 0.03


def _source_step_tokens_per_s(row: dict[str, str]) -> float | None:
    """Tokens/s per GPU from the step time the row's source states (global batch x sequence / step / GPUs), where it
    disagrees with the source's tokens/s by more than `STEP_TIME_AGREEMENT`; else None. The dgxc Grok1 512-GPU GB200
    column states 5.193 s at global batch 1024 (the 128-GPU column's weak-scaled step, 5.298 s at 256, at the same
    MFU) but half the tokens/s that gives: one of them is wrong, and the step time is the one measured."""
    step = re.search(r"step_time=([\d.]+)s", row["notes"])
    published = _float(row["tokens_per_s_per_gpu"])
    if step is None or not published:
        return None
    from_step = int(row["global_batch"]) * int(row["seq_len"]) / float(step.group(1)) / int(row["num_gpus"])
    return from_step if abs(from_step / published - 1) > STEP_TIME_AGREEMENT else None


def compare_row(row: dict[str, str], index: int) -> dict[str, Any]:
    """One record: the row's flags, whether the tool can take them, and the prediction beside the published."""
    text, assumptions, reason = row_launch(row)
    convention = flops_convention(row)
    record: dict[str, Any] = {
        "index": index,
        "source": row["source"],
        "model": row["model"],
        "gpu": row["gpu"],
        "num_gpus": int(row["num_gpus"]),
        "kind": "moe" if is_moe(row) else "dense",
        "layout": layout_label(row),
        "precision": row["precision"],
        "flops_convention": convention,
        "flags": text,
        "expressible": False,
        "reason": reason,
        "not_modelled": [],
        "importer_notes": [],
        "assumptions": assumptions,
        "caveats": caveats(row),
        "published_tokens_per_s_per_gpu": _source_step_tokens_per_s(row) or _float(row["tokens_per_s_per_gpu"]),
        "published_tflops_per_gpu": _float(row["tflops_per_gpu"]),
        "predicted_tokens_per_s_per_gpu": None,
        "predicted_tflops_per_gpu": None,
        "error": None,
        "tflops_error": None,
        "predicted_step_time_s": None,
        "predicted_peak_memory_gib": None,
        "fits": None,
    }
    if reason is not None:
        return record
    try:
        gpu = get_gpu_spec(GPU_PRESET_NAMES.get(row["gpu"], row["gpu"]))
        imp = launch_to_specs(read_launch(text), num_gpus=int(row["num_gpus"]))
        record["not_modelled"] = list(imp.not_modelled)
        record["importer_notes"] = list(imp.notes)
        if imp.model is None:
            raise ConfigError("megatron_args", "the flags describe no model")
        est = estimate(
            imp.model,
            imp.parallel,
            imp.workload,
            gpu,
            # these runs happened: whether they fit is judged against the whole HBM, no margin
            CostOptions(flops_convention=convention, memory_margin=0.0, **imp.options),
        )
    except (ConfigError, SpecNotFoundError) as exc:
        record["reason"] = str(exc).splitlines()[0]
        return record
    published, published_tflops = record["published_tokens_per_s_per_gpu"], record["published_tflops_per_gpu"]
    record.update(
        expressible=True,
        predicted_tokens_per_s_per_gpu=est.tokens_per_s_per_gpu,
        predicted_tflops_per_gpu=est.model_tflops_per_gpu,
        error=est.tokens_per_s_per_gpu / published - 1.0 if published else None,
        tflops_error=est.model_tflops_per_gpu / published_tflops - 1.0 if published_tflops else None,
        predicted_step_time_s=est.step_time_s,
        predicted_peak_memory_gib=est.peak_memory_gib,
        fits=est.fits,
    )
    return record


def compare_all(csv_path: str | Path = CSV_PATH) -> list[dict[str, Any]]:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [compare_row(row, i) for i, row in enumerate(rows)]


def _group(records: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in records if r["expressible"]]
    errors = [abs(r["error"]) for r in done if r["error"] is not None]
    return {
        "rows": len(records),
        "expressible": len(done),
        "expressible_fraction": len(done) / len(records) if records else None,
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
    }


def _signed(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The signed and absolute median error of the expressible rows (#40's MoE bar: signed median within +-5% per GPU
    group of 5+ rows, median |error| <= 10%)."""
    errors = [r["error"] for r in records if r["expressible"] and r["error"] is not None]
    return {
        "expressible": len(errors),
        "median_error": statistics.median(errors) if errors else None,
        "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and |error| statistics (tokens/s per GPU) over all rows and split by GPU, dense / MoE, and whether
    the importer flagged anything as not modelled (the split is over expressible rows); the MoE rows' signed and
    absolute medians by GPU (`moe_by_gpu`)."""
    done = [r for r in records if r["expressible"]]
    moe = [r for r in records if r["kind"] == "moe"]
    return {
        **_group(records),
        "by_gpu": {g: _group([r for r in records if r["gpu"] == g]) for g in GPU_GROUPS},
        "by_kind": {k: _group([r for r in records if r["kind"] == k]) for k in ("dense", "moe")},
        "by_not_modelled": {
            "none": _group([r for r in done if not r["not_modelled"]]),
            "some": _group([r for r in done if r["not_modelled"]]),
        },
        "moe_by_gpu": {g: _signed([r for r in moe if r["gpu"] == g]) for g in GPU_GROUPS},
    }


def build_report(csv_path: str | Path = CSV_PATH) -> dict[str, Any]:
    records = compare_all(csv_path)
    path = Path(csv_path).resolve()
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "inputs": {
            "csv": path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path),
            "csv_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "path": "read_launch -> launch_to_specs -> estimate (mat estimate --megatron-args), default efficiencies",
            "compared": "tokens/s per GPU; error = predicted / published - 1",
        },
        "records": records,
        "summary": summarize(records),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def print_table(report: dict[str, Any], out: Any = sys.stdout) -> None:
    head = ("#", "model", "gpu", "gpus", "layout", "precision", "published", "predicted", "error", "nm")
    print("{:>3s} {:26s} {:5s} {:>5s} {:44s} {:10s} {:>9s} {:>9s} {:>7s} {:>2s}".format(*head), file=out)
    for r in report["records"]:
        if r["expressible"]:
            pred, err = f"{r['predicted_tokens_per_s_per_gpu']:9.0f}", _pct(r["error"])
        else:
            pred, err = "", f"not expressible: {r['reason']}"[:80]
        print(
            f"{r['index']:3d} {r['model'][:26]:26s} {r['gpu']:5s} {r['num_gpus']:5d} {r['layout'][:44]:44s} "
            f"{r['precision'][:10]:10s} {r['published_tokens_per_s_per_gpu'] or 0:9.0f} {pred:>9s} {err:>7s} "
            f"{len(r['not_modelled']):2d}",
            file=out,
        )
    s = report["summary"]

    def line(name: str, g: dict[str, Any]) -> str:
        med = "-" if g["median_abs_error"] is None else f"{g['median_abs_error']:.1%}"
        mx = "-" if g["max_abs_error"] is None else f"{g['max_abs_error']:.1%}"
        return (
            f"{name:22s} rows {g['rows']:3d}  expressible {g['expressible']:3d}  median |err| {med:>6s}  max {mx:>7s}"
        )

    print(line("all", s), file=out)
    for key in ("by_gpu", "by_kind", "by_not_modelled"):
        for name, g in s[key].items():
            print(line(f"{key[3:]} {name}", g), file=out)
    for name, g in s["moe_by_gpu"].items():
        print(f"{'moe ' + name:22s} expressible {g['expressible']:3d}  median err {_pct(g['median_error']):>7s}  "
              f"median |err| {_pct(g['median_abs_error'])[1:]:>6s}", file=out)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=str(CSV_PATH))
    parser.add_argument("--output", default=str(OUT_PATH), help="where to write the JSON report")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    args = parser.parse_args(argv)
    report = build_report(args.csv)
    text = json.dumps(report, indent=1) + "\n"
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    if args.json:
        sys.stdout.write(text)
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
