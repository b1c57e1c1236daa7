#!/bin/bash
# fp8 recipes and fp8 parameters (Megatron-LM --fp8-recipe delayed|tensorwise, --fp8-param-gather; layout fields
# fp8_recipe / fp8_param) on nvidia-h200-x2: 6 layouts of an 8-layer Llama-3.1-8B at s8192, fp8, expandable
# segments on (h200_x2_fp8_recipes_layouts.json). What the cost model predicts from byte counts and checks here:
# - tensorwise (current scaling) reads every fp8-cast tensor once more for its amax: steps ~1.5% longer
#   (dp2 0.766 -> 0.777 s); the two profiled dp2 runs give the cast / amax kernels' time directly;
# - fp8 parameters keep TE linear weights as fp8 + transpose instead of bf16 + TE's cached fp8 copy: 2 bytes per
#   decoder parameter less (dp2 peak 52.41 -> 49.16 GiB, tp2 sp 35.47 -> 33.85 GiB), all-gathered in fp8;
# - a forward-only fp8 pass (no_grad) caches the fp8 weights without transposes: weights 6.83 GiB against 5.21
#   for the bf16 forward beside it (+1 byte per decoder parameter, not +2).
# ~6 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h200_x2_fp8_recipes.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h200_x2/fp8_recipes.
OUT="${OUT:-$PWD/outputs/h200_x2_fp8_recipes}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h200_x2_fp8_recipes_layouts.json" run 200
collect_batch run "$OUT/evidence"
finish "$OUT/evidence"
