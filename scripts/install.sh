#!/usr/bin/env bash
# Builds cpusetd and installs it as a systemd service:
#   /usr/local/bin/cpusetd, /etc/systemd/system/cpusetd.service, /etc/default/cpusetd (kept if
#   it exists: edit it first, at least --reserved-cpus), then enables and starts the service.
# Usage: sudo scripts/install.sh [--no-start] [--partitions]
#   --partitions  also installs the opt-in drop-in systemd/cpusetd-partitions.conf
#                 (CAP_SYS_ADMIN, which Linux wants for cpu-load-balancing.crio.io on cgroup v2)
# With CPUSETD_BIN=/path/to/cpusetd it installs that prebuilt binary instead of running
# `cargo build --release --locked` (a node without a Rust toolchain).
set -euo pipefail
# A relative CPUSETD_BIN is relative to where the script was started from.
[ -n "${CPUSETD_BIN:-}" ] && CPUSETD_BIN=$(realpath -- "$CPUSETD_BIN")
cd "$(dirname "$0")/.."

start=yes
partitions=no
for arg in "$@"; do
    case $arg in
        --no-start) start=no ;;
        --partitions) partitions=yes ;;
        *)
            echo "install.sh: unknown argument '$arg' (usage: install.sh [--no-start] [--partitions])" >&2
            exit 2
            ;;
    esac
done
prefix=${PREFIX:-/usr/local}

if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (it writes $prefix/bin and /etc/systemd/system)" >&2
    exit 1
fi
if [ -n "${CPUSETD_BIN:-}" ]; then
    bin=$CPUSETD_BIN
    if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
        echo "install.sh: CPUSETD_BIN=$bin is not an executable file" >&2
        exit 1
    fi
else
    cargo build --release --locked
    bin=target/release/cpusetd
fi
install -D -m 0755 "$bin" "$prefix/bin/cpusetd"
install -D -m 0644 systemd/cpusetd.service /etc/systemd/system/cpusetd.service
if [ "$partitions" = yes ]; then
    install -D -m 0644 systemd/cpusetd-partitions.conf \
        /etc/systemd/system/cpusetd.service.d/partitions.conf
fi
if [ -e /etc/default/cpusetd ]; then
    echo "keeping the existing /etc/default/cpusetd (the new template is systemd/cpusetd.env)"
else
    install -D -m 0644 systemd/cpusetd.env /etc/default/cpusetd
fi
install -D -m 0644 README.md "$prefix/share/doc/cpusetd/README.md"

if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    if [ "$start" = yes ]; then
        systemctl enable --now cpusetd.service
        systemctl --no-pager status cpusetd.service || true
    else
        systemctl enable cpusetd.service
    fi
else
    echo "systemd is not running here: installed, not started. Start by hand with:"
    echo "  . /etc/default/cpusetd && $prefix/bin/cpusetd run \$CPUSETD_ARGS"
fi
cat <<TIP
Next: set kubelet's cpuManagerPolicy to "none" (see README.md), check /etc/default/cpusetd,
and watch it with:  . /etc/default/cpusetd && cpusetd status \$CPUSETD_ARGS
TIP
