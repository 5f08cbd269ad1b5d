#!/usr/bin/env bash
# The performance figures of docs/PERFORMANCE.md, one command each (release build of the agent).
#
#   scripts/bench.sh <figure>|all
#
# figures: pin (1, event -> pin latency), runc (2, pinned before start with real runc),
# drift (3, drift repair), reconcile (4, reconcile cost), burst (5, 1,000 pods at once),
# allocate (6, allocation), footprint (7, RSS and idle CPU), churn (8, kubelet's placement
# vs best fit under arrivals and departures).
# Real-kernel parts (cgroup v1, runc) skip with a printed reason without root, v1 or runc.
# Benchmarks measure; they never fail on speed. Environment knobs are listed in each
# benches/<name>.rs header (SAMPLES, RUNS, PODS, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

bench_of() {
    case "$1" in
        pin | 1) echo event_to_pin ;;
        runc | 2) echo runc_start ;;
        drift | 3) echo drift ;;
        reconcile | 4) echo reconcile ;;
        burst | 5) echo burst ;;
        allocate | 6) echo allocate ;;
        footprint | 7) echo footprint ;;
        churn | 8) echo churn ;;
        *) return 1 ;;
    esac
}

usage() {
    echo "usage: $0 pin|runc|drift|reconcile|burst|allocate|footprint|churn|all" >&2
    exit 2
}

[ $# -eq 1 ] || usage
if [ "$1" = all ]; then
    figures=(pin runc drift reconcile burst allocate footprint churn)
else
    bench_of "$1" >/dev/null || usage
    figures=("$1")
fi

echo "machine: $(nproc) cpus, $(uname -r), $(date -u +%Y-%m-%d)"
for figure in "${figures[@]}"; do
    name=$(bench_of "$figure")
    echo
    echo "== $figure: cargo bench --bench $name"
    cargo bench --locked --bench "$name" 2>&1 | grep -v -e '^\s*Compiling' -e '^\s*Finished' -e '^\s*Running'
done
