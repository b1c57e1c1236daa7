#!/bin/bash
# The ranking benchmark on one 4-GPU host (nvidia-h200-x4 or -h100-x4), and the collectives and communicator memory
# the cost model needs at 2 and 4 GPUs. Run from the repository root on the GPU machine, after ../shared/gpu's install:
#     bash benchmarks/validation/x4_plan_regret.sh part1   # the two dense cases                         ~8 min
#     bash benchmarks/validation/x4_plan_regret.sh part2   # the two MoE cases, then NCCL sweeps / memory ~8 min
#     bash benchmarks/validation/x4_plan_regret.sh r2      # round 2 (plan_regret.CASES_R2): two new cases ~9 min
#     bash benchmarks/validation/x4_plan_regret.sh r3      # round 3 (plan_regret.CASES_R3): the two MoE cases ~9 min
#     bash benchmarks/validation/x4_plan_regret.sh r3b     # round 3's dense case (resumes what r3 left)
#     bash benchmarks/validation/x4_plan_regret.sh r4      # round 4 (CASES_R4, expandable segments): the MoE cases
#     bash benchmarks/validation/x4_plan_regret.sh r4b     # round 4's dense case (resumes what r4 left)
#     bash benchmarks/validation/x4_plan_regret.sh r5      # round 5 (CASES_R5): the two dense cases   ~9 min
#     bash benchmarks/validation/x4_plan_regret.sh r5b     # round 5's MoE cases                       ~9 min
#     bash benchmarks/validation/x4_plan_regret.sh r5c     # resumes whatever r5 / r5b left
# Each part stops starting layouts at its deadline (DEADLINE_S, default 540 s) and packs what it has; a part run again
# on the same machine resumes (mat validate skips finished layouts). The layouts and the predictions made before the
# runs come from `python benchmarks/plan_regret.py predict` (x4_plan_regret_<h100|h200>_layouts.json,
# benchmarks/results/plan_regret_<kind>_x4/predicted.json). Copy "$OUT"/evidence.tgz's folder to
# benchmarks/results/plan_regret_<kind>_x4/ and run `python benchmarks/plan_regret.py report`.
PART="${1:?part1 or part2}"
OUT="${OUT:-$PWD/outputs/x4_plan_regret}"
source "$(dirname "$0")/common.sh"
DEADLINE_S="${DEADLINE_S:-540}"
record_gpus
case "$(head -1 "$OUT/gpus.txt")" in
  *H200*) KIND=h200 ;;
  *H100*) KIND=h100 ;;
  *) echo "not an H100 or H200: $(head -1 "$OUT/gpus.txt")"; exit 3 ;;
esac
SUFFIX=""
[ "$PART" = r2 ] && SUFFIX="_r2"
case "$PART" in r3*) SUFFIX="_r3" ;; r4*) SUFFIX="_r4" ;; r5*) SUFFIX="_r5" ;; esac
LAYOUTS="$HERE/x4_plan_regret_${KIND}${SUFFIX}_layouts.json"
# one layouts file per case (the case is the first word of each layout's name)
$PY - "$LAYOUTS" "$OUT" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
cases = {}
for lay in doc["layouts"]:
    cases.setdefault(lay["name"].split()[0], []).append(lay)
for case, lays in cases.items():
    json.dump({"gpu": doc["gpu"], "layouts": lays}, open(f"{sys.argv[2]}/{case}.layouts.json", "w"), indent=1)
print(" ".join(cases))
EOF

left() { echo $(( DEADLINE_S - ($(date +%s) - START) )); }

# run_case CASE: its layouts into "$OUT/CASE" until the deadline
run_case() {
  local t
  t=$(left)
  [ "$t" -gt 45 ] || { echo "deadline: $1 not started"; return; }
  echo "== $1 ($t s left)"
  timeout -k 15 "$t" $VALIDATE --layouts "$OUT/$1.layouts.json" --output-dir "$OUT/$1" --timeout-s 150 \
    2>&1 | tee -a "$OUT/$1.txt"
}

# run_torch NAME SCRIPT ARGS: a torch-only benchmark on all 4 GPUs, bounded by the deadline
run_torch() {
  local name=$1 t
  shift
  t=$(left)
  [ "$t" -gt 30 ] || { echo "deadline: $name not started"; return; }
  echo "== $name ($t s left)"
  timeout -k 10 "$t" torchrun --nproc-per-node=4 "$@" 2>&1 | tail -40 | tee "$OUT/$name.txt"
}

if [ "$PART" = part1 ]; then
  run_case qwen3-4b
  run_case llama31-8b
elif [ "$PART" = r2 ]; then
  run_case qwen3-8b-s4096
  run_case qwen3-moe-e32-12l-s8192
elif [ "$PART" = r3 ]; then
  run_case mixtral-8l-s4096
  run_case qwen3-moe-e128-8l
elif [ "$PART" = r4 ]; then
  run_case qwen3-235b-4l
  run_case mixtral-6l-s8192
elif [ "$PART" = r4b ]; then
  run_case llama31-70b-8l
  run_case mixtral-6l-s8192   # resumes what r4 left
elif [ "$PART" = r5 ]; then
  run_case qwen25-7b-s8192
  run_case qwen3-1.7b-s16384
elif [ "$PART" = r5b ]; then
  run_case qwen15-moe-a2.7b
  run_case moonlight-8l
elif [ "$PART" = r5c ]; then
  for c in qwen25-7b-s8192 qwen3-1.7b-s16384 qwen15-moe-a2.7b moonlight-8l; do run_case "$c"; done
elif [ "$PART" = r3b ]; then
  run_case qwen3-32b-16l
  run_case qwen3-moe-e128-8l   # resumes what r3 left
else
  run_case qwen3-moe-e32-24l
  run_case qwen3-moe-e64-12l
  run_case qwen3-4b        # resumes what part1 left
  run_case llama31-8b
  run_torch nccl_memory benchmarks/validation/nccl_memory.py --out "$OUT/nccl_memory_x4.json"
  run_torch nccl_sweep benchmarks/nccl_sweep.py --out "$OUT/nccl_sweep_x4.json" --min-log2 12 --max-log2 30 --iters 10
fi

EV="$OUT/evidence"
for c in qwen3-4b llama31-8b qwen3-moe-e32-24l qwen3-moe-e64-12l qwen3-8b-s4096 qwen3-moe-e32-12l-s8192 \
  mixtral-8l-s4096 qwen3-moe-e128-8l qwen3-32b-16l qwen3-235b-4l llama31-70b-8l mixtral-6l-s8192 \
  qwen25-7b-s8192 qwen3-1.7b-s16384 qwen15-moe-a2.7b moonlight-8l; do
  [ -d "$OUT/$c" ] && collect_batch "$c" "$EV/$c"
done
cp "$OUT"/nccl_*.json "$OUT"/nccl_*.txt "$EV/" 2>/dev/null
finish "$EV"
