#!/bin/bash
# Sourced (never run) by the GPU evidence scripts of this folder, after they set OUT:
#     OUT="${OUT:-$PWD/outputs/NAME}"; source "$(dirname "$0")/common.sh"
# Sets the GPU machine's environment (../shared/gpu: /root/gpu/env.sh keeps NVLink multicast off), PYTHONPATH to
# this checkout, PY / MAT / VALIDATE / HERE / START, and the helpers that copy small evidence files out of "$OUT".
set -uo pipefail
# GPU_ENV: the environment file of ../shared/gpu's install (a CPU test of these helpers points it elsewhere)
source "${GPU_ENV:-/root/gpu/env.sh}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PY:-python}"
MAT="$PY -m megatron_autotuner.cli"
VALIDATE="$PY -m megatron_autotuner.validate"
HERE="$(dirname "${BASH_SOURCE[1]}")"
START=$(date +%s)

# Seconds since the calling script started.
elapsed() { echo "$(( $(date +%s) - START )) s"; }

# copy_runs SRC DEST: a validate output folder's summary, results and layouts, and the per-rank records the CPU
# tests re-aggregate (SRC/runs/*.jsonl).
copy_runs() {
  mkdir -p "$2/runs"
  cp "$1/summary.json" "$1/results.jsonl" "$1/layouts.json" "$2/" 2>/dev/null
  cp "$1"/runs/*.jsonl "$2/runs/" 2>/dev/null
}

# copy_traces SRC DEST: the rank-0 torch-profiler trace of every profiled layout under SRC/traces/, with its
# `mat trace summary --json`, as DEST/NAME.rank_0.json.gz and DEST/NAME.summary.json.
copy_traces() {
  mkdir -p "$2"
  local trace name
  for trace in "$1"/traces/*/rank_0.json.gz; do
    [ -f "$trace" ] || { echo "no trace found under $1/traces"; return; }
    name=$(basename "$(dirname "$trace")")
    cp "$trace" "$2/$name.rank_0.json.gz"
    summarize_trace "$trace" "$2/$name.summary.json"
  done
}

# copy_rank_traces NAME DEST: every rank's raw torch-profiler trace that validate_batch NAME recorded, as
# DEST/LAYOUT.rank_R.json.gz (both ranks' spans and waits can then be read off the machine).
copy_rank_traces() {
  local trace
  mkdir -p "$2"
  for trace in "$OUT/$1"/traces/*/rank_*.json.gz; do
    [ -f "$trace" ] || continue
    cp "$trace" "$2/$(basename "$(dirname "$trace")").$(basename "$trace")"
  done
}

# summarize_rank_traces NAME DEST: `mat trace summary --json` of every rank's trace that validate_batch NAME recorded,
# as DEST/LAYOUT.rank_R.summary.json (a collective waits for the last rank to arrive: the ranks' summaries say which).
summarize_rank_traces() {
  local trace name
  mkdir -p "$2"
  for trace in "$OUT/$1"/traces/*/rank_*.json.gz; do
    [ -f "$trace" ] || continue
    name=$(basename "$(dirname "$trace")").$(basename "$trace" .json.gz)
    summarize_trace "$trace" "$2/$name.summary.json"
  done
}

# copy_host_floor NAME DEST: the host floors `--measure-host-floor` measured for validate_batch NAME (the calibration,
# the testbench cases and their records, the first round's in collect/ and later rounds' in roundN/collect/), as
# DEST/host_floor/.
copy_host_floor() {
  local round
  mkdir -p "$2/host_floor/collect"
  cp "$OUT/$1"/host_floor/host_floor.calibration.json "$OUT/$1"/host_floor/cases.json "$2/host_floor/" 2>/dev/null
  cp "$OUT/$1"/host_floor/collect/*.jsonl "$2/host_floor/collect/" 2>/dev/null
  for round in "$OUT/$1"/host_floor/round*/; do
    [ -d "$round/collect" ] || continue
    mkdir -p "$2/host_floor/$(basename "$round")/collect"
    cp "$round"/collect/*.jsonl "$2/host_floor/$(basename "$round")/collect/" 2>/dev/null
  done
}

# rank_waits NAME DEST: `mat trace waits --json` of every profiled layout's rank traces that validate_batch NAME left,
# as DEST/LAYOUT.waits.json (per collective, the transfer and each rank's wait for the last to arrive).
rank_waits() {
  local dir
  mkdir -p "$2"
  for dir in "$OUT/$1"/traces/*/; do
    [ -f "$dir/rank_1.json.gz" ] || continue
    $MAT trace waits "$dir"/rank_*.json.gz --json > "$2/$(basename "$dir").waits.json" || echo "trace waits failed: $dir"
  done
}

# summarize_trace TRACE DEST: `mat trace summary --json` of one torch-profiler trace into DEST.
summarize_trace() {
  $MAT trace summary --json "$1" > "$2" || echo "trace summary failed: $1"
}

# record_gpus: the GPUs' names and memory, on stdout and in "$OUT/gpus.txt".
record_gpus() {
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
}

# record_versions DEST: torch's, Transformer Engine's and megatron-core's versions into DEST/versions.txt.
record_versions() {
  $PY -c "import torch, transformer_engine, megatron.core as m; print('torch', torch.__version__, 'te', \
transformer_engine.__version__, 'megatron-core', m.__version__)" > "$1/versions.txt" 2>&1
}

# validate_batch LAYOUTS NAME TIMEOUT_S [more validate options]: run a layouts file into "$OUT/NAME", the log
# into "$OUT/NAME.txt" (and on stdout).
validate_batch() {
  local layouts=$1 name=$2 timeout=$3
  shift 3
  $VALIDATE --layouts "$layouts" --output-dir "$OUT/$name" --timeout-s "$timeout" "$@" 2>&1 | tee "$OUT/$name.txt"
}

# validate_part LAYOUTS: one part of a multi-part round: LAYOUTS (a file of this folder) validated into "$OUT/run" with
# the host floors of CAL when that file exists (an earlier part's calibration), else measured first; then the
# evidence (runs, allocator histories, every rank's trace summary and waits, the floors) as "$OUT/evidence.tgz".
validate_part() {
  local floors ev="$OUT/evidence"
  if [ -f "${CAL:-}" ]; then floors=(--calibration "$CAL"); else floors=(--measure-host-floor); fi
  validate_batch "$HERE/$1" run 300 "${floors[@]}"
  collect_batch run "$ev"
  copy_memory_histories run "$ev"
  summarize_rank_traces run "$ev/traces"
  rank_waits run "$ev/traces"
  if [ -f "${CAL:-}" ]; then cp "$CAL" "$ev/calibration.json"; else copy_host_floor run "$ev"; fi
  finish "$ev"
}

# collect_batch NAME DEST: what validate_batch NAME left, as evidence: copy_runs, gpus.txt and the log (run.log).
collect_batch() {
  copy_runs "$OUT/$1" "$2"
  cp "$OUT/gpus.txt" "$2/" 2>/dev/null
  cp "$OUT/$1.txt" "$2/run.log"
}

# copy_memory_histories NAME DEST: the replay of every rank's allocator history (`--memory-history`, small) that
# validate_batch NAME left, as DEST/memory/LAYOUT/rank_R.history.json (the raw snapshots stay on the machine).
copy_memory_histories() {
  local hist layout
  for hist in "$OUT/$1"/memory/*/rank_*.history.json; do
    [ -f "$hist" ] || continue
    layout=$(basename "$(dirname "$hist")")
    mkdir -p "$2/memory/$layout"
    cp "$hist" "$2/memory/$layout/"
  done
}

# copy_memory_snapshots NAME DEST RANK: rank RANK's raw allocator snapshot (pytorch.org/memory_viz opens it; the
# segments and events `mat trace memory-history` replays) of every layout validate_batch NAME recorded, as
# DEST/LAYOUT.rank_RANK.pickle.gz: one flat file each, kept out of the evidence archive (the device tool brings back
# 8 files of at most 16 MiB; a larger snapshot is left, and said so).
copy_memory_snapshots() {
  local snap layout
  mkdir -p "$2"
  for snap in "$OUT/$1"/memory/*/rank_"$3".pickle.gz; do
    [ -f "$snap" ] || continue
    [ "$(stat -c %s "$snap")" -lt 16777216 ] || { echo "snapshot over 16 MiB, left: $snap"; continue; }
    layout=$(basename "$(dirname "$snap")")
    cp "$snap" "$2/$layout.rank_$3.pickle.gz"
  done
}

# finish DEST: DEST packed as DEST.tgz (the device tool returns a limited number of files: one archive comes
# back whole where a deep folder may not), the evidence folder's size and the script's wall time.
finish() {
  tar czf "$1.tgz" -C "$(dirname "$1")" "$(basename "$1")"
  du -sh "$1" "$1.tgz"
  echo "wall time: $(elapsed)"
}
