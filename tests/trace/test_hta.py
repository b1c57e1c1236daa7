"""Side by side with Holistic Trace Analysis (skipped when `hta` is not installed).

HTA: overlap % = 100 * |comm ∩ compute| / |comm|, comm = kernels matching ^nccl.*Kernel.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import shutil
import warnings

import pytest

from megatron_autotuner.trace import load_trace, overlap

from .helpers import NCCL, UB

pytest.importorskip("hta")


def _hta_pct(paths, tmp_path) -> dict[int, float]:
    from hta.trace_analysis import TraceAnalysis

    for p in paths:
        shutil.copy(p, tmp_path)
    logging.disable(logging.CRITICAL)
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    return {int(r): float(v) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"], strict=True)}


def test_nccl_overlap_matches_hta_within_1_percent(tmp_path):
    hta = _hta_pct(NCCL, tmp_path)
    for path in NCCL:
        t = load_trace(path)
        ours = 100 * overlap(t).comm_overlap_fraction
        assert ours == pytest.approx(hta[t.rank], rel=0.01)


def test_userbuffers_difference_is_classification(tmp_path):
    hta = _hta_pct(UB, tmp_path)
    for path in UB:
        t = load_trace(path)
        stats = overlap(t)
        # HTA sees no NCCL kernel, hence no communication (NaN); we see userbuffers + peer copies
        assert math.isnan(hta[t.rank])
        assert stats.comm_us > 1000 and stats.overlap_us > 0
        assert {b.name for b in stats.by_library} == {"userbuffers", "copy_engine"}
