#!/bin/bash
# #40: how repeatable the testbench's MoE host floor is on one host. Round 5 (x2_moe_r5.sh PART=more) fitted
# gpt-oss-20b's backward floor to 7.5 ms at 16 local experts and 14.1 ms at 32 (std 1.6 and 3.2 ms over 20 repeats),
# a slope that predicted ep 1 14% slow where ep 2 came within 1%. This times the same two cases ROUNDS times, each
# in its own process as `--measure-host-floor` does (warm-up 5, 20 repeats), and writes every record.
# From the repository root on a GPU host after ../shared/gpu's install (~3 min):
#     bash benchmarks/validation/x2_moe_floor_repeat.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_floor_repeat_h200.
OUT="${OUT:-$PWD/outputs/x2_moe_floor_repeat}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV/collect"
for round in $(seq 1 "${ROUNDS:-3}"); do
  $PY - "$HERE/x2_moe_r5_oss_layouts.json" "$OUT/round$round" <<'PY'
import sys
from pathlib import Path

from megatron_autotuner.testbench.launcher import run_cases
from megatron_autotuner.validate.host_floor import host_floor_cases
from megatron_autotuner.validate.layout import load_layouts_file

layouts, out = load_layouts_file(Path(sys.argv[1]))[0], Path(sys.argv[2])
run_cases(host_floor_cases(layouts, out / "models"), out, warmup=5, repeats=20, progress=False)
PY
  for f in "$OUT/round$round"/collect/*.jsonl; do cp "$f" "$EV/collect/round${round}_$(basename "$f")"; done
  echo "round $round done ($(elapsed))"
done
finish "$EV"
