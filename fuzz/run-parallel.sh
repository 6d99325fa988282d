#!/usr/bin/env bash
# Run every fuzz target for a total number of executions spread over all cores (libFuzzer's
# -jobs/-workers: each worker runs its share into one shared corpus), and print per target
# the executions summed over the workers, the time taken and whether anything crashed.
# The binaries are cargo-fuzz builds copied (stripped) into one folder, so this runs on a
# machine without Rust (the lent GPU host has 16 cores; this VM has 2).
#
# Usage: fuzz/run-parallel.sh BIN_DIR CORPUS_DIR OUT_DIR [TOTAL_RUNS] [MAX_SECONDS_PER_TARGET]
#   BIN_DIR: one executable per target (spead_recv, pcap, endpoints, output_spec, signal,
#   katcp_line); CORPUS_DIR/<target> is used and grown; seeds come from fuzz/seeds/<target>.
set -uo pipefail
seeds=$(realpath "$(dirname "$0")/seeds")
mkdir -p "$2" "$3"
bin=$(realpath "$1") corpus=$(realpath "$2") out=$(realpath "$3") total=${4:-10000000} max_secs=${5:-120}
jobs=$(nproc)
per=$(( (total + jobs - 1) / jobs ))
for t in spead_recv pcap endpoints output_spec signal katcp_line; do
    [ -x "$bin/$t" ] || { echo "$t: no binary in $bin"; continue; }
    mkdir -p "$corpus/$t" "$out/$t"
    extra=()
    case $t in spead_recv | pcap) extra=(-max_len=20000) ;; esac
    start=$(date +%s)
    (cd "$out/$t" && "$bin/$t" "$corpus/$t" "$seeds/$t" \
        -jobs="$jobs" -workers="$jobs" -runs="$per" -max_total_time="$max_secs" \
        -print_final_stats=1 -artifact_prefix="$out/$t/" "${extra[@]}" > /dev/null 2>&1)
    secs=$(( $(date +%s) - start ))
    runs=$(cat "$out/$t"/fuzz-*.log 2>/dev/null |
        awk '/stat::number_of_executed_units/ { s += $NF } END { print s + 0 }')
    crashes=$(find "$out/$t" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
    echo "$t: $runs executions on $jobs workers in $secs s, $crashes crash/leak/timeout/oom artifacts"
done
