#!/usr/bin/env bash
# The performance figures of docs/PERFORMANCE.md, one command each (release build of the agent).
#
#   scripts/bench.sh <figure>|all|issue24|guest-v2
#
# figures: pin (1, event -> pin latency), runc (2, pinned before start with real runc),
# drift (3, drift repair), reconcile (4, reconcile cost), burst (5, 1,000 pods at once),
# allocate (6, allocation), footprint (7, RSS and idle CPU), churn (8, kubelet's placement
# vs best fit under arrivals and departures), busy (9, issue 24: event -> pin on a busy node,
# event -> exclusive and the agent's CPU and writes per pod start + release, v1 and v2 fake trees).
# issue24 runs every row of issue 24's table at modest sample counts (about 10 minutes here; see
# docs/PERFORMANCE.md, "Issue 24 table, re-measured").
# guest-v2 (issue 25 item 6) boots the Linux 6.12 guest of scripts/vm-e2e.sh (scenario bench-v2)
# and prints the guest_v2 bench's table, timed there on real cgroup v2: event -> pin, event ->
# exclusive and drift repair on 110 pods, each as a ratio to an in-guest floor (mkdir + one
# cpuset.cpus write); VM_E2E_BENCH_SAMPLES (default 100) and vm-e2e's VM_E2E_* knobs apply.
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
        busy | 9) echo busy_node ;;
        *) return 1 ;;
    esac
}

usage() {
    echo "usage: $0 pin|runc|drift|reconcile|burst|allocate|footprint|churn|busy|all|issue24|guest-v2" >&2
    exit 2
}

run_bench() {
    echo
    echo "== $*"
    env "$@" 2>&1 | grep -v -e '^\s*Compiling' -e '^\s*Finished' -e '^\s*Running'
}

# Issue 24's table, each row's command at modest sample counts.
issue24() {
    echo "machine: $(nproc) cpus, $(uname -r), $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD)"
    # event -> pin, tmpfs 110 / 500 pods; real cgroup v1; in-process pin at 110 / 2,500 pods.
    run_bench SAMPLES=300 cargo bench --locked --bench event_to_pin
    # busy node, event -> exclusive, agent CPU and writes per pod start + release (v1, v2).
    run_bench BUSY_SAMPLES=200 QUIET_SAMPLES=30 cargo bench --locked --bench busy_node
    # RSS at 110 pods and at 10,000 containers (2,500 pods).
    run_bench PODS=110 IDLE_SECS=5 cargo bench --locked --bench footprint
    run_bench PODS=2500 IDLE_SECS=5 cargo bench --locked --bench footprint
    # full rescan vs the read floor.
    run_bench ROUNDS=5 cargo bench --locked --bench reconcile
}

# Issue 25 item 6: the figures timed inside the 6.12 guest (see the top).
guest_v2() {
    echo "machine: $(nproc) cpus, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD); host loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
    local status=0
    scripts/vm-e2e.sh bench-v2 || status=$?
    echo "host loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    sed -n '/^@@BEGIN figures/,/^@@END figures/{/^@@/d;p}' target/vm-e2e/bench-v2.results.log | tr -d '\r'
    return "$status"
}

[ $# -eq 1 ] || usage
if [ "$1" = guest-v2 ]; then
    guest_v2
    exit
fi
if [ "$1" = issue24 ]; then
    issue24
    exit 0
fi
if [ "$1" = all ]; then
    figures=(pin runc drift reconcile burst allocate footprint churn busy)
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
