"""Specs: what the model is, what the hardware is, and how the work is laid out on it."""

from .hardware import GPU_PRESETS, ClusterSpec, GPUSpec, get_gpu_spec, load_gpu_specs_yaml
from .hf import model_spec_from_hf_config
from .loader import find_in_hf_cache, load_model_spec, load_model_spec_file, preset_names
from .model import ModelSpec
from .parallel import (
    CudaGraphConfig,
    MoeRouting,
    ParallelConfig,
    RecomputeConfig,
    Workload,
    layers_per_stage,
    num_microbatches,
    validate_layout,
)

__all__ = [
    "GPU_PRESETS",
    "ClusterSpec",
    "CudaGraphConfig",
    "GPUSpec",
    "ModelSpec",
    "ParallelConfig",
    "RecomputeConfig",
    "MoeRouting",
    "Workload",
    "find_in_hf_cache",
    "get_gpu_spec",
    "layers_per_stage",
    "load_gpu_specs_yaml",
    "load_model_spec",
    "load_model_spec_file",
    "model_spec_from_hf_config",
    "num_microbatches",
    "preset_names",
    "validate_layout",
]
