#!/usr/bin/env bash
# Stops cpusetd, undoes what it did (`cpusetd reset`: every kubepods cgroup back to all CPUs,
# lifted CFS quotas restored, checkpoint removed), and removes the files install.sh put in.
# /etc/default/cpusetd is kept unless --purge is given.
set -euo pipefail
prefix=${PREFIX:-/usr/local}
purge=no
[ "${1:-}" = "--purge" ] && purge=yes
if [ "$(id -u)" -ne 0 ]; then
    echo "uninstall.sh: run as root" >&2
    exit 1
fi
if [ -d /run/systemd/system ]; then
    systemctl disable --now cpusetd.service 2>/dev/null || true
fi
CPUSETD_ARGS=""
# shellcheck disable=SC1091
[ -r /etc/default/cpusetd ] && . /etc/default/cpusetd
if [ -x "$prefix/bin/cpusetd" ]; then
    # shellcheck disable=SC2086
    "$prefix/bin/cpusetd" reset $CPUSETD_ARGS
fi
rm -f "$prefix/bin/cpusetd" /etc/systemd/system/cpusetd.service \
    /etc/systemd/system/cpusetd.service.d/partitions.conf
rm -rf "$prefix/share/doc/cpusetd"
[ "$purge" = yes ] && rm -f /etc/default/cpusetd
[ -d /run/systemd/system ] && systemctl daemon-reload
echo "cpusetd removed; kubelet can take CPU management back (cpuManagerPolicy)."
