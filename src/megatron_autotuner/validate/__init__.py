"""Close the loop: short real megatron-core training (or forward-only) runs of chosen layouts,
measured against the cost model's predictions.

`validate_layouts` runs a batch (one torchrun job per world size, resumable, failures recorded per
layout), `validate_plan` the top-K candidates of `mat plan`. The GPU side (`runner`, `worker`)
imports torch / megatron-core lazily; everything else is pure Python.
"""

from .agreement import rank_agreement, spearman
from .batch import ValidationReport, plan_layouts, validate_layouts, validate_plan
from .layout import Layout, load_layouts_file

__all__ = [
    "Layout",
    "ValidationReport",
    "load_layouts_file",
    "plan_layouts",
    "rank_agreement",
    "spearman",
    "validate_layouts",
    "validate_plan",
]
