"""Ground truth for uneven pipeline layouts: real megatron-core 0.16.1 `GPTModel` chunks built on CPU with
`pipeline_model_parallel_layout`, `num_layers_in_first/last_pipeline_stage` and
`account_for_embedding/loss_in_pipeline_split`; each rank's layers and parameters must equal
`stage_parameters` / `stage_layer_range` under the same `PipelineLayout` (see tests/mcore_helpers.py)."""

from __future__ import annotations

import pytest

from megatron_autotuner.specs.model import ModelSpec
from megatron_autotuner.specs.parallel import ParallelConfig
from megatron_autotuner.specs.pipeline import PipelineLayout
from megatron_autotuner.theory.params import stage_layer_range, stage_parameters
from tests.mcore_helpers import McoreCase

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

pytestmark = pytest.mark.mcore

LLAMA = ModelSpec(
    name="llama",
    hidden_size=64,
    num_layers=6,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=160,
    vocab_size=1024,
)
LLAMA8 = LLAMA.replace(name="llama8", num_layers=8)
MTP_MOE = ModelSpec(
    name="mtp-moe",
    hidden_size=64,
    num_layers=3,
    num_attention_heads=4,
    ffn_hidden_size=256,
    vocab_size=1024,
    num_moe_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=64,
    moe_layer_pattern=(0, 1, 1),
    mtp_num_layers=1,
)

# (case, the same layout as a PipelineLayout)
CASES: list[tuple[McoreCase, PipelineLayout]] = [
    (
        McoreCase(
            "account-emb-loss-pp2-vpp2",
            LLAMA.to_dict(),
            world=2,
            pp=2,
            vpp=2,
            pipeline=(("account_for_embedding_in_pipeline_split", True), ("account_for_loss_in_pipeline_split", True)),
        ),
        PipelineLayout.accounting(6, pp=2, vpp=2),
    ),
    (
        McoreCase(
            "account-loss-pp2",
            LLAMA.replace(num_layers=5).to_dict(),
            world=2,
            pp=2,
            pipeline=(("account_for_loss_in_pipeline_split", True),),
        ),
        PipelineLayout.accounting(5, pp=2, embedding=False, loss=True),
    ),
    (
        McoreCase(
            "first1-last3-pp4",
            LLAMA8.to_dict(),
            world=4,
            pp=4,
            pipeline=(("num_layers_in_first_pipeline_stage", 1), ("num_layers_in_last_pipeline_stage", 3)),
        ),
        PipelineLayout.first_last(8, pp=4, first=1, last=3),
    ),
    (
        # pp=4: megatron-core 0.16.1 divides by zero with first + last + vpp and no middle rank (pp=2)
        McoreCase(
            "first2-last4-pp4-vpp2",
            LLAMA.replace(num_layers=10).to_dict(),
            world=4,
            pp=4,
            vpp=2,
            pipeline=(("num_layers_in_first_pipeline_stage", 2), ("num_layers_in_last_pipeline_stage", 4)),
        ),
        PipelineLayout.first_last(10, pp=4, vpp=2, first=2, last=4),
    ),
    (
        McoreCase(
            "layout-empty-ends-pp2-vpp2",
            LLAMA.to_dict(),
            world=2,
            pp=2,
            vpp=2,
            pipeline=(("pipeline_model_parallel_layout", "E|ttt|ttt|L"),),
        ),
        PipelineLayout.from_string("E|ttt|ttt|L", pp=2),
    ),
    (
        McoreCase(
            "layout-mtp-moe-pp2-vpp2",
            MTP_MOE.to_dict(),
            world=2,
            pp=2,
            vpp=2,
            pipeline=(("pipeline_model_parallel_layout", "Et|t|t|mL"),),
        ),
        PipelineLayout.from_string("Et|t|t|mL", pp=2),
    ),
    (
        McoreCase(
            "layout-mtp-tp2-pp2",
            MTP_MOE.to_dict(),
            world=4,
            tp=2,
            pp=2,
            pipeline=(("pipeline_model_parallel_layout", "Ett|tmL"),),
        ),
        PipelineLayout.from_string("Ett|tmL", pp=2),
    ),
]
IDS = [case.name for case, _ in CASES]


MCORE_CASES = [case for case, _ in CASES]  # built by conftest's `mcore_ground_truth`


@pytest.fixture(scope="module")
def mcore_counts(mcore_ground_truth) -> dict:
    return mcore_ground_truth


@pytest.mark.parametrize(("case", "layout"), CASES, ids=IDS)
def test_uneven_stage_layers_and_parameters_match_megatron_core(mcore_counts, case: McoreCase, layout):
    ranks = mcore_counts.get(case.name)
    assert ranks, f"no result for {case.name}"
    errors = [r["error"] for r in ranks if "error" in r]
    assert not errors, f"megatron-core failed to build {case.name}:\n{errors[0]}"
    spec = ModelSpec.from_dict(case.spec)
    parallel = ParallelConfig(num_gpus=case.world, tp=case.tp, pp=case.pp, pipeline_layout=layout)
    assert parallel.vpp == case.vpp
    assert sorted({r["pp_rank"] for r in ranks}) == list(range(case.pp))
    for rank in ranks:
        stage = rank["pp_rank"]
        where = f"{case.name}: rank {rank['rank']} (pp_rank {stage})"
        assert rank["other"] == {}, where
        assert rank["layers"] == stage_layer_range(spec, parallel, stage), where
        assert rank["counts"] == stage_parameters(spec, parallel, stage).to_dict(), where
