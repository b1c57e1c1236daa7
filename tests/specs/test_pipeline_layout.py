"""`PipelineLayout`: Megatron's layout strings and uneven-pipeline rules, from its docs, tests and code."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.pipeline import PipelineLayout, compress_layout, parse_layout_string


def test_parser_on_the_example_in_megatron_core_code():
    # megatron/core/transformer/pipeline_parallel_layer_layout.py, parse_str_to_list docstring:
    # "Ettt|(tt|)*29,m|L" -> [["E","t","t","t"]]+[["t","t"]]*29+[["m"],["L"]]
    assert parse_layout_string("Ettt|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]


def test_megatron_docs_deepseek_v3_layout_pp16_vpp2():
    # docs/user-guide/features/pipeline_parallel_layout.md: 61 decoder layers + 1 MTP layer with PP16, VPP2
    layout = PipelineLayout.from_string("Et*3|(tt|)*29,m|L", pp=16)
    assert layout.vpp == 2
    assert layout.num_layers == 61 and layout.mtp_num_layers == 1
    assert layout.stage(0, 0) == "Ettt" and layout.stage(15, 1) == "L" and layout.stage(14, 1) == "m"
    assert layout.rank_layers(0) == [0, 1, 2, 33, 34]  # chunk 1 of rank 0 is virtual stage 16: 3 + 15 x 2
    assert layout.rank_mtp_layers(14) == 1 and layout.rank_embedding_copies(14) == 1


@pytest.mark.parametrize(
    ("text", "pp", "vpp", "layers", "mtp"),
    [
        # NVIDIA's DeepSeek-V3 recipe (TP2 PP8 VPP4 EP64)
        ("Et|(tt|)*30mL", 8, 4, 61, 1),
        # Megatron-LM functional tests (tests/functional_tests/test_cases/.../model_config.yaml)
        ("Et*2|(tt|)*5t|tmL", 4, 2, 14, 1),
        ("Et*7|t*7mL", 2, 1, 14, 1),
        ("Et*3|(tt|)*6tmL", 2, 4, 16, 1),
        ("Et*3|(tt|)*6L", 2, 4, 15, 0),
    ],
)
def test_layouts_from_megatron_recipes_and_tests(text, pp, vpp, layers, mtp):
    layout = PipelineLayout.from_string(text, pp)
    assert (layout.vpp, layout.num_layers, layout.mtp_num_layers) == (vpp, layers, mtp)
    # every decoder layer on exactly one rank, in order within each chunk
    seen = sorted(i for r in range(pp) for i in layout.rank_layers(r))
    assert seen == list(range(layers))
    assert PipelineLayout.from_string(layout.to_string(), pp).stages == layout.stages


@pytest.mark.parametrize(
    ("text", "pp", "needle"),
    [
        ("Et|tx|L", 3, "invalid layer character 'x'"),
        ("tE|tt|L", 3, "'E' must come first"),
        ("Et|tt|tL|t", 2, "'L' must come last"),
        ("Et|tt|L", 2, "not divisible by pipeline_model_parallel_size=2"),
        ("Et|mt|tL", 3, "decoder layers 't' must come before MTP layers 'm'"),
        ("Et|m|t|L", 2, "decoder layers 't' must come before"),
    ],
)
def test_bad_layout_strings_are_config_errors(text, pp, needle):
    with pytest.raises(ConfigError, match="pipeline_model_parallel_layout") as info:
        PipelineLayout.from_string(text, pp)
    assert needle in str(info.value)


def test_accounting_for_embedding_and_loss_405b():
    # NVIDIA's Llama-3.1-405B recipe: 126 layers + embedding + loss = 128 = 8 x 8 x 2
    layout = PipelineLayout.accounting(126, pp=8, vpp=8)
    assert layout.vpp == 8 and layout.num_layers == 126
    assert layout.stage(0, 0) == "Et" and layout.stage(7, 7) == "tL"
    assert all(layout.stage(r, c) == "tt" for r in range(8) for c in range(8) if (r, c) not in ((0, 0), (7, 7)))
    assert len(layout.rank_layers(0)) == 15 and len(layout.rank_layers(3)) == 16
    assert layout.megatron_args() == {
        "num_virtual_stages_per_pipeline_rank": 8,
        "account_for_embedding_in_pipeline_split": True,
        "account_for_loss_in_pipeline_split": True,
    }
    with pytest.raises(ConfigError, match="must be divisible by pp\\*vpp"):
        PipelineLayout.accounting(126, pp=8, vpp=8, loss=False)


def test_first_and_last_stage_counts_follow_megatron_core_rules():
    layout = PipelineLayout.first_last(94, pp=8, first=10, last=12)  # 72 middle layers over 6 ranks
    assert [len(layout.rank_layers(r)) for r in range(8)] == [10, 12, 12, 12, 12, 12, 12, 12]
    with_vpp = PipelineLayout.first_last(30, pp=4, vpp=2, first=4, last=6)  # middle: 20 / 2 ranks = 10 = 2 x 5
    assert with_vpp.decoder_counts == (2, 5, 5, 3, 2, 5, 5, 3)
    with pytest.raises(ConfigError, match="divisible by the virtual pipeline size 2"):
        PipelineLayout.first_last(30, pp=4, vpp=2, first=3, last=5)
    with pytest.raises(ConfigError, match="middle"):
        PipelineLayout.first_last(31, pp=4, first=4, last=6)


def test_even_layout_matches_interleaved_chunk_assignment():
    # megatron-core transformer_block.py: 8 layers, 2 stages, 4 chunks -> stage 0: [0] [2] [4] [6]
    layout = PipelineLayout.even(8, pp=2, vpp=4)
    assert layout.rank_layers(0) == [0, 2, 4, 6] and layout.rank_layers(1) == [1, 3, 5, 7]
    assert PipelineLayout.even(8, pp=2, vpp=2).rank_layers(0) == [0, 1, 4, 5]


@given(st.lists(st.integers(0, 6), min_size=1, max_size=24), st.integers(0, 2))
def test_compressed_spelling_parses_back_to_the_same_stages(counts, mtp):
    stages = PipelineLayout.from_counts(counts, pp=1, mtp_num_layers=mtp).stages
    assert tuple(parse_layout_string(compress_layout(stages))) == stages
