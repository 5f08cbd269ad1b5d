#!/usr/bin/env bash
# Runs every cargo-fuzz target (or the ones named) for SECONDS each (default 60), at most
# FUZZ_PARALLEL (default 1) at a time, and prints executions and findings per target.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# New inputs go to a scratch corpus under fuzz/target/corpus/<target> (seeded from the committed
# fuzz/corpus/<target>, which stays small); crashes go to fuzz/artifacts/<target>/. A crash input
# worth keeping is copied to fuzz/regressions/<target>/, which the normal test suite replays
# (tests/fuzz_replay.rs), as it replays the committed corpus. Needs cargo-fuzz
# (`cargo install cargo-fuzz --locked`); runs on the stable toolchain through RUSTC_BOOTSTRAP.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-60}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(cpu_list classify runtime_config checkpoint planner irqbalance proc_irq)
fi
parallel="${FUZZ_PARALLEL:-1}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz --locked" >&2
    exit 2
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O

logs=target/fuzz-logs
mkdir -p "$logs"
run_one() {
    local target="$1"
    mkdir -p "target/corpus/$target" "corpus/$target" "artifacts/$target"
    # -rss_limit_mb: the planner and checkpoint targets are small; anything near this is a bug.
    if cargo fuzz run -O "$target" "target/corpus/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=1024 -timeout=10 \
        >"$logs/$target.log" 2>&1; then
        echo "ok" >"$logs/$target.status"
    else
        echo "failed" >"$logs/$target.status"
    fi
}

pids=()
for target in "${targets[@]}"; do
    run_one "$target" &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
        wait -n || true
    done
done
wait

status=0
printf '%-16s %14s %10s %8s  %s\n' target executions exec/s corpus result
for target in "${targets[@]}"; do
    log="$logs/$target.log"
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    corpus=$(find "target/corpus/$target" -type f | wc -l)
    result=$(cat "$logs/$target.status")
    if [ "$result" != ok ]; then
        status=1
        result="FAILED: $(grep -m1 -E 'panicked at|ERROR: libFuzzer' "$log" || echo "see $log")"
        ls -1 "artifacts/$target" | sed 's/^/    artifact: /'
    fi
    printf '%-16s %14s %10s %8s  %s\n' "$target" "${execs:-?}" "${rate:-?}" "$corpus" "$result"
done
exit "$status"
