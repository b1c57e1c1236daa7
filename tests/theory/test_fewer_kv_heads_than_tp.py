"""More TP ranks than K / V heads (megatron-core allows num_query_groups to be a divisor of the TP size: Qwen3-30B-A3B's
4 groups at TP 8, Nemotron-3-Nano's 2 at TP 8 in verl's example). megatron-core keeps linear_qkv split evenly over TP,
all-gathers its output over TP and gives each rank one group's K and V with its own query heads
(transformer/attention.py SelfAttention.__init__ and get_query_key_value_tensors)."""

from __future__ import annotations

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.loader import load_model_spec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload, validate_layout
from megatron_autotuner.theory.comm import stage_comm_volumes
from megatron_autotuner.theory.memory import attention_activation_bytes

WORKLOAD = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=8)


@pytest.fixture(scope="module")
def model():
    return load_model_spec("Qwen3-30B-A3B").with_num_layers(4)  # 32 query heads, 4 groups


def _tp(n: int) -> ParallelConfig:
    return ParallelConfig(num_gpus=n, tp=n, sequence_parallel=True)


def test_a_divisor_of_tp_is_a_layout_megatron_builds(model):
    validate_layout(model, _tp(8), WORKLOAD)
    with pytest.raises(ConfigError, match="multiple or a divisor of tp=8"):
        validate_layout(model.replace(num_attention_heads=24, num_query_groups=3), _tp(8), WORKLOAD)


def test_each_rank_keeps_one_groups_k_and_v(model):
    four, eight = (attention_activation_bytes(model, _tp(n), WORKLOAD) for n in (4, 8))
    assert eight["k_v"] == four["k_v"] == 2 * 4096 * 2 * model.kv_channels  # bf16 K and V of one group
    assert eight["q"] == pytest.approx(four["q"] / 2)


def test_the_qkv_output_is_gathered_over_tp_only_past_the_groups(model):
    def gathers(tp: int) -> list:
        qkv_all = 2 * 4096 * model.qkv_projection_size
        return [
            v for v in stage_comm_volumes(model, _tp(tp), WORKLOAD, 0)
            if v.collective == "all_gather" and v.message_bytes == qkv_all
        ]  # fmt: skip

    assert gathers(4) == []
    (gather,) = gathers(8)
    assert gather.group_size == 8 and gather.calls == 4 * 8  # one per attention layer and micro-batch (8)
