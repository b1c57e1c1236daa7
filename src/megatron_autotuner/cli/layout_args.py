"""Command-line options shared by every command that takes a model, a layout and a workload."""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from ..specs import ParallelConfig, RecomputeConfig, Workload, get_gpu_spec, load_model_spec
from ..specs.hardware import GPUSpec
from ..specs.model import ModelSpec
from ..specs.parallel import FP8_RECIPES, PRECISIONS


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name, HF config.json path/folder, or HF id in cache")
    parser.add_argument("--num-layers", type=int, help="override the model's layer count (reduced models)")


def add_gpu_arguments(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--gpu", required=required, help="GPU preset (mat hardware) or a name in --hardware-file")
    parser.add_argument("--hardware-file", help="yaml with extra or overridden GPU definitions")


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("layout")
    g.add_argument("--num-gpus", type=int, required=True)
    g.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    g.add_argument("--pp", type=int, default=1, help="pipeline parallel size")
    g.add_argument("--vpp", type=int, default=None, help="virtual pipeline chunks per rank (interleaved 1F1B)")
    g.add_argument("--cp", type=int, default=1, help="context parallel size")
    g.add_argument("--ep", type=int, default=1, help="expert parallel size")
    g.add_argument("--etp", type=int, default=None, help="expert tensor parallel size (default: tp)")
    g.add_argument(
        "--sp",
        dest="sequence_parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sequence parallelism (default: on when tp > 1)",
    )
    g.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=True)
    add_grad_reduce_argument(g)
    g.add_argument("--cp-comm-type", choices=["p2p", "a2a", "allgather"], default="p2p")


def add_grad_reduce_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Megatron-LM's `--grad-reduce-in-bf16` (read as `args.grad_reduce_in_bf16`)."""
    parser.add_argument(
        "--grad-reduce-in-bf16",
        action="store_true",
        help="bf16 main-grad buffer (accumulate and reduce gradients in bf16; Megatron-LM's flag of the same name): "
        "2 bytes per parameter less, half the DP gradient traffic",
    )


def add_precision_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--precision` and Megatron-LM's fp8 options `--fp8-recipe` / `--fp8-param-gather`."""
    parser.add_argument("--precision", choices=list(PRECISIONS), default="bf16")
    parser.add_argument(
        "--fp8-recipe",
        choices=list(FP8_RECIPES),
        default="delayed",
        help="with --precision fp8: delayed scaling, per-tensor current scaling (tensorwise, NVIDIA's FP8-CS) or "
        "1x128 / 128x128 block scaling (blockwise, DeepSeek-V3 style)",
    )
    parser.add_argument(
        "--fp8-param-gather",
        action="store_true",
        help="with --precision fp8: keep TE linear weights in fp8 and all-gather them in fp8 (Megatron-LM's flag; "
        "2 bytes per weight less, needs the distributed optimizer)",
    )


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument("--seq-len", type=int, required=True)
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--global-batch-size", type=int, default=None, help="default: micro-batch x dp")
    g.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    g.add_argument("--recompute-method", choices=["uniform", "block"], default="uniform")
    g.add_argument("--recompute-num-layers", type=int, default=1)
    g.add_argument("--recompute-modules", nargs="+", default=["core_attn"], help="for --recompute selective")
    add_precision_arguments(g)
    g.add_argument("--mode", choices=["train", "forward"], default="train")
    g.add_argument("--max-token-len", type=int, default=None, help="verl dynamic batching: tokens per micro-batch")
    g.add_argument("--flops-convention", choices=["causal", "full"], default="causal")


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    model = load_model_spec(args.model)
    if getattr(args, "num_layers", None):
        if args.num_layers < 1:
            raise ConfigError("num_layers", "must be >= 1")
        model = model.with_num_layers(args.num_layers)
    return model


def gpu_from_args(args: argparse.Namespace) -> GPUSpec | None:
    if not getattr(args, "gpu", None):
        return None
    return get_gpu_spec(args.gpu, args.hardware_file)


def parallel_from_args(args: argparse.Namespace) -> ParallelConfig:
    sp = args.sequence_parallel if args.sequence_parallel is not None else args.tp > 1
    return ParallelConfig(
        num_gpus=args.num_gpus,
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        ep=args.ep,
        etp=args.etp,
        vpp=args.vpp,
        sequence_parallel=sp,
        use_distributed_optimizer=args.distributed_optimizer,
        grad_reduce_in_fp32=not args.grad_reduce_in_bf16,
        cp_comm_type=args.cp_comm_type,
    )


def workload_from_args(args: argparse.Namespace, parallel: ParallelConfig) -> Workload:
    gbs = args.global_batch_size or args.micro_batch_size * parallel.dp
    return Workload(
        seq_length=args.seq_len,
        micro_batch_size=args.micro_batch_size,
        global_batch_size=gbs,
        recompute=RecomputeConfig(
            granularity=args.recompute,
            method=args.recompute_method,
            num_layers=args.recompute_num_layers,
            modules=tuple(args.recompute_modules),
        ),
        precision=args.precision,
        mode=args.mode,
        max_token_len=args.max_token_len,
        fp8_recipe=args.fp8_recipe,
        fp8_param=args.fp8_param_gather,
    )


def layout_summary(p: ParallelConfig, w: Workload) -> str:
    """One line for a table header: the split, then what one iteration processes and in what precision."""
    return (
        f"tp={p.tp} pp={p.pp} vpp={p.vpp or '-'} cp={p.cp} dp={p.dp} ep={p.ep} etp={p.etp} sp={p.sequence_parallel} "
        f"| seq={w.seq_length} mbs={w.micro_batch_size} gbs={w.global_batch_size} recompute={w.recompute.granularity} "
        f"{w.precision_label} mode={w.mode}{'' if p.grad_reduce_in_fp32 else ' main-grads=bf16'}"
    )
