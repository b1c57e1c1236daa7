"""Option groups that `mat` and `python -m megatron_autotuner.validate` both define."""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from ..specs.parallel import (
    CROSS_ENTROPY_FUSION_IMPLS,
    FLEX_DISPATCHER_BACKENDS,
    FP8_RECIPES,
    PRECISIONS,
    moe_dispatcher_name,
)


def add_grad_reduce_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Megatron-LM's `--grad-reduce-in-bf16` (read as `args.grad_reduce_in_bf16`)."""
    parser.add_argument(
        "--grad-reduce-in-bf16",
        action="store_true",
        default=None,
        help="bf16 main-grad buffer (accumulate and reduce gradients in bf16; Megatron-LM's flag of the same name): "
        "2 bytes per parameter less, half the DP gradient traffic (default: fp32 main grads)",
    )


def add_moe_overlap_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Megatron-LM's `--overlap-moe-expert-parallel-comm` (read as `args.moe_a2a_overlap`) and
    `--delay-wgrad-compute`; None when not given."""
    parser.add_argument(
        "--overlap-moe-expert-parallel-comm",
        dest="moe_a2a_overlap",
        action="store_true",
        default=None,
        help="MoE with ep > 1: Megatron's EP all-to-all overlap, one micro-batch's forward beside another's backward "
        "(Megatron-LM's flag; default off)",
    )
    parser.add_argument(
        "--delay-wgrad-compute",
        action="store_true",
        default=None,
        help="with --overlap-moe-expert-parallel-comm: the experts' weight gradients after the backward dispatch "
        "(Megatron-LM's flag; default off)",
    )


def add_moe_dispatcher_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Megatron-LM's `--moe-token-dispatcher-type` and `--moe-flex-dispatcher-backend`; None when not given
    (`moe_dispatcher_from_args`)."""
    parser.add_argument(
        "--moe-token-dispatcher-type",
        choices=("alltoall", "allgather", "flex"),
        default=None,
        help="MoE token dispatcher (Megatron-LM's flag): alltoall (default here, as NVIDIA's recipes run it), "
        "allgather (Megatron-LM's own default: every token to every rank of the expert group) or flex",
    )
    parser.add_argument(
        "--moe-flex-dispatcher-backend",
        choices=FLEX_DISPATCHER_BACKENDS,
        default=None,
        help="with --moe-token-dispatcher-type flex: DeepEP or HybridEP (default deepep, as Megatron-LM)",
    )


def moe_dispatcher_from_args(args: argparse.Namespace) -> str:
    """`ParallelConfig.moe_dispatcher` of the dispatcher flags (`specs.parallel.moe_dispatcher_name`; alltoall when
    none is given)."""
    kind = getattr(args, "moe_token_dispatcher_type", None) or "alltoall"
    backend = getattr(args, "moe_flex_dispatcher_backend", None)
    if backend is not None and kind != "flex":
        raise ConfigError("moe_flex_dispatcher_backend", "needs --moe-token-dispatcher-type flex")
    return moe_dispatcher_name(kind, backend)


def add_cross_entropy_fusion_impl_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Megatron-LM's `--cross-entropy-fusion-impl` (default native, as there)."""
    parser.add_argument(
        "--cross-entropy-fusion-impl",
        choices=CROSS_ENTROPY_FUSION_IMPLS,
        default="native",
        help="with --cross-entropy-fusion: megatron-core's torch-compiled kernels (native, Megatron-LM's default) or "
        "Transformer Engine's one-pass kernel (te, what Megatron-Bridge's performance recipes run)",
    )


def add_precision_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--precision` and Megatron-LM's fp8 options `--fp8-recipe` / `--fp8-param-gather`."""
    parser.add_argument("--precision", choices=list(PRECISIONS), default=None, help="bf16 (default) or fp8")
    parser.add_argument(
        "--fp8-recipe",
        choices=list(FP8_RECIPES),
        default=None,
        help="with --precision fp8: delayed scaling, per-tensor current scaling (tensorwise, NVIDIA's FP8-CS) or "
        "1x128 / 128x128 block scaling (blockwise, DeepSeek-V3 style) (default: delayed)",
    )
    parser.add_argument(
        "--fp8-param-gather",
        action="store_true",
        default=None,
        help="with --precision fp8: keep TE linear weights in fp8 and all-gather them in fp8 (Megatron-LM's flag; "
        "2 bytes per weight less, needs the distributed optimizer; default: off)",
    )


def add_launch_reading_arguments(parser: argparse.ArgumentParser, strict: bool) -> None:
    """--var (what only the user knows of a launch script) and, for Megatron-LM launches, --strict."""
    parser.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        type=launch_variable,
        help="a shell variable the launch script reads from its environment or arguments (repeatable); the script "
        "is read, never run: what it leaves unknown is assumed and said in a note",
    )
    if strict:
        parser.add_argument(
            "--strict", action="store_true", help="a flag Megatron-LM does not have is an error (default: a note)"
        )


def launch_variable(text: str) -> tuple[str, str]:
    """argparse type of --var NAME=VALUE."""
    from ..specs.launch_script import parse_var

    try:
        return parse_var(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def launch_variables(args: argparse.Namespace) -> dict[str, str]:
    return dict(getattr(args, "var", None) or [])
