"""The pipeline schedule with unequal stages: in-flight micro-batches per chunk, the fill / drain the slowest rank
waits through, and what an uneven layout changes in time and memory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_autotuner.costmodel.estimate import StageTime, estimate, pipeline_fill_drain_s
from megatron_autotuner.specs import ParallelConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.pipeline import PipelineLayout
from megatron_autotuner.theory.memory import in_flight_chunk_counts

H100 = get_gpu_spec("H100-SXM")


@given(st.integers(2, 16), st.integers(1, 8), st.integers(1, 64), st.data())
def test_in_flight_mixes_hold_megatrons_warm_up_count(pp, v, m_groups, data):
    """Every mix holds min(m*v, 2(pp - r - 1) + (v - 1)pp + 1) chunk-micro-batches (megatron-core's warm-up + 1),
    or min(pp - r, m) without interleaving; no chunk holds more than m."""
    stage = data.draw(st.integers(0, pp - 1))
    m = m_groups * pp if v > 1 else m_groups
    mixes = in_flight_chunk_counts(pp, v, stage, m)
    expected = min(pp - stage, m) if v == 1 else min(m * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
    assert all(sum(mix) == expected for mix in mixes)
    assert all(0 <= n <= m for mix in mixes for n in mix)


def _stage(chunks: list[float]) -> StageTime:
    return StageTime(0, {"gemm": sum(chunks)}, {}, 0.0, 0.0, {}, tuple(chunks))


def test_fill_and_drain_are_narayanans_bubble_with_equal_chunks_and_shorter_with_light_ends():
    equal = [_stage([1.0, 1.0, 1.0, 1.0]) for _ in range(4)]
    assert pipeline_fill_drain_s(equal, 1) == pytest.approx((16 - 4) / 4)
    # embedding / loss accounting: the first chunk of rank 0 and the last of rank 3 are half as heavy
    light_ends = [_stage([0.5, 1, 1, 1]), _stage([1, 1, 1, 1]), _stage([1, 1, 1, 1]), _stage([1, 1, 1, 0.5])]
    assert pipeline_fill_drain_s(light_ends, 1) == pytest.approx(0.5 + 1.0 + 0.5)


def test_accounting_for_embedding_and_loss_lightens_the_end_stages_of_405b():
    model = load_model_spec("Llama-3.1-405B")
    even_layers = ParallelConfig(
        1024, tp=8, pp=8, cp=2, sequence_parallel=True, pipeline_layout=PipelineLayout.first_last(126, 8, None, 15, 15)
    )
    accounted = even_layers.replace(pipeline_layout=PipelineLayout.accounting(126, 8, 8))
    work = Workload(8192, 1, 512, precision="fp8")
    e = estimate(model, accounted, work, H100)
    per_mb = [s.per_microbatch_s for s in e.time.stages]
    assert per_mb[0] < per_mb[1] and per_mb[7] < per_mb[6]  # 15 layers + embedding / loss against 16
    assert e.time.critical_stage in range(1, 7)
    memory = e.memory_per_stage_gib
    assert memory[0] < memory[1] and memory[7] < memory[6]
