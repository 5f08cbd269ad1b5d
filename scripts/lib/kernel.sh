# shellcheck shell=bash
# Sourced by scripts/node-e2e.sh (scripts/vm-e2e.sh has the same two look-ups inline): where
# Debian's kernels are found.

# The newest image of a kernel series in /boot (empty: none). $1: the series, e.g. 6.12.
newest_kernel() {
    find /boot -maxdepth 1 -name "vmlinuz-$1.*" | sort -V | tail -n 1
}

# The newest Linux 6.12 image package apt knows (Debian 12: bookworm-security), unsigned: QEMU
# boots it as it is. Empty when apt knows none (bookworm-security not in the sources, or no
# `apt-get update` yet).
newest_6_12_package() {
    apt-cache pkgnames linux-image-6.12. 2>/dev/null |
        grep -E '^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$' | sort -V | tail -n 1 || true
}
