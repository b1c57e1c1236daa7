#!/bin/bash
# #40 on 2 GPUs, seventh round: how an eager MoE layer's host time in the model compares with the testbench block's,
# on one host. Host E's testbench block took ~1.6x host D's while its steps ran 5% slower (moe_r6_h200_x2), so the
# empty-queue testbench level is not the in-model pace everywhere. PART=run measures the three-process floors
# (`--measure-host-floor`), then runs gpt-oss-20b (dropless ep 1 / ep 2, padded ep 2) and Mixtral-8x7B (ep 1 / ep 2)
# with every layer's host time recorded (`host_timing`). PART=probe runs the same models at 512 tokens, where the GPU
# finishes each kernel before the host issues the next, with run's floors (CAL). PART=grok: a torch-profiler trace of
# Grok-1's one-rank MoE block at 8192 tokens, whose forward ran 21% over the model (grok_moe_block_h200).
# The predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_moe_r7[_probe]_layouts.json --dry-run --json` >
# benchmarks/results/moe_r7_h200_x2/predicted_default[_probe].json); run's with this host's floors are in its
# results.jsonl, made after the floors and before the steps.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~5 min each):
#     PART=run bash benchmarks/validation/x2_moe_r7.sh
#     PART=probe CAL=outputs/x2_moe_r7_run/run/host_floor/host_floor.calibration.json bash ...
#     PART=grok bash benchmarks/validation/x2_moe_r7.sh
# Unpack each part's "$OUT"/evidence.tgz in benchmarks/results/moe_r7_h200_x2/PART.
PART="${PART:-run}"
OUT="${OUT:-$PWD/outputs/x2_moe_r7_$PART}"
source "$(dirname "$0")/common.sh"
record_gpus
case "$PART" in
  run) validate_part x2_moe_r7_layouts.json ;;
  probe) validate_part x2_moe_r7_probe_layouts.json ;;
  grok)
    EV="$OUT/evidence"
    mkdir -p "$EV/testbench/collect" "$EV/traces"
    record_versions "$EV"
    $MAT profile --case-file "$HERE/../testbench/h200_grok_moe_profile_cases.json" --mode torch-profile --warmup 5 \
      --repeats 10 --case-timeout 240 --output-dir "$OUT/testbench" --json > "$EV/summary.json"
    echo "testbench rc=$? ($(elapsed))"
    cp "$OUT/testbench"/collect/*.jsonl "$EV/testbench/collect/" 2>/dev/null
    for trace in $(find "$OUT/testbench/torch_profiler" -name '*.json*' | head -4); do
      summarize_trace "$trace" "$EV/traces/$(basename "$(dirname "$trace")").$(basename "$trace" | cut -d. -f1).summary.json"
      cp "$trace" "$EV/traces/"
    done
    cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
    finish "$EV"
    ;;
  *) echo "PART must be run, probe or grok" >&2; exit 2 ;;
esac
