"""Which CUDA GPUs this machine has, asked before a measuring command starts jobs that could only fail."""

from __future__ import annotations

from ..errors import NothingMeasuredError


def visible_cuda_gpus() -> int:
    """CUDA devices torch sees here (0 without torch, without CUDA, or with CUDA_VISIBLE_DEVICES empty)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_cuda_gpus(total: int, what: str, hint: str = "--dry-run lists what would run") -> int:
    """The number of visible CUDA GPUs, or `NothingMeasuredError` (exit 1) naming why none of `total` `what`
    (e.g. "6 layouts") can run: no torch, or no CUDA GPU."""
    try:
        import torch
    except ImportError:
        raise NothingMeasuredError(
            f"torch is not installed here: 0 of {total} {what} ran (install torch, megatron-core and "
            f"transformer-engine on the GPU machine; {hint})"
        ) from None
    gpus = visible_cuda_gpus()
    if gpus == 0:
        raise NothingMeasuredError(f"no CUDA GPU visible (torch {torch.__version__}): 0 of {total} {what} ran ({hint})")
    return gpus
