#!/bin/bash
source "${GPU_ENV:-/root/gpu/env.sh}"
# First GPU check of the activation-offloading model (costmodel/activation_offload.py, theory/memory.py) on one H100:
# Llama-3.1-8B cut to 4 layers and Qwen3-0.6B (28 layers), seq 4096, micro-batch 1, 4 micro-batches, bf16 training,
# each without offloading, with megatron-core's fine-grained offloading of core_attn + attn_proj, and (Llama) with
# Transformer Engine's layer-level offloading of 2 layers. `mat validate` writes its predictions before the runs.
#     bash benchmarks/validation/h100_x1_activation_offload.sh          (~4 min of GPU time; extra arguments go to
#     mat validate, e.g. --dry-run for the predictions alone)
# Transformer Engine reads NVTE_CPU_OFFLOAD_V1 once, at import, and the two mechanisms want it differently: Megatron-LM
# refuses fine-grained offloading with TE >= 2.10 unless it is 1, and the layer-level prediction is TE's default
# (non-V1) path. So the layouts run as two batches: fine_grained (baselines + fine-grained, NVTE_CPU_OFFLOAD_V1=1)
# and layer_level (unset); `mat validate` refuses a layout whose environment is wrong (runner.offload_env_problem).
# The runs' output stays in RUN_DIR (outside $OUT: few files come back from there); what comes back is
# $OUT/activation_offload.tgz and the two logs. Unpack the archive into benchmarks/results/validation_h100_x1/
# (-> activation_offload/{fine_grained,layer_level}).
RESULT="${OUT:-$PWD/outputs/h100_x1_activation_offload}"
OUT="${RUN_DIR:-/tmp/h100_x1_activation_offload}"
source "$(dirname "$0")/common.sh"
mkdir -p "$RESULT"
record_gpus
LAYOUTS="${LAYOUTS:-$HERE/h100_x1_activation_offload_layouts.json}"
# the copies are predicted at the host-copy bandwidth measured on this machine kind beside GEMMs (`mat profile --mode
# copy-bandwidth`, the table costmodel.activation_offload reads), not the host link's spec peak
COPY_CAL="${COPY_CAL:-$HERE/../results/testbench_h100_x1/host_floor/copy.calibration.json}"
# split the layouts file by the NVTE_CPU_OFFLOAD_V1 each layout needs
$PY - "$LAYOUTS" "$OUT" <<'PYEOF' || exit 1
import json
import sys
from pathlib import Path

data = json.loads(Path(sys.argv[1]).read_text())
layer = [x for x in data["layouts"] if (x.get("activation_offload") or {}).get("num_layers")]
rest = [x for x in data["layouts"] if x not in layer]
for name, part in (("fine_grained", rest), ("layer_level", layer)):
    Path(sys.argv[2], f"{name}_layouts.json").write_text(json.dumps({**data, "layouts": part}, indent=1))
    print(f"{name}: {len(part)} layout(s)")
PYEOF
( export NVTE_CPU_OFFLOAD_V1=1; validate_batch "$OUT/fine_grained_layouts.json" fine_grained 240 --calibration "$COPY_CAL" "$@" )
( unset NVTE_CPU_OFFLOAD_V1; validate_batch "$OUT/layer_level_layouts.json" layer_level 240 --calibration "$COPY_CAL" "$@" )
EVIDENCE="$OUT/activation_offload"
collect_batch fine_grained "$EVIDENCE/fine_grained"
collect_batch layer_level "$EVIDENCE/layer_level"
finish "$EVIDENCE"
cp "$EVIDENCE.tgz" "$OUT/fine_grained.txt" "$OUT/layer_level.txt" "$RESULT/"
echo "results in $RESULT (unpack activation_offload.tgz into benchmarks/results/validation_h100_x1/)"
