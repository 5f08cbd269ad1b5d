#!/usr/bin/env bash
# Builds cpusetd and installs it as a systemd service:
#   /usr/local/bin/cpusetd, /etc/systemd/system/cpusetd.service, /etc/default/cpusetd (kept if
#   it exists: edit it first, at least --reserved-cpus), then enables and starts the service.
# Usage: sudo scripts/install.sh [--no-start]
set -euo pipefail
cd "$(dirname "$0")/.."

start=yes
[ "${1:-}" = "--no-start" ] && start=no
prefix=${PREFIX:-/usr/local}

if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (it writes $prefix/bin and /etc/systemd/system)" >&2
    exit 1
fi
cargo build --release --locked
install -D -m 0755 target/release/cpusetd "$prefix/bin/cpusetd"
install -D -m 0644 systemd/cpusetd.service /etc/systemd/system/cpusetd.service
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
