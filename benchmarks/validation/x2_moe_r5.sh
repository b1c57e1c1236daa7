#!/bin/bash
# #40 on 2 GPUs, fifth round, one host. PART=disp: the allgather dispatcher against alltoall (Mixtral-8x7B L2 ep 2),
# both unprofiled and both profiled, with this host's floors measured first. The fourth round's pair ran allgather
# 8.7% faster where the model has it 1.2% slower, but there the alltoall step was host-timed and the allgather one
# profiled, and alltoall was never profiled; here both run the same way. PART=more (with CAL, the first part's
# host_floor.calibration.json): a padded Mixtral layout no run had, the EP overlap with and without
# --delay-wgrad-compute on Mixtral, and gpt-oss-20b's padded layout with its layers' host issue times recorded.
# The predictions with the default floors were written first (`mat validate --layouts <part's layouts> --dry-run
# --json` > benchmarks/results/moe_r5_h200_x2/predicted_default_<part>.json).
# PART=diag (with CAL): the allocator history of the padded Mixtral layout, whose reserved peak came out 7.5% over the
# prediction, and profiles of Mixtral's overlap with and without --delay-wgrad-compute (12.6% apart in PART=more).
# PART=oss (with CAL): gpt-oss-20b at ep 1 and 2, with and without the overlap, and its padded layout profiled,
# predicted with this host's floors (PART=more's) before the run (predicted_host_oss.json) as well as the default's.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~4 min each):
#     PART=disp bash benchmarks/validation/x2_moe_r5.sh
#     PART=more CAL=$OUT/disp/run/host_floor/host_floor.calibration.json bash benchmarks/validation/x2_moe_r5.sh
# Unpack each part's "$OUT"/<part>/evidence.tgz in benchmarks/results/moe_r5_h200_x2/<part>.
case "${PART:-}" in
  disp) LAYOUTS=x2_moe_r5_disp_layouts.json ;;
  more) LAYOUTS=x2_moe_r5_more_layouts.json ;;
  diag) LAYOUTS=x2_moe_r5_diag_layouts.json ;;
  oss) LAYOUTS=x2_moe_r5_oss_layouts.json ;;
  *) echo "PART must be disp, more, diag or oss" >&2; exit 2 ;;
esac
OUT="${OUT:-$PWD/outputs/x2_moe_r5}/$PART"
source "$(dirname "$0")/common.sh"
record_gpus
validate_part "$LAYOUTS"
