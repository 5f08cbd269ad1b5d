#!/usr/bin/env bash
# The whole test suite: unit, property, integration, fixture and real-kernel tests.
# Real-kernel tests (cgroup v1 cpuset hierarchy, runc) skip with a printed reason where the
# machine lacks them; scripts/ci-deps.sh (run first) installs what they need on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."

# Set-up (idempotent): runc and busybox-static for the real-container tests when root.
scripts/ci-deps.sh

# The committed sysfs fixtures must be what the generator writes.
if [ -x scripts/check-fixtures.sh ]; then
    scripts/check-fixtures.sh
fi

# Tests only: benchmarks (harness = false) would run as tests under --all-targets.
# --workspace: crikubelet (the scripted kubelet of the CRI tests) has unit tests of its own.
cargo test --locked --workspace --lib --bins --tests "$@"

# The kubelet vector count (the test itself asserts every case; this shows ran/skipped).
cargo test --locked --test tests kubelet_vectors_pass -- --nocapture 2>&1 | grep -A20 "^kubelet vectors:" || true

# The reliability counts (kills, traced writes, fuzz inputs replayed); the tests assert the rest.
cargo test --locked --test tests -- --nocapture crash:: confinement::the_traced fuzz_replay 2>&1 \
    | grep -E "^(crash|confinement|fuzz replay|skipped):" || true
