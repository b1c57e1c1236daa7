"""A long plan says what it is doing: the search reports its phases and every unit of work to a `Progress`, and the
CLI draws them on standard error only when that is a terminal."""

from __future__ import annotations

import io

from megatron_autotuner.cli.progress_bar import progress_bar
from megatron_autotuner.search import plan
from megatron_autotuner.search.progress import QUIET
from megatron_autotuner.specs import get_gpu_spec, load_model_spec


class Recorder:
    def __init__(self) -> None:
        self.phases: list[list] = []  # [name, total, advanced]
        self.finished = False

    def start(self, what: str, total: int) -> None:
        self.phases.append([what, total, 0])

    def advance(self, units: int = 1) -> None:
        self.phases[-1][2] += units

    def finish(self) -> None:
        self.finished = True


def test_the_search_reports_each_phase_and_completes_it():
    rec = Recorder()
    result = plan(load_model_spec("Qwen3-8B"), get_gpu_spec("H100-SXM"), 8, 4096, 64, progress=rec)
    names = [p[0] for p in rec.phases]
    assert names == [
        "screening layouts",
        "searching micro-batches, recompute and optimizer sharding",
        "estimating the layouts that fit",
    ]
    assert all(total == advanced and total > 0 for _, total, advanced in rec.phases)
    # the last phase prices every layout that fits in memory: the plan's candidates come from it
    assert rec.phases[-1][1] >= len(result.candidates)


def test_the_bar_draws_on_a_terminal_and_is_quiet_elsewhere():
    out = io.StringIO()
    with progress_bar(out) as progress:  # a StringIO is no terminal: nothing drawn, nothing to stop
        assert progress is QUIET
    assert out.getvalue() == ""
    with progress_bar(out, force_terminal=True) as progress:
        progress.start("screening layouts", 3)
        progress.advance(3)
    assert "screening layouts" in out.getvalue() and "3/3" in out.getvalue()
