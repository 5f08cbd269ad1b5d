#!/usr/bin/env bash
# End-to-end on a real kernel: boots Debian's kernel (6.12 by default, 6.1 for what differs) under QEMU (2 sockets × 2 cores × 2 threads,
# two NUMA nodes, isolcpus=7) with an initramfs holding busybox and cpusetd, once per scenario:
#   v2  cgroup v2 (cpuset + cpu): topology, then the agent on a kubepods tree with real processes
#   v1  cgroup v1 (cpuset, cpu,cpuacct): plan --apply with a write order the kernel checks, run
#   irq v2 with a pod that says irq-load-balancing.crio.io: "disable": IRQs off its CPUs, back after
#   sched v1 with --isolate-host and a pod that says cpu-load-balancing.crio.io: "disable": its
#         CPUs in no scheduler domain while it runs, every other CPU balanced, all back after
#   sched-v2  the same pod on v2 (Linux 6.12): a remote isolated partition, its CPUs in no
#             scheduler domain, others balanced, all back after the pod, a kill -9 and `reset`
#   sched-v2-6.1  the same pod on v2 under Linux 6.1 (no remote partitions): refused clearly,
#             nothing written
# Linux 6.12 boots v2, irq, sched-v2 and hotplug; 6.1 boots what needs cgroup v1 (v1, sched,
# hotplug-v1: Debian's 6.12 is built without CONFIG_CPUSETS_V1, so it cannot mount a v1 cpuset
# hierarchy) and sched-v2-6.1.
#   hotplug  v2, then a cpu of the pinned container goes offline and comes back (CPU hotplug)
#   hotplug-v1  the same after v1 (not in the default set: v1's rewrites are covered by the
#               fake-node tests, and every boot costs CI time)
#   bench-v2  figures, not a test (not in the default set; `scripts/bench.sh guest-v2`): the
#             guest_v2 bench (benches/guest_v2.rs) times event -> pin, event -> exclusive and
#             drift repair on 110 pods and an in-guest floor (mkdir + one cpuset.cpus write) on
#             6.12's cgroup v2; on TCG it runs on one TCG thread. The table is the `figures`
#             block of target/vm-e2e/bench-v2.results.log.
# The guest's /init is scripts/vm-e2e/init; the host judges its output with scripts/vm-e2e/check.py
# against testdata/vm/expected-topology.json. Prints `PASS <scenario>` or `FAIL <scenario>: <why>`
# per scenario and exits 1 if any failed.
#
# Usage: scripts/vm-e2e.sh [SCENARIO...]
#        (default: v2 v1 irq sched sched-v2 sched-v2-6.1 hotplug)
# Environment:
#   CPUSETD_BIN        use this binary instead of `cargo build --release`
#   VM_E2E_KERNEL      kernel image of the 6.12 scenarios (default: the newest
#                      /boot/vmlinuz-6.12.*; a 6.1 image boots v2, irq and hotplug on 6.1)
#   VM_E2E_KERNEL_6_1  kernel image of the 6.1 scenarios (default: the newest /boot/vmlinuz-6.1.*)
#   VM_E2E_ACCEL       kvm | tcg | auto (default: kvm when /dev/kvm boots a guest, else tcg)
#   VM_E2E_TIMEOUT     seconds per boot before qemu is killed (default 600: TCG on a loaded host)
#   VM_E2E_BENCH_SAMPLES  samples of bench-v2 (default 100)
#   GUEST_V2_BIN       bench-v2: use this guest_v2 bench binary instead of `cargo bench --no-run`
# VM_E2E_DEPS_ONLY=1 installs what is missing and stops (CI: no apt-get beside another script's).
# As root with apt-get it installs what is missing: qemu-system-x86, Linux 6.12
# (linux-image-6.12.*+deb12-amd64-unsigned, bookworm-security), Linux 6.1 (linux-image-amd64,
# when a 6.1 scenario runs), busybox-static, cpio. Build products go to target/vm-e2e/.
# shellcheck disable=SC2054 # qemu's options hold commas
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

scenarios=("$@")
[ "${#scenarios[@]}" -gt 0 ] || scenarios=(v2 v1 irq sched sched-v2 sched-v2-6.1 hotplug)
want_6_1=false
want_bench=false
for s in "${scenarios[@]}"; do
    case "$s" in
        v2 | irq | sched-v2 | hotplug) ;;
        bench-v2) want_bench=true ;;
        v1 | sched | hotplug-v1 | sched-v2-6.1) want_6_1=true ;;
        *)
            echo "vm-e2e: unknown scenario '$s' (known: v1 v2 irq sched sched-v2 sched-v2-6.1 hotplug hotplug-v1 bench-v2)" >&2
            exit 2
            ;;
    esac
done

work=$repo/target/vm-e2e
timeout_s=${VM_E2E_TIMEOUT:-600}

# --- dependencies --------------------------------------------------------------------------------
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v cpio >/dev/null || missing+=(cpio)
# The newest image of a kernel series in /boot (empty: none).
newest_kernel() { # series
    find /boot -maxdepth 1 -name "vmlinuz-$1.*" | sort -V | tail -n 1
}
need_6_12=false
if [ -z "${VM_E2E_KERNEL:-}" ] && [ -z "$(newest_kernel 6.12)" ]; then
    need_6_12=true
fi
if "$want_6_1" && [ -z "${VM_E2E_KERNEL_6_1:-}" ] && [ -z "$(newest_kernel 6.1)" ]; then
    missing+=(linux-image-amd64)
fi
busybox=/bin/busybox
if ! { [ -x "$busybox" ] && file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; }; then
    # Without `file`, trust dpkg.
    if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'; then
        missing+=(busybox-static)
    fi
fi
if [ "${#missing[@]}" -gt 0 ] || "$need_6_12"; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        "$need_6_12" && missing+=("a Linux 6.12 image")
        echo "vm-e2e: missing ${missing[*]}: install them (or run as root on Debian)" >&2
        exit 1
    fi
    apt-get update -qq
    if "$need_6_12"; then
        # The newest 6.12 image apt knows (Debian 12: bookworm-security), unsigned: QEMU boots it.
        k612=$(apt-cache pkgnames linux-image-6.12. |
            grep -E '^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$' | sort -V | tail -n 1 || true)
        [ -n "$k612" ] || {
            echo "vm-e2e: apt knows no linux-image-6.12.*+deb12-amd64-unsigned (is bookworm-security in the sources?)" >&2
            exit 1
        }
        missing+=("$k612")
    fi
    echo "vm-e2e: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
command -v python3 >/dev/null || {
    echo "vm-e2e: python3 is needed to judge the results" >&2
    exit 1
}
[ "${VM_E2E_DEPS_ONLY:-}" = 1 ] && exit 0

# The image's config has what the guest needs (all built in on Debian; a module would have to be
# copied into the initramfs and loaded).
check_kernel() { # image
    [ -r "$1" ] || {
        echo "vm-e2e: cannot read kernel image '$1'" >&2
        exit 1
    }
    local config=/boot/config-${1##*/vmlinuz-}
    [ -r "$config" ] || return 0
    for option in CONFIG_CPUSETS CONFIG_NUMA CONFIG_CGROUP_SCHED CONFIG_CFS_BANDWIDTH \
        CONFIG_SERIAL_8250_CONSOLE CONFIG_DEVTMPFS CONFIG_RD_GZIP CONFIG_INOTIFY_USER; do
        grep -qx "$option=y" "$config" || {
            echo "vm-e2e: $1 is not built with $option=y" >&2
            exit 1
        }
    done
}
kernel=${VM_E2E_KERNEL:-$(newest_kernel 6.12)}
check_kernel "$kernel"
kernel_6_1=
if "$want_6_1"; then
    kernel_6_1=${VM_E2E_KERNEL_6_1:-$(newest_kernel 6.1)}
    check_kernel "$kernel_6_1"
fi

# --- the binary and the initramfs ----------------------------------------------------------------
if [ -n "${CPUSETD_BIN:-}" ]; then
    bin=$CPUSETD_BIN
else
    cargo build --release --locked --quiet
    bin=$repo/target/release/cpusetd
fi
[ -x "$bin" ] || {
    echo "vm-e2e: no cpusetd binary at $bin" >&2
    exit 1
}

rm -rf "$work/root"
mkdir -p "$work/root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc}
root=$work/root
cp "$busybox" "$root/bin/busybox"
"$busybox" --list-full | while read -r applet; do
    [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done
# install_binary SRC NAME: SRC as /bin/NAME in the initramfs, with its shared libraries and the
# dynamic loader at the paths it names. The release profile keeps debug info; the guest does not
# need it (and gzip + TCG are slow).
install_binary() {
    if command -v strip >/dev/null; then
        strip -o "$root/bin/$2" "$1"
    else
        cp "$1" "$root/bin/$2"
    fi
    ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | while read -r lib; do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}
install_binary "$bin" cpusetd
# bench-v2: the guest_v2 bench binary (release profile; its libraries are the agent's).
if "$want_bench"; then
    bench_bin=${GUEST_V2_BIN:-}
    if [ -z "$bench_bin" ]; then
        bench_bin=$(cargo bench --locked --quiet --no-run --bench guest_v2 --message-format=json |
            python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "guest_v2" and m.get("executable"):
        print(m["executable"])')
    fi
    [ -x "$bench_bin" ] || {
        echo "vm-e2e: no guest_v2 bench binary at '$bench_bin'" >&2
        exit 1
    }
    install_binary "$bench_bin" guest_v2
fi
install -m 0755 "$repo/scripts/vm-e2e/init" "$root/init"
(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) |
    gzip -1 >"$work/initramfs.gz"

# --- booting -------------------------------------------------------------------------------------
qemu_common=(
    -machine q35 -cpu Skylake-Server
    -smp 8,sockets=2,cores=2,threads=2 -m 1024
    -object memory-backend-ram,id=m0,size=512M -object memory-backend-ram,id=m1,size=512M
    -numa node,nodeid=0,cpus=0-3,memdev=m0 -numa node,nodeid=1,cpus=4-7,memdev=m1
    -display none -monitor none -no-reboot -nodefaults
)

# shellcheck source=scripts/lib/qemu-accel.sh
. "$repo/scripts/lib/qemu-accel.sh"
accel=()
# The probe boots the default kernel; each scenario names its own below.
qemu_boot=("${qemu_common[@]}")
qemu_common+=(-kernel "$kernel")
choose_accel "${VM_E2E_ACCEL:-auto}" "$work/kvm-probe.log" || {
    echo "vm-e2e: VM_E2E_ACCEL must be kvm, tcg or auto" >&2
    exit 2
}
qemu_common=("${qemu_boot[@]}")
echo "vm-e2e: kernel $kernel${kernel_6_1:+ (cgroup v1 and sched-v2-6.1: $kernel_6_1)}, ${accel[1]}, initramfs $(du -h "$work/initramfs.gz" | cut -f1)" >&2

failed=0
for scenario in "${scenarios[@]}"; do
    console=$work/$scenario.console.log
    results=$work/$scenario.results.log
    rm -f "$console" "$results"
    started=$SECONDS
    qemu_status=0
    case "$scenario" in
        v1 | sched | hotplug-v1 | sched-v2-6.1) image=$kernel_6_1 ;;
        *) image=$kernel ;;
    esac
    # Multi-threaded TCG has hung 6.12 guests while cpuset partitions rebuild the scheduler
    # domains (init and kthreadd blocked for minutes right after the agent's first writes, once
    # in three CI runs; the same binary passed at once on a rerun), oopsed node-e2e's 6.12
    # guest in enqueue_entity, and oopsed the v2 scenario's 6.12 guest at boot (int3 in
    # set_next_task_fair, "Fatal exception in interrupt", 5 s after boot, before the agent
    # ran; a clean-clone CI run): every 6.12 boot runs on one TCG thread; 6.1 keeps all
    # threads. KVM is left as it is.
    scenario_accel=("${accel[@]}")
    if [ "$image" = "$kernel" ]; then one_thread=true; else one_thread=false; fi
    if "$one_thread" && [ "${accel[1]}" = tcg,thread=multi ]; then
        scenario_accel=(-accel tcg,thread=single)
    fi
    extra_append=
    if [ "$scenario" = bench-v2 ]; then
        extra_append=" cpusetd_bench_samples=${VM_E2E_BENCH_SAMPLES:-100}"
    fi
    # ttyS0: the console (kernel and /init output); ttyS1: what check.py reads.
    # sched_verbose: 6.12 fills debugfs' sched/domains/cpuN only with it (6.1 always does).
    timeout -k 10 "$timeout_s" qemu-system-x86_64 "${scenario_accel[@]}" "${qemu_common[@]}" \
        -kernel "$image" -initrd "$work/initramfs.gz" \
        -serial "file:$console" -serial "file:$results" \
        -append "console=ttyS0 panic=-1 quiet sched_verbose isolcpus=7 cpusetd_e2e=$scenario$extra_append" \
        </dev/null >"$work/$scenario.qemu.log" 2>&1 || qemu_status=$?
    elapsed=$((SECONDS - started))
    touch "$results" "$console"
    if reasons=$(python3 "$repo/scripts/vm-e2e/check.py" "$scenario" "$results" \
        "$repo/testdata/vm/expected-topology.json"); then
        echo "PASS $scenario (${elapsed}s)"
        continue
    fi
    failed=1
    why=$(head -n 1 <<<"$reasons")
    timed_out=false
    case "$qemu_status" in 124 | 137) timed_out=true ;; esac
    "$timed_out" && why="timed out after ${timeout_s}s; $why"
    echo "FAIL $scenario: $why"
    tail -n +2 <<<"$reasons" | sed 's/^/    /'
    if [ "$qemu_status" -ne 0 ] && ! "$timed_out"; then
        echo "    qemu exited $qemu_status:"
        tail -n 5 "$work/$scenario.qemu.log" | sed 's/^/    | /'
    fi
    echo "    last 30 lines of the console ($console):"
    tail -n 30 "$console" | tr -d '\r' | sed 's/^/    | /'
done
exit "$failed"
