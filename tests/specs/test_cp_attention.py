"""Context parallelism runs sliding windows and attention sinks only where Transformer Engine does (a2a, or
all-gather for a window alone): the rule refuses the rest, and the search picks a2a for such models."""

from __future__ import annotations

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, Workload, load_model_spec
from megatron_autotuner.specs.parallel import cp_comm_type_for, validate_layout

W = Workload(32768, 1, 64)


def test_sinks_and_windows_need_a2a_context_parallelism():
    oss = load_model_spec("gpt-oss-20b")
    with pytest.raises(ConfigError, match="cp_comm_type: p2p: sliding-window attention"):
        validate_layout(oss, ParallelConfig(8, cp=2, ep=4), W)
    with pytest.raises(ConfigError, match="cp_comm_type: allgather: softmax_type learnable"):
        validate_layout(oss, ParallelConfig(8, cp=2, ep=4, cp_comm_type="allgather"), W)
    validate_layout(oss, ParallelConfig(8, cp=2, ep=4, cp_comm_type="a2a"), W)
    # a window alone also runs with all-gather (Mistral)
    windowed = load_model_spec("Llama-3.1-8B").replace(window_size=4096)
    validate_layout(windowed, ParallelConfig(8, cp=2, cp_comm_type="allgather"), W)
    assert cp_comm_type_for(oss, 2) == "a2a" and cp_comm_type_for(oss, 1) == "p2p"
    assert cp_comm_type_for(load_model_spec("Llama-3.1-8B"), 4) == "p2p"


def test_a2a_splits_each_tp_rank_s_heads_over_cp():
    oss = load_model_spec("gpt-oss-20b")  # 64 heads
    with pytest.raises(ConfigError, match="cp=.*must divide"):
        validate_layout(
            oss.replace(num_attention_heads=48, num_query_groups=8),
            ParallelConfig(64, tp=8, cp=8, ep=8, etp=1, sequence_parallel=True, cp_comm_type="a2a"),
            Workload(32768, 1, 64),
        )
