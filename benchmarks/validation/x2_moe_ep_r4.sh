#!/bin/bash
# #40 on 2 GPUs, fourth round: the second round's layouts (x2_moe_ep_overlap_r2.sh) on another 2-GPU host, the overlap
# without --delay-wgrad-compute (it slowed the overlap 5-12% in rounds 2 and 3), with this host's floors measured
# first. The second round ran ep 2 12-17% over its prediction on a host whose testbench floor grew 0.25 ms per local
# expert; x2_moe_ep_host.sh then found, on a host with a flatter floor, ep 2 within 10% and a rank's MoE host
# growing with its local experts, not the model's. Two parts, each under one device call: PART=oss (gpt-oss-20b,
# measures the floors) then PART=mixtral (Mixtral-8x7B, with CAL, the first part's host_floor.calibration.json).
# The predictions with the default floors were written first (`mat validate --layouts <part's layouts> --dry-run
# --json` > benchmarks/results/moe_ep_r4_h200_x2/predicted_default_<part>.json).
# PART=diag (with CAL) then records the allocator history of Mixtral's ep 1 and overlap layouts, whose reserved
# memory ran 7-13% over the prediction with the allocated peak within 5%, and profiles the padded ep 2 layout.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~4 min each):
#     PART=oss bash benchmarks/validation/x2_moe_ep_r4.sh
#     PART=mixtral CAL=$OUT/oss/run/host_floor/host_floor.calibration.json bash benchmarks/validation/x2_moe_ep_r4.sh
# Unpack each part's "$OUT"/<part>/evidence.tgz in benchmarks/results/moe_ep_r4_h200_x2/<part>.
case "${PART:-}" in
  oss) LAYOUTS=x2_moe_ep_r4_layouts.json ;;
  mixtral) LAYOUTS=x2_moe_ep_r4_mixtral_layouts.json ;;
  diag) LAYOUTS=x2_moe_ep_r4_diag_layouts.json ;;
  *) echo "PART must be oss, mixtral or diag" >&2; exit 2 ;;
esac
OUT="${OUT:-$PWD/outputs/x2_moe_ep_r4}/$PART"
source "$(dirname "$0")/common.sh"
record_gpus
validate_part "$LAYOUTS"
