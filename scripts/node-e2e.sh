#!/usr/bin/env bash
# End-to-end on a real node: a Debian bookworm guest under QEMU with systemd as PID 1 (252),
# Debian's containerd + runc with the systemd cgroup driver, cpusetd installed by scripts/install.sh as the
# shipped unit (systemd/cpusetd.service, flags from /etc/default/cpusetd). Pods are made through
# the CRI by crikubelet (the workspace's kubelet stand-in) when it is built.
#
# Scenarios (one boot each):
#   systemd-v2  cgroup v2 (systemd.unified_cgroup_hierarchy=1), Linux 6.12
#   systemd-v1  cgroup v1 under systemd (systemd.unified_cgroup_hierarchy=0), Linux 6.1: Debian's
#               6.12 is built without CONFIG_CPUSETS_V1, so no v1 cpuset hierarchy can be mounted
# The image holds both kernels: Debian's 6.12 (linux-image-6.12.*+deb12-amd64-unsigned, from
# bookworm-security, installed into the image from the .deb the host's apt downloads) and its 6.1
# (linux-image-amd64). Nothing node-e2e checks behaves differently on v2 between the two, so v2
# boots 6.12 only (NODE_E2E_KERNEL=6.1 boots it on 6.1).
# The guest's checks are scripts/node-e2e/guest-test.sh; each prints `PASS <check>` or
# `FAIL <check>: <why>`. Prints one `PASS <scenario>` / `FAIL <scenario>: <why>` per scenario and
# exits 1 if any failed. Step times go to stderr.
#
# Usage: scripts/node-e2e.sh [SCENARIO...]     (default: systemd-v2 systemd-v1)
# Environment:
#   CPUSETD_BIN        use this cpusetd binary instead of `cargo build --release --locked`
#   CRIKUBELET_BIN     use this crikubelet binary (default: built from the workspace if it has one)
#   NODE_E2E_ACCEL     kvm | tcg | auto (default: kvm when /dev/kvm boots a guest, else tcg)
#   NODE_E2E_TIMEOUT   seconds per boot before qemu is killed (default 1500: Linux 6.12 runs on one TCG thread, and its systemd section alone took 527 s of a loaded host)
#   NODE_E2E_MIRROR    Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   NODE_E2E_IDLE      seconds the watchdog check waits idle (default 65: over two WatchdogSec=30s periods)
#   NODE_E2E_SERIAL=1  boot the scenarios one after the other (default: side by side)
#   NODE_E2E_IMAGE_ONLY=1  build (or find) the cached base image and stop
#   NODE_E2E_KERNEL    6.12 | 6.1: the kernel every scenario boots (default: 6.12 for systemd-v2,
#                      6.1 for systemd-v1)
# As root with apt-get it installs what is missing on the host: debootstrap, qemu-system-x86,
# e2fsprogs (and runs `apt-get update` when apt knows no 6.12 image yet). The base image is cached in target/node-e2e/cache/<key>/ (key: the package list,
# the 6.12 package, the image recipe in this script and scripts/node-e2e/runner.service); a fresh
# machine builds it.
# shellcheck disable=SC2054 # qemu's options hold commas
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

scenarios=("$@")
[ "${#scenarios[@]}" -gt 0 ] || scenarios=(systemd-v2 systemd-v1)
for s in "${scenarios[@]}"; do
    case "$s" in
        systemd-v2 | systemd-v1) ;;
        *)
            echo "node-e2e: unknown scenario '$s' (known: systemd-v2 systemd-v1)" >&2
            exit 2
            ;;
    esac
done

case "${NODE_E2E_KERNEL:-}" in
    "" | 6.12 | 6.1) ;;
    *)
        echo "node-e2e: NODE_E2E_KERNEL must be 6.12 or 6.1" >&2
        exit 2
        ;;
esac
work=$repo/target/node-e2e
timeout_s=${NODE_E2E_TIMEOUT:-1500}
mirror=${NODE_E2E_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$work"

step_started=$SECONDS
step() { # name: ends the previous step (printing its time) and starts the next
    local now=$SECONDS
    if [ -n "${step_name:-}" ]; then
        echo "node-e2e: [$((now - step_started))s] $step_name" >&2
    fi
    step_name=${1:-}
    step_started=$now
}

# --- dependencies --------------------------------------------------------------------------------
step "host dependencies"
if [ "$(id -u)" -ne 0 ]; then
    echo "node-e2e: run as root (debootstrap, and mkfs.ext4 -d keeps file owners only as root)" >&2
    exit 1
fi
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null || {
        echo "node-e2e: missing ${missing[*]}: install them" >&2
        exit 1
    }
    echo "node-e2e: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# shellcheck source=scripts/lib/kernel.sh
. "$repo/scripts/lib/kernel.sh"
k612=$(newest_6_12_package)
if [ -z "$k612" ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    k612=$(newest_6_12_package)
fi
[ -n "$k612" ] || {
    echo "node-e2e: apt knows no linux-image-6.12.*+deb12-amd64-unsigned (is bookworm-security in the sources?)" >&2
    exit 1
}

# --- the base image (cached) ---------------------------------------------------------------------
build_image() {
    local tmp=$work/cache/$key.tmp root
    rm -rf "$tmp"
    mkdir -p "$tmp" "$work/cache/debs"
    root=$tmp/root
    step "debootstrap bookworm ($(wc -l <<<"$packages") packages)"
    debootstrap --variant=minbase --cache-dir="$work/cache/debs" \
        --include="$(paste -sd, <<<"$packages")" bookworm "$root" "$mirror" \
        >"$tmp/debootstrap.log" 2>&1 || {
        echo "node-e2e: debootstrap failed, last lines of $tmp/debootstrap.log:" >&2
        tail -n 20 "$tmp/debootstrap.log" >&2
        exit 1
    }
    step "install $k612 into the image"
    local deb
    deb=$(find "$work/cache/debs" -maxdepth 1 -name "${k612}_*.deb" | sort -V | tail -n 1)
    if [ -z "$deb" ]; then
        (cd "$work/cache/debs" && apt-get download -qq "$k612") >&2 || {
            echo "node-e2e: apt-get download $k612 failed" >&2
            exit 1
        }
        deb=$(find "$work/cache/debs" -maxdepth 1 -name "${k612}_*.deb" | sort -V | tail -n 1)
    fi
    cp "$deb" "$root/tmp/linux-6.12.deb"
    # Its postinst makes the initramfs (virtio_blk and ext4 are modules in Debian's kernels).
    DEBIAN_FRONTEND=noninteractive chroot "$root" dpkg -i /tmp/linux-6.12.deb \
        >"$tmp/kernel.log" 2>&1 || {
        echo "node-e2e: installing $k612 in the image failed, last lines of $tmp/kernel.log:" >&2
        tail -n 20 "$tmp/kernel.log" >&2
        exit 1
    }
    rm -f "$root/tmp/linux-6.12.deb"
    step "configure the image"
    echo "cpusetd-node" >"$root/etc/hostname"
    printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
    # A fixed machine id: no first-boot machinery, and the same image every run.
    echo "c0ffee00c0ffee00c0ffee00c0ffee00" >"$root/etc/machine-id"
    install -m 0644 "$repo/scripts/node-e2e/runner.service" \
        "$root/etc/systemd/system/node-e2e.service"
    ln -sf /etc/systemd/system/node-e2e.service \
        "$root/etc/systemd/system/multi-user.target.wants/node-e2e.service"
    # The test starts containerd (and irqbalance, for its own check) itself; nothing else is
    # wanted.
    local unit
    for unit in containerd.service irqbalance.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
        fstrim.timer; do
        rm -f "$root/etc/systemd/system/"*.wants/"$unit"
    done
    # Fast, quiet boots: no getty on the consoles (the runner powers off).
    ln -sf /dev/null "$root/etc/systemd/system/serial-getty@.service"
    ln -sf /dev/null "$root/etc/systemd/system/getty@.service"
    rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
    local series image
    for series in 6.12 6.1; do
        image=$(find "$root/boot" -maxdepth 1 -name "vmlinuz-$series.*" | sort -V | tail -n 1)
        [ -n "$image" ] && [ -f "$root/boot/initrd.img-${image##*/vmlinuz-}" ] || {
            echo "node-e2e: the image has no Linux $series kernel and initramfs in /boot" >&2
            exit 1
        }
        cp -L "$image" "$tmp/vmlinuz-$series"
        cp -L "$root/boot/initrd.img-${image##*/vmlinuz-}" "$tmp/initrd.img-$series"
    done
    chmod 0644 "$tmp"/vmlinuz-* "$tmp"/initrd.img-*
    step "make the ext4 image"
    mkfs.ext4 -q -F -L root -d "$root" "$tmp/base.raw" 4G >&2
    rm -rf "$root"
    rm -rf "$cache"
    mv "$tmp" "$cache"
    # Images of older recipes are not needed any more (the .deb cache is kept).
    find "$work/cache" -mindepth 1 -maxdepth 1 -type d ! -name debs ! -name "$key" \
        -exec rm -rf {} +
}

# Everything that goes into the image is in the key (the recipe is build_image itself): change
# one and the image is rebuilt.
packages=$(grep -v '^#' "$repo/scripts/node-e2e/packages" | grep -v '^[[:space:]]*$' | LC_ALL=C sort)
key=$( {
    echo "bookworm $mirror"
    echo "$packages"
    echo "$k612"
    declare -f build_image
    cat "$repo/scripts/node-e2e/runner.service"
} | sha256sum | cut -c1-16)
cache=$work/cache/$key

if [ -f "$cache/base.raw" ]; then
    echo "node-e2e: cached base image $cache" >&2
else
    build_image
fi
[ "${NODE_E2E_IMAGE_ONLY:-}" = 1 ] && {
    step
    exit 0
}

# --- the binaries and the per-run disk -----------------------------------------------------------
step "build cpusetd"
if [ -n "${CPUSETD_BIN:-}" ]; then
    bin=$CPUSETD_BIN
else
    cargo build --release --locked --quiet
    bin=$repo/target/release/cpusetd
fi
[ -x "$bin" ] || {
    echo "node-e2e: no cpusetd binary at $bin" >&2
    exit 1
}
crikubelet_bin=${CRIKUBELET_BIN:-}
if [ -z "$crikubelet_bin" ] && [ -f "$repo/crikubelet/Cargo.toml" ]; then
    step "build crikubelet"
    cargo build --release --locked --quiet -p crikubelet
    crikubelet_bin=$repo/target/release/crikubelet
fi
if [ -z "$crikubelet_bin" ]; then
    echo "node-e2e: no crikubelet in this workspace: the pod checks will be skipped (and fail)" >&2
fi

step "make the per-run disk"
inject=$work/inject
rm -rf "$inject"
mkdir -p "$inject/bin" "$inject/repo/scripts" "$inject/repo/systemd"
# The release profile keeps debug info; the guest does not need it.
strip -o "$inject/bin/cpusetd" "$bin" 2>/dev/null || cp "$bin" "$inject/bin/cpusetd"
if [ -n "$crikubelet_bin" ]; then
    strip -o "$inject/bin/crikubelet" "$crikubelet_bin" 2>/dev/null ||
        cp "$crikubelet_bin" "$inject/bin/crikubelet"
fi
cp "$repo/scripts/install.sh" "$repo/scripts/uninstall.sh" "$inject/repo/scripts/"
cp "$repo/systemd/cpusetd.service" "$repo/systemd/cpusetd.env" "$repo/systemd/cpusetd-irq.conf" \
    "$repo/systemd/cpusetd-metrics.conf" "$repo/systemd/cpusetd-partitions.conf" "$inject/repo/systemd/"
cp "$repo/README.md" "$inject/repo/"
install -m 0755 "$repo/scripts/node-e2e/guest-test.sh" "$inject/run.sh"
cp "$repo/scripts/node-e2e/containerd.toml" "$inject/containerd.toml"
rm -f "$work/inject.raw"
mkfs.ext4 -q -F -L e2e -d "$inject" "$work/inject.raw" 256M >&2

# --- booting -------------------------------------------------------------------------------------
qemu_common=(
    -machine q35 -cpu Skylake-Server
    -smp 8,sockets=2,cores=2,threads=2 -m 2048
    -object memory-backend-ram,id=m0,size=1024M -object memory-backend-ram,id=m1,size=1024M
    -numa node,nodeid=0,cpus=0-3,memdev=m0 -numa node,nodeid=1,cpus=4-7,memdev=m1
    -display none -monitor none -no-reboot -nodefaults
)

# shellcheck source=scripts/lib/qemu-accel.sh
. "$repo/scripts/lib/qemu-accel.sh"
step "probe kvm"
accel=()
# The probe boots the default kernel; each scenario names its own below.
qemu_boot=("${qemu_common[@]}")
qemu_common+=(-kernel "$cache/vmlinuz-6.12" -initrd "$cache/initrd.img-6.12")
choose_accel "${NODE_E2E_ACCEL:-auto}" "$work/kvm-probe.log" || {
    echo "node-e2e: NODE_E2E_ACCEL must be kvm, tcg or auto" >&2
    exit 2
}
qemu_common=("${qemu_boot[@]}")
echo "node-e2e: image $cache, ${accel[1]}" >&2

mapfile -t checks < <(grep -v '^#' "$repo/scripts/node-e2e/checks" | grep -v '^[[:space:]]*$')

# judge RESULTS SCENARIO: prints why the scenario failed (first line: the summary), or nothing.
judge() {
    local results=$1 scenario=$2 check line only problems=()
    grep -qx '@@DONE' "$results" || problems+=("the guest did not finish")
    while IFS= read -r line; do
        problems+=("${line#FAIL }")
    done < <(grep '^FAIL ' "$results")
    while IFS= read -r line; do
        problems+=("skipped ${line#SKIP }")
    done < <(grep '^SKIP ' "$results")
    for line in "${checks[@]}"; do
        read -r check only <<<"$line"
        [ -z "$only" ] || [[ " $only " == *" $scenario "* ]] || continue
        grep -qx "PASS $check" "$results" && continue
        grep -q "^\(FAIL\|SKIP\) $check:" "$results" && continue
        problems+=("no result for $check")
    done
    [ "${#problems[@]}" -eq 0 ] && return 0
    printf "%s\n" "${problems[@]}"
    return 1
}

# boot SCENARIO: boots its guest and waits for it; writes "<qemu exit status> <seconds>" to
# $work/<scenario>.status.
boot() {
    local scenario=$1 hierarchy kernel console results qemu_status=0 started=$SECONDS
    case "$scenario" in
        systemd-v2) hierarchy=1 kernel=6.12 ;;
        systemd-v1) hierarchy=0 kernel=6.1 ;;
    esac
    kernel=${NODE_E2E_KERNEL:-$kernel}
    # Multi-threaded TCG oopses 6.12 guests (int3 in enqueue_entity under systemd's boot, as in
    # vm-e2e's sched-v2): 6.12 runs on one TCG thread. Side by side, every guest does: eight vCPU
    # threads of one guest would take most of this machine's CPUs from the other's one.
    local scenario_accel=("${accel[@]}")
    if [ "${accel[1]}" = tcg,thread=multi ] && { [ "$kernel" = 6.12 ] || [ "$side_by_side" = 1 ]; }; then
        scenario_accel=(-accel tcg,thread=single)
    fi
    console=$work/$scenario.console.log
    results=$work/$scenario.results.log
    rm -f "$console" "$results" "$work/$scenario.status"
    echo "node-e2e: booting $scenario (Linux $kernel)" >&2
    # ttyS0: the console (kernel, systemd, the test's diagnostics); ttyS1: the results.
    # The base image is opened read-only with a throw-away overlay (snapshot=on).
    timeout -k 10 "$timeout_s" qemu-system-x86_64 "${scenario_accel[@]}" "${qemu_common[@]}" \
        -kernel "$cache/vmlinuz-$kernel" -initrd "$cache/initrd.img-$kernel" \
        -drive "file=$cache/base.raw,format=raw,if=virtio,snapshot=on" \
        -drive "file=$work/inject.raw,format=raw,if=virtio,readonly=on" \
        -serial "file:$console" -serial "file:$results" \
        -append "root=/dev/vda rw console=ttyS0 panic=-1 systemd.unified_cgroup_hierarchy=$hierarchy cpusetd_node_e2e=$scenario cpusetd_node_e2e_idle=${NODE_E2E_IDLE:-65}" \
        </dev/null >"$work/$scenario.qemu.log" 2>&1 || qemu_status=$?
    echo "$qemu_status $((SECONDS - started))" >"$work/$scenario.status"
}

# report SCENARIO: prints its PASS/FAIL line (and why); returns 1 when it failed.
report() {
    local scenario=$1 console=$work/$1.console.log results=$work/$1.results.log
    local qemu_status=1 elapsed=0 reasons why
    [ -f "$work/$scenario.status" ] && read -r qemu_status elapsed <"$work/$scenario.status"
    touch "$results" "$console"
    tr -d '\r' <"$results" >"$results.txt"
    grep -E '^(PASS|FAIL|SKIP) ' "$results.txt" | sed "s/^/    $scenario: /" >&2 || true
    if reasons=$(judge "$results.txt" "$scenario"); then
        echo "PASS $scenario (${elapsed}s)"
        return 0
    fi
    why=$(head -n 1 <<<"$reasons")
    case "$qemu_status" in 124 | 137) why="timed out after ${timeout_s}s; $why" ;; esac
    echo "FAIL $scenario: $why"
    tail -n +2 <<<"$reasons" | sed 's/^/    /'
    if [ "$qemu_status" -ne 0 ]; then
        echo "    qemu exited $qemu_status:"
        tail -n 5 "$work/$scenario.qemu.log" | sed 's/^/    | /'
    fi
    echo "    last 30 lines of the console ($console):"
    tail -n 30 "$console" | tr -d '\r' | sed 's/^/    | /'
    return 1
}

# The scenarios boot side by side (NODE_E2E_SERIAL=1: one after the other): 6.12 runs on one
# TCG thread, so two guests share this machine's CPUs better than one does, and CI's wall time
# is the longer scenario's rather than their sum.
step "boot and test ${scenarios[*]}"
side_by_side=1
[ "${NODE_E2E_SERIAL:-0}" != 1 ] && [ "${#scenarios[@]}" -gt 1 ] || side_by_side=0
if [ "$side_by_side" = 0 ]; then
    for scenario in "${scenarios[@]}"; do boot "$scenario"; done
else
    pids=()
    for scenario in "${scenarios[@]}"; do
        boot "$scenario" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || true; done
fi
failed=0
for scenario in "${scenarios[@]}"; do
    report "$scenario" || failed=1
done
step
echo "node-e2e: ${SECONDS}s in all" >&2
exit "$failed"
