# shellcheck shell=bash
# shellcheck disable=SC2034,SC2054,SC2154 # accel and qemu_common are the caller's; qemu options hold commas
# Sourced by scripts/vm-e2e.sh and scripts/node-e2e.sh: picks QEMU's accelerator.
# Needs the caller's `qemu_common` array (machine, cpus, memory, kernel).

# /dev/kvm can exist and still not run a guest (nested virtualisation): use it only if the
# kernel starts printing within a few seconds. $1: where the probe's console goes.
kvm_boots() {
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
    rm -f "$1"
    timeout 5 qemu-system-x86_64 -accel kvm "${qemu_common[@]}" \
        -serial "file:$1" -append "console=ttyS0 panic=-1" \
        </dev/null >/dev/null 2>&1 || true
    grep -q 'Linux version' "$1" 2>/dev/null
}

# Sets the array `accel` for MODE (kvm | tcg | auto: KVM when it boots a guest, else TCG);
# returns 2 for any other MODE. $2: the probe's console log.
choose_accel() { # mode probe-log
    case "$1" in
        kvm) accel=(-accel kvm) ;;
        tcg) accel=(-accel tcg,thread=multi) ;;
        auto)
            if kvm_boots "$2"; then accel=(-accel kvm); else accel=(-accel tcg,thread=multi); fi
            ;;
        *) return 2 ;;
    esac
}
