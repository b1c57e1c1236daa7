"""Command-line options shared by every command that takes a model, a layout and a workload."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

from ..argspec.argtypes import non_empty_path, positive_int
from ..argspec.common import (
    add_grad_reduce_argument,
    add_launch_reading_arguments,
    add_moe_dispatcher_arguments,
    add_moe_overlap_arguments,
    add_precision_arguments,
    launch_variables,
    moe_dispatcher_from_args,
)
from ..errors import ConfigError
from ..specs import MoeRouting, ParallelConfig, RecomputeConfig, Workload, get_gpu_spec, load_model_spec
from ..specs.hardware import GPUSpec
from ..specs.lengths import SequenceLengths, parse_mean_max, read_length_histogram
from ..specs.megatron_args import (
    ImportedLaunch,
    accepted_launch_device_max_connections,
    launch_to_specs,
    read_launch_file,
)
from ..specs.model import ModelSpec
from ..specs.pipeline import PipelineLayout

MEGATRON_ARGS_HELP = (
    "a Megatron-LM launch as you have it (- for stdin): your launch script (read, never run: arrays, defaults, "
    "if / case, sourced files, srun ... bash -c), a `torchrun ... pretrain_gpt.py ...` command, a model's flags "
    "alone, or flags on one or several lines; the model, layout and workload come "
    "from it (Megatron's defaults for what it does not say), --model fills in what its flags leave out"
)


def add_model_arguments(parser: argparse.ArgumentParser, megatron_args: bool = True) -> None:
    parser.add_argument(
        "--model",
        help="preset name (mat models), HF config.json path/folder, or HF id in the local cache"
        + ("; optional with --megatron-args" if megatron_args else ""),
    )
    parser.add_argument(
        "--num-layers",
        type=positive_int,
        help="override the model's layer count (reduced models; default: the model's)",
    )
    if megatron_args:
        parser.add_argument("--megatron-args", metavar="FILE", type=non_empty_path, help=MEGATRON_ARGS_HELP)
        add_launch_reading_arguments(parser, strict=True)


def add_gpu_arguments(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--gpu", required=required, help="GPU preset (mat hardware) or a name in --hardware-file")
    parser.add_argument(
        "--hardware-file",
        type=non_empty_path,
        help="yaml with extra or overridden GPU definitions (default: the shipped presets only)",
    )


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("layout (with --megatron-args: from the launch)")
    g.add_argument(
        "--num-gpus",
        type=positive_int,
        help="GPUs of the job (required without --megatron-args; with it, default torchrun's world size)",
    )
    g.add_argument("--tp", type=positive_int, default=None, help="tensor parallel size (default 1)")
    g.add_argument("--pp", type=positive_int, default=None, help="pipeline parallel size (default 1)")
    g.add_argument(
        "--vpp",
        type=positive_int,
        default=None,
        help="virtual pipeline chunks per rank (interleaved 1F1B; default: none, plain 1F1B)",
    )
    g.add_argument(
        "--pipeline-layout",
        default=None,
        help="uneven pipeline: a Megatron layout string such as 'Et|(tt|)*30mL', or 'account' (embedding and loss "
        "each take a layer's slot, as --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split; "
        "default: layers split evenly)",
    )
    g.add_argument("--cp", type=positive_int, default=None, help="context parallel size (default 1)")
    g.add_argument("--ep", type=positive_int, default=None, help="expert parallel size (default 1)")
    g.add_argument("--etp", type=positive_int, default=None, help="expert tensor parallel size (default: tp)")
    g.add_argument(
        "--sp",
        dest="sequence_parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sequence parallelism (default: on when tp > 1)",
    )
    g.add_argument(
        "--distributed-optimizer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="shard the optimizer state over data-parallel ranks (default on)",
    )
    add_grad_reduce_argument(g)
    g.add_argument(
        "--cp-comm-type",
        choices=["p2p", "a2a", "allgather"],
        default=None,
        help="context-parallel attention exchange (default p2p ring)",
    )
    add_moe_overlap_arguments(g)
    add_moe_dispatcher_arguments(g)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload (with --megatron-args: from the launch)")
    g.add_argument(
        "--seq-len", type=positive_int, default=None, help="tokens per sequence (required without --megatron-args)"
    )
    g.add_argument("--micro-batch-size", type=positive_int, default=None, help="sequences per micro-batch (default 1)")
    g.add_argument(
        "--global-batch-size", type=positive_int, default=None, help="sequences per step (default: micro-batch x dp)"
    )
    g.add_argument(
        "--recompute", choices=["none", "selective", "full"], default=None, help="activation recompute (default none)"
    )
    g.add_argument(
        "--recompute-method", choices=["uniform", "block"], default=None, help="with --recompute full (default uniform)"
    )
    g.add_argument("--recompute-num-layers", type=positive_int, default=None, help="with --recompute full (default 1)")
    g.add_argument(
        "--recompute-modules", nargs="+", default=None, help="with --recompute selective (default core_attn)"
    )
    add_precision_arguments(g)
    add_mode_arguments(g)
    add_flops_convention_argument(g)
    add_moe_routing_argument(g)


def add_moe_routing_argument(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--moe-load-imbalance`: what no launch says (how the router spreads the tokens)."""
    g.add_argument(
        "--moe-load-imbalance",
        type=float,
        default=None,
        metavar="MAX/MEAN",
        help="MoE: the busiest expert-parallel rank's routed tokens over the mean; its experts and all-to-all set the "
        "pace (default 1.0: balanced, as NVIDIA's benchmarks force it with --moe-router-force-load-balancing)",
    )


def moe_routing_from_args(args: argparse.Namespace, launch: MoeRouting | None = None) -> MoeRouting:
    """The launch's capacity settings (or none) with --moe-load-imbalance."""
    base = launch or MoeRouting()
    imbalance = getattr(args, "moe_load_imbalance", None)
    return base if imbalance is None else replace(base, load_imbalance=imbalance)


def add_flops_convention_argument(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--flops-convention",
        choices=["causal", "full"],
        default="causal",
        help="count causal attention as half the square (Megatron-Bridge) or the whole square (NeMo, dgxc)",
    )


def add_mode_arguments(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--mode` and `--max-token-len`: what a launch file cannot say (verl's RLHF passes)."""
    g.add_argument(
        "--mode",
        choices=["train", "forward"],
        default="train",
        help="train (fwd+bwd+optimizer) or forward (RLHF reference / old-log-prob passes)",
    )
    g.add_argument(
        "--max-token-len",
        type=positive_int,
        default=None,
        help="verl dynamic batching: tokens per micro-batch (default: none, fixed micro-batches)",
    )


def add_length_arguments(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--prompt-len MEAN:MAX --response-len MEAN:MAX` or `--length-histogram FILE`: variable sequence lengths."""
    g.add_argument(
        "--prompt-len",
        metavar="MEAN:MAX",
        help="RLHF prompt lengths in tokens, e.g. 512:1024 (a geometric distribution clipped at MAX, with that mean); "
        "with --response-len, replaces --seq-len: sequences vary and are packed as verl's dynamic batching packs "
        "them (default: every sequence --seq-len tokens)",
    )
    g.add_argument(
        "--response-len",
        metavar="MEAN:MAX",
        help="RLHF response lengths in tokens, e.g. 1024:4096 (default: none; goes with --prompt-len)",
    )
    g.add_argument(
        "--length-histogram",
        metavar="FILE",
        type=non_empty_path,
        help='whole-sequence lengths instead: JSON [[length, count], ...] or {"length": count}, or CSV lines '
        "length,count (default: none)",
    )


def lengths_from_args(args: argparse.Namespace) -> SequenceLengths | None:
    """The `add_length_arguments` options as `SequenceLengths`, None when none is given."""
    prompt, response = getattr(args, "prompt_len", None), getattr(args, "response_len", None)
    histogram = getattr(args, "length_histogram", None)
    if histogram is not None:
        if prompt is not None or response is not None:
            raise ConfigError("length_histogram", "give --length-histogram or --prompt-len/--response-len, not both")
        return read_length_histogram(histogram, "length_histogram")
    if prompt is None and response is None:
        return None
    if prompt is None or response is None:
        missing = "prompt_len" if prompt is None else "response_len"
        raise ConfigError(missing, "--prompt-len and --response-len go together (MEAN:MAX each)")
    return SequenceLengths.from_mean_max(parse_mean_max("prompt_len", prompt), parse_mean_max("response_len", response))


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    if not getattr(args, "model", None):
        raise ConfigError(
            "model", "give --model (a preset, config.json or HF id) or --megatron-args with the model flags"
        )
    model = load_model_spec(args.model)
    if getattr(args, "num_layers", None) is not None:
        if args.num_layers < 1:
            raise ConfigError("num_layers", "must be >= 1")
        model = model.with_num_layers(args.num_layers)
    return model


def gpu_from_args(args: argparse.Namespace) -> GPUSpec | None:
    """The --gpu preset or --hardware-file entry; None only where --gpu was not given (an empty name is unknown)."""
    if getattr(args, "gpu", None) is None:
        return None
    return get_gpu_spec(args.gpu, args.hardware_file)


def pipeline_layout_from_args(args: argparse.Namespace, model: ModelSpec, pp: int) -> PipelineLayout | None:
    """`--pipeline-layout`: a Megatron layout string, or 'account' for embedding and loss accounting."""
    text = getattr(args, "pipeline_layout", None)
    if text is None:
        return None
    if text == "account":
        return PipelineLayout.accounting(model.num_layers, pp, args.vpp, True, True, model.mtp_num_layers)
    layout = PipelineLayout.from_string(text, pp)
    layout.check_model(model.num_layers, model.mtp_num_layers)
    return layout


def parallel_from_args(args: argparse.Namespace, model: ModelSpec | None = None) -> ParallelConfig:
    if args.num_gpus is None:
        raise ConfigError("num_gpus", "is required (or give --megatron-args with a torchrun command)")
    tp = args.tp or 1
    pp = args.pp or 1
    sp = args.sequence_parallel if args.sequence_parallel is not None else tp > 1
    layout = pipeline_layout_from_args(args, model, pp) if model is not None else None
    return ParallelConfig(
        num_gpus=args.num_gpus,
        tp=tp,
        pp=pp,
        cp=args.cp or 1,
        ep=args.ep or 1,
        etp=args.etp,
        vpp=args.vpp,
        sequence_parallel=sp,
        use_distributed_optimizer=args.distributed_optimizer is not False,
        grad_reduce_in_fp32=not args.grad_reduce_in_bf16,
        cp_comm_type=args.cp_comm_type or "p2p",
        moe_a2a_overlap=bool(getattr(args, "moe_a2a_overlap", None)),
        delay_wgrad_compute=bool(getattr(args, "delay_wgrad_compute", None)),
        moe_dispatcher=moe_dispatcher_from_args(args),
        pipeline_layout=layout,
    )


def workload_from_args(args: argparse.Namespace, parallel: ParallelConfig) -> Workload:
    if args.seq_len is None:
        raise ConfigError("seq_len", "is required (or give --megatron-args with --seq-length)")
    if args.recompute_modules and args.recompute != "selective":
        # Megatron-LM reads --recompute-modules only with --recompute-granularity selective
        raise ConfigError("recompute_modules", "apply only with --recompute selective")
    mbs = args.micro_batch_size or 1
    gbs = args.global_batch_size or mbs * parallel.dp
    return Workload(
        seq_length=args.seq_len,
        micro_batch_size=mbs,
        global_batch_size=gbs,
        recompute=RecomputeConfig(
            granularity=args.recompute or "none",
            method=args.recompute_method or "uniform",
            num_layers=args.recompute_num_layers or 1,
            modules=tuple(args.recompute_modules or ("core_attn",)),
        ),
        precision=args.precision or "bf16",
        mode=args.mode,
        max_token_len=args.max_token_len,
        fp8_recipe=args.fp8_recipe or "delayed",
        fp8_param=bool(args.fp8_param_gather),
        moe_routing=moe_routing_from_args(args),
    )


# CLI options a launch file decides; giving one beside --megatron-args is an error (the launch is the truth)
LAUNCH_DECIDES = {
    "tp": "--tensor-model-parallel-size",
    "pp": "--pipeline-model-parallel-size",
    "vpp": "--num-virtual-stages-per-pipeline-rank",
    "pipeline_layout": "--pipeline-model-parallel-layout",
    "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size",
    "etp": "--expert-tensor-parallel-size",
    "sequence_parallel": "--sequence-parallel",
    "distributed_optimizer": "--use-distributed-optimizer",
    "grad_reduce_in_bf16": "--grad-reduce-in-bf16",
    "cp_comm_type": "--cp-comm-type",
    "moe_a2a_overlap": "--overlap-moe-expert-parallel-comm",
    "delay_wgrad_compute": "--delay-wgrad-compute",
    "moe_token_dispatcher_type": "--moe-token-dispatcher-type",
    "moe_flex_dispatcher_backend": "--moe-flex-dispatcher-backend",
    "seq_len": "--seq-length",
    "micro_batch_size": "--micro-batch-size",
    "global_batch_size": "--global-batch-size",
    "recompute": "--recompute-granularity",
    "recompute_method": "--recompute-method",
    "recompute_num_layers": "--recompute-num-layers",
    "recompute_modules": "--recompute-modules",
    "precision": "--bf16 / --fp8-format",
    "fp8_recipe": "--fp8-recipe",
    "fp8_param_gather": "--fp8-param-gather",
}


@dataclass(frozen=True)
class ResolvedSpecs:
    """Model, layout and workload from the CLI options or a Megatron-LM launch, with the launch's cost options
    (`options`: CostOptions fields) and notes (`not_modelled`: flags the cost model does not model yet)."""

    model: ModelSpec
    parallel: ParallelConfig
    workload: Workload
    options: dict | None  # None: no launch (the CLI's own assumption flags apply)
    notes: tuple[str, ...] = ()
    not_modelled: tuple[str, ...] = ()
    imported: ImportedLaunch | None = None


def import_launch(args: argparse.Namespace, need_layout: bool = True) -> ImportedLaunch:
    """`--megatron-args FILE` read against --model (fills what the flags leave out) and --num-gpus."""
    for dest, flag in LAUNCH_DECIDES.items():
        if getattr(args, dest, None) is not None:
            option = {"sequence_parallel": "--sp", "moe_a2a_overlap": flag}.get(dest, "--" + dest.replace("_", "-"))
            raise ConfigError(dest, f"{option} goes in the Megatron-LM launch ({flag}) when --megatron-args is given")
    base = load_model_spec(args.model) if getattr(args, "model", None) else None
    imported = launch_to_specs(
        read_launch_file(args.megatron_args, launch_variables(args), getattr(args, "strict", False)),
        base,
        num_gpus=getattr(args, "num_gpus", None),
        mode=getattr(args, "mode", "train"),
        max_token_len=getattr(args, "max_token_len", None),
    )
    if imported.model is None:
        raise ConfigError(
            "model",
            "the launch does not describe the model (--num-layers --hidden-size --num-attention-heads): give --model",
        )
    if need_layout and imported.parallel is None:
        raise ConfigError("num_gpus", "the launch does not say how many GPUs: give --num-gpus")
    return imported


def launch_run_options(imported: ImportedLaunch, options: Any, gpu: GPUSpec) -> Any:
    """The cost options of the launch itself: `options` with the CUDA_DEVICE_MAX_CONNECTIONS it exports, which
    Megatron-LM must accept on `gpu` (`accepted_launch_device_max_connections`). The plan's candidates keep
    `options`."""
    from ..costmodel.nccl_protocols import architecture

    blackwell = architecture(gpu) == "blackwell"
    connections = accepted_launch_device_max_connections(imported.launch, imported.parallel, blackwell)
    return options if connections is None else replace(options, cuda_device_max_connections=connections)


def specs_from_args(args: argparse.Namespace) -> ResolvedSpecs:
    """The model, layout and workload of `mat estimate` / `mat theory`: from --megatron-args when given (its flags
    win over --model), else from the tool's own options."""
    if getattr(args, "megatron_args", None):
        imported = import_launch(args)
        model = imported.model
        parallel, workload = imported.parallel, imported.workload
        workload = workload.replace(moe_routing=moe_routing_from_args(args, workload.moe_routing))
        if getattr(args, "num_layers", None) is not None:
            raise ConfigError(
                "num_layers", "goes in the Megatron-LM launch (--num-layers) when --megatron-args is given"
            )
        return ResolvedSpecs(
            model, parallel, workload, imported.options, imported.notes, imported.not_modelled, imported
        )
    model = model_from_args(args)
    parallel = parallel_from_args(args, model)
    return ResolvedSpecs(model, parallel, workload_from_args(args, parallel), None)


def layout_summary(p: ParallelConfig, w: Workload) -> str:
    """One line for a table header: the split, then what one iteration processes and in what precision."""
    layout = "" if p.pipeline_layout is None else f" layout={p.pipeline_layout.describe()}"
    return (
        f"tp={p.tp} pp={p.pp} vpp={p.vpp or '-'}{layout} cp={p.cp} dp={p.dp} ep={p.ep} etp={p.etp} "
        f"sp={p.sequence_parallel} "
        f"| seq={w.seq_length} mbs={w.micro_batch_size} gbs={w.global_batch_size} recompute={w.recompute.granularity} "
        f"{w.precision_label} mode={w.mode}{'' if p.grad_reduce_in_fp32 else ' main-grads=bf16'}"
        f"{'' if not w.activation_offload.enabled else ' offload=' + w.activation_offload.label}"
    )
