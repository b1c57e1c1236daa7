"""One object with every theoretical number for a (model, layout, workload), per pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass

from .. import SCHEMA_VERSION, __version__
from ..specs.hardware import GPUSpec
from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, Workload, num_microbatches, validate_layout
from .comm import CommVolume, comm_bytes_by_dimension, stage_comm_volumes
from .flops import FlopsBreakdown, iteration_flops
from .memory import GIB, ActivationOptions, MemoryAllowance, StageMemory, memory_per_stage
from .params import total_parameters


@dataclass(frozen=True)
class TheoryReport:
    model: ModelSpec
    parallel: ParallelConfig
    workload: Workload
    flops: FlopsBreakdown
    stages: list[StageMemory]
    comm: list[list[CommVolume]]  # per stage
    gpu: GPUSpec | None = None
    padded_vocab_size: int | None = None

    @property
    def peak_memory_gib(self) -> float:
        return max(s.total_bytes for s in self.stages) / GIB

    @property
    def fits(self) -> bool | None:
        if self.gpu is None:
            return None
        return self.peak_memory_gib <= self.gpu.hbm_gib

    def to_dict(self) -> dict:
        totals = total_parameters(self.model, self.padded_vocab_size)
        return {
            "schema_version": SCHEMA_VERSION,
            "tool_version": __version__,
            "model": self.model.to_dict(),
            "parallel": self.parallel.to_dict(),
            "workload": self.workload.to_dict(),
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "padded_vocab_size": self.padded_vocab_size,
            "num_microbatches": num_microbatches(self.parallel, self.workload),
            "parameters": {"total": totals.total, "active": totals.active},
            "flops": self.flops.to_dict(),
            "memory_per_stage": [s.to_dict() for s in self.stages],
            "peak_memory_gib": self.peak_memory_gib,
            "fits": self.fits,
            "comm_per_stage": [
                {
                    "stage": i,
                    "wire_bytes_by_dimension": comm_bytes_by_dimension(vols),
                    "collectives": [v.to_dict() for v in vols],
                }
                for i, vols in enumerate(self.comm)
            ],
        }


def theory_report(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    gpu: GPUSpec | None = None,
    convention: str = "causal",
    options: ActivationOptions = ActivationOptions(),
    allowance: MemoryAllowance = MemoryAllowance(),
    pad_vocab: bool = True,
) -> TheoryReport:
    """Validate the layout, then compute FLOPs, memory and communication for every stage.

    The vocabulary is padded as Megatron-LM pads it (to a multiple of the model's
    `make_vocab_size_divisible_by`, 128 by default, x tp) unless `pad_vocab` is False.
    """
    validate_layout(model, parallel, workload)
    if gpu is not None and workload.precision == "fp8":
        gpu.peak_tflops("fp8")  # raises for GPUs without fp8, as `estimate` does
    padded = model.padded_vocab_size(parallel.tp) if pad_vocab else None
    return TheoryReport(
        model=model,
        parallel=parallel,
        workload=workload,
        flops=iteration_flops(model, parallel, workload, convention, padded),
        stages=memory_per_stage(model, parallel, workload, options, allowance, padded),
        comm=[stage_comm_volumes(model, parallel, workload, s, padded) for s in range(parallel.pp)],
        gpu=gpu,
        padded_vocab_size=padded,
    )
