"""Sliding-window layers in the cost model: each is a layer kind of its own, its attention priced on the keys its
queries see (`theory.flops.attention_flops_per_token`), so a model whose windows alternate is predicted between
the same model with every layer windowed and with none."""

from __future__ import annotations

import pytest

from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.specs import ParallelConfig, Workload, get_gpu_spec, load_model_spec

H100 = get_gpu_spec("H100-SXM")


def _step_s(model, seq: int) -> float:
    return estimate(model, ParallelConfig(8, ep=8), Workload(seq, 1, 64), H100, CostOptions()).step_time_s


@pytest.mark.parametrize("seq", [4096, 32768])
def test_alternating_windows_sit_between_all_and_none(seq):
    oss = load_model_spec("gpt-oss-20b")
    every = oss.replace(window_layer_pattern=())
    none = oss.replace(window_size=0, window_layer_pattern=())
    assert _step_s(every, seq) < _step_s(oss, seq) < _step_s(none, seq)
    # the attention saved by the 12 windowed layers is half of what windowing all 24 saves
    assert _step_s(none, seq) - _step_s(oss, seq) == pytest.approx(
        (_step_s(none, seq) - _step_s(every, seq)) / 2, rel=0.02
    )


def test_a_window_longer_than_the_sequence_changes_nothing():
    oss = load_model_spec("gpt-oss-20b")
    assert _step_s(oss.replace(window_size=8192), 4096) == _step_s(
        oss.replace(window_size=0, window_layer_pattern=()), 4096
    )
