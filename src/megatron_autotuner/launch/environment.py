"""What a worker ran on, stored with every measurement: date, device, torch / CUDA / NCCL / megatron-core / TE
versions and host (torch is imported here, inside the worker only)."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "cuda": torch.version.cuda,
        "hostname": os.uname().nodename,
    }
    try:
        import megatron.core

        env["megatron_core"] = getattr(megatron.core, "__version__", "unknown")
    except ImportError:
        env["megatron_core"] = None
    try:
        import transformer_engine

        env["transformer_engine"] = transformer_engine.__version__
    except Exception:  # noqa: BLE001
        env["transformer_engine"] = None
    if device == "cuda":
        try:
            env["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001
            env["nccl"] = None
    return env
