#!/usr/bin/env bash
# Installs what the build and the test suite need on a Debian machine (idempotent).
set -euo pipefail

# Required: the fixture generator runs on python3.
need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
# Required: the test harness crikubelet builds the CRI client (k8s-cri) from its .proto files.
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
# Optional: the real-container tests start containers with runc from a rootfs holding a static
# busybox. Without them (or without root) those tests skip with a printed reason.
want_apt=()
command -v runc >/dev/null || want_apt+=(runc)
# Optional: the CRI tests (tests/containerd.rs) start their own containerd (CRI plugin).
command -v containerd >/dev/null || want_apt+=(containerd)
# Optional: the confinement test traces the agent with strace (skips without it).
command -v strace >/dev/null || want_apt+=(strace)
# Optional: tests/prometheus.rs has Debian's Prometheus (and its promtool) scrape the agent, and
# node_exporter read its textfile (skips without them).
command -v prometheus >/dev/null && command -v promtool >/dev/null || want_apt+=(prometheus)
command -v prometheus-node-exporter >/dev/null || want_apt+=(prometheus-node-exporter)
if command -v dpkg-query >/dev/null; then
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' \
        || want_apt+=(busybox-static)
else
    [ -x /bin/busybox ] || want_apt+=(busybox-static)
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    if [ "$((${#need_apt[@]} + ${#want_apt[@]}))" -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" "${want_apt[@]}"
    fi
else
    if [ "${#need_apt[@]}" -gt 0 ]; then
        echo "missing: ${need_apt[*]} (install them, or run as root on Debian)" >&2
        exit 1
    fi
    if [ "${#want_apt[@]}" -gt 0 ]; then
        echo "not installing ${want_apt[*]} (needs root and apt-get): the real-container tests will skip" >&2
    fi
fi

if ! command -v cargo >/dev/null; then
    echo "cargo not found: install the Rust toolchain (rustup) first" >&2
    exit 1
fi
# rustfmt and clippy ship with the rustup default profile; add them if missing.
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$component"
    fi
done
cargo fetch --locked
