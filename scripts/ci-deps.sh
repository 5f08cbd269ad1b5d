#!/usr/bin/env bash
# Installs what the build and the test suite need on a Debian machine (idempotent).
set -euo pipefail

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
if [ "${#need_apt[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
    else
        echo "missing: ${need_apt[*]} (install them, or run as root on Debian)" >&2
        exit 1
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
