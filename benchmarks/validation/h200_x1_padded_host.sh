#!/bin/bash
# #40 on one H200: where a padded (drop-and-pad) MoE layer's host time goes. On 2-GPU hosts the padded gpt-oss-20b
# step ran 15-27% over the model, whose padded layer issues the block's testbench floor plus half a dense layer's
# (`LayerContext.moe_host_issue_ahead`, an assumption for the attention half); host D's padded layers took 11.1-11.4 ms
# forward and 10.8-11.1 ms backward to issue (benchmarks/results/moe_r5_h200_x2/more). A padded block never waits for
# the token counts, so its layers' host times (`Layout.host_timing`) are issue times: this records them at 16 and 32
# local experts and for Mixtral, beside the dropless layer and the three-process floors measured first.
# The predictions were written first (`mat validate --layouts benchmarks/validation/h200_x1_padded_host_layouts.json
# --dry-run --json` > benchmarks/results/padded_host_h200/predicted_default.json).
# From the repository root on a 1-GPU host after ../shared/gpu's install (~5 min):
#     bash benchmarks/validation/h200_x1_padded_host.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/padded_host_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_padded_host}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_part h200_x1_padded_host_layouts.json
