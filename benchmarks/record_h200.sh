#!/usr/bin/env bash
# Brute-force recordings and recording counters on a GPU machine, resumable across calls.
#
#   STATE=out/state bash benchmarks/record_h200.sh SECONDS JOB...
#
# Each JOB is GPU:KIND:NAME[:SIZES:LABEL], run one after another per GPU, the GPUs in parallel,
# until SECONDS have passed (each step gets what is left):
#   GPU:record:NAME     surrotune run experiments/NAME.toml --sampler brute-force, journal
#                       STATE/NAME.log (resumed when it exists); with SIZES (M=1024,N=1024)
#                       and LABEL (gemm_1024) at those sizes, as STATE/LABEL.log, study LABEL_h200
#                       (the study's suffix is DEVICE_SUFFIX, _h200 unless set: _h100 on an H100)
#   GPU:counters:NAME   surrotune counters on experiments/datasets/NAME.json.gz, written to
#                       STATE/NAME.json.gz (resumed when it exists)
# Everything in STATE comes back as $OUT/state.tgz (the device returns at most 8 files):
# unpack it into STATE here, carry STATE on the next call, and export a finished journal with
#   surrotune export STATE/NAME.log --study NAME_h200 --format recording \
#       -o experiments/datasets/NAME_h200.json.gz
# The driver's compute cache is off (CUDA_CACHE_DISABLE=1): recorded compile times are real.
set -u
SECONDS_TOTAL=$1; shift
STATE=${STATE:-out/state}; mkdir -p "$STATE"
DEVICE_SUFFIX=${DEVICE_SUFFIX:-_h200}
DEADLINE=$(( $(date +%s) + SECONDS_TOTAL ))
left() { echo $(( DEADLINE - $(date +%s) )); }
export CUDA_CACHE_DISABLE=1
run_gpu() {
  local gpu=$1; shift
  for job in "$@"; do
    local kind name secs
    local sizes=() label
    kind=$(echo "$job" | cut -d: -f2); name=$(echo "$job" | cut -d: -f3)
    label=$(echo "$job" | cut -d: -f5); label=${label:-$name}
    for size in $(echo "$job" | cut -s -d: -f4 | tr , ' '); do sizes+=(--size "$size"); done
    secs=$(( $(left) - 40 )); [ "$secs" -lt 30 ] && break
    if [ "$kind" = record ]; then
      CUDA_VISIBLE_DEVICES=$gpu timeout $((secs + 30)) python3 -m surrotune run \
        "experiments/$name.toml" "${sizes[@]}" --sampler brute-force --trials 1000000 \
        --batch-size 64 --storage "$STATE/$label.log" --study "${label}${DEVICE_SUFFIX}" \
        --timeout "${secs}s" --sanitize none --remeasure 0 --save-model none --no-progress \
        > "$STATE/$label.out" 2>&1
    else
      local source="experiments/datasets/$name.json.gz"
      CUDA_VISIBLE_DEVICES=$gpu timeout "$secs" python3 -m surrotune counters \
        "experiments/${name%_h200*}.toml" --dataset "$source" -o "$STATE/$name.json.gz" \
        > "$STATE/$name.counters.out" 2>&1
    fi
    echo "$job rc=$? at $(date +%T)" >> "$STATE/jobs.txt"
  done
}
for gpu in $(printf '%s\n' "$@" | cut -d: -f1 | sort -u); do
  run_gpu "$gpu" $(printf '%s\n' "$@" | grep "^$gpu:") &
done
wait
rm -rf "$STATE"/*.lock "$STATE"/*.flock "$STATE"/ncu-reports
tar czf "$OUT/state.tgz" -C "$STATE" .
echo "done: $(cat "$STATE/jobs.txt" | tail -n 8)"
