#!/usr/bin/env bash
# The scripts/node-e2e.sh guest test: run by node-e2e.service (scripts/node-e2e/runner.service)
# after multi-user.target, from the per-run disk mounted read-only at /mnt/e2e:
#   /mnt/e2e/run.sh              this script
#   /mnt/e2e/bin/cpusetd         the release binary under test
#   /mnt/e2e/bin/crikubelet      the CRI client that plays kubelet (absent: pin checks SKIP)
#   /mnt/e2e/repo/               scripts/install.sh, scripts/uninstall.sh, systemd/, README.md
#   /mnt/e2e/containerd.toml     /etc/containerd/config.toml
# The scenario (systemd-v2, systemd-v1) comes from `cpusetd_node_e2e=` on the kernel command
# line, the idle time of the watchdog check from `cpusetd_node_e2e_idle=` (seconds).
#
# ttyS1 gets only what the host parses: `PASS <check>`, `FAIL <check>: <why>`,
# `SKIP <check>: <why>`, then `@@DONE`. Everything (and diagnostics) also goes to the journal
# and the console (ttyS0). The host (scripts/node-e2e.sh) requires a PASS for every check named
# in scripts/node-e2e/checks.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

E2E=/mnt/e2e
REPO=/root/cpusetd
CGROUP=/sys/fs/cgroup
PROM=/var/lib/cpusetd/cpusetd.prom
# How long the agent may take to converge after an event (it takes milliseconds; a TCG guest
# on a loaded host is slower).
CONVERGE=30
GU_UID=6a0e0000-0000-4000-8000-0000000000a1
BU_UID=6a0e0000-0000-4000-8000-0000000000b2
BE_UID=6a0e0000-0000-4000-8000-0000000000e3

scenario=unknown
idle=120
read -ra cmdline </proc/cmdline
for word in "${cmdline[@]}"; do
    case "$word" in
        cpusetd_node_e2e=*) scenario=${word#cpusetd_node_e2e=} ;;
        cpusetd_node_e2e_idle=*) idle=${word#cpusetd_node_e2e_idle=} ;;
    esac
done

stty -F /dev/ttyS1 raw -echo 2>/dev/null || true
emit() {
    printf '%s\n' "$*" >/dev/ttyS1
    printf '%s\n' "$*"
}
pass() { emit "PASS $1"; }
fail() { # check why...
    local check=$1
    shift
    emit "FAIL $check: $*"
}
skip() {
    local check=$1
    shift
    emit "SKIP $check: $*"
}
log() { printf '+++ %s\n' "$*"; }
t0=$SECONDS
phase() { log "[$((SECONDS - t0))s] $*"; }

# On any unexpected error: say where, show the agent's journal, and end the run.
on_error() {
    local status=$? line=$1
    emit "FAIL harness: guest-test.sh line $line exited $status"
    journalctl -u cpusetd -u containerd --no-pager -n 60 -o short-monotonic || true
    emit "@@DONE"
    exit 1
}
trap 'on_error $LINENO' ERR

# `0-2,5` → `0 1 2 5`
expand() {
    local part parts out=() a b i
    IFS=, read -ra parts <<<"$1"
    for part in "${parts[@]}"; do
        [ -n "$part" ] || continue
        if [[ $part == *-* ]]; then
            a=${part%-*} b=${part#*-}
            for ((i = a; i <= b; i++)); do out+=("$i"); done
        else
            out+=("$part")
        fi
    done
    echo "${out[*]:-}"
}
# `0 1 2 5` → `0-2,5`
compress() {
    local res="" start="" prev="" c
    for c in $1; do
        if [ -z "$start" ]; then
            start=$c prev=$c
        elif [ "$c" -eq $((prev + 1)) ]; then
            prev=$c
        else
            res+="${res:+,}$start$([ "$start" = "$prev" ] || echo "-$prev")"
            start=$c prev=$c
        fi
    done
    [ -z "$start" ] || res+="${res:+,}$start$([ "$start" = "$prev" ] || echo "-$prev")"
    echo "$res"
}
# The set difference A − B of two CPU lists, as a list.
minus() {
    local a b keep=()
    for a in $(expand "$1"); do
        for b in $(expand "$2"); do [ "$a" = "$b" ] && continue 2; done
        keep+=("$a")
    done
    compress "${keep[*]:-}"
}
cpus_of_pid() { awk '/^Cpus_allowed_list:/ { print $2 }' "/proc/$1/status"; }
same_cpus() { [ "$(expand "$1")" = "$(expand "$2")" ]; }

# wait_until SECONDS COMMAND...: polls every 0.2 s.
wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

unit_prop() { systemctl show -p "$1" --value cpusetd.service; }
metric() { awk -v m="$1" '$1 == m { print $2 }' "$PROM" 2>/dev/null || true; }

# The cgroup directory of a process for a controller: `cpuset` or `cpu`.
cgroup_dir() { # pid controller
    if [ "$mode" = v2 ]; then
        echo "$CGROUP$(sed -n 's/^0:://p' "/proc/$1/cgroup")"
        return
    fi
    local line controllers path
    while IFS= read -r line; do
        controllers=${line#*:}
        path=${controllers#*:}
        controllers=${controllers%%:*}
        case ",$controllers," in
            *",$2,"*)
                echo "$CGROUP/$controllers$path"
                return
                ;;
        esac
    done <"/proc/$1/cgroup"
    return 1
}
# The CFS quota of a process's cgroup: `max` or microseconds.
quota_of() {
    local dir
    dir=$(cgroup_dir "$1" cpu)
    if [ "$mode" = v2 ]; then
        cut -d' ' -f1 "$dir/cpu.max"
    else
        local q
        q=$(cat "$dir/cpu.cfs_quota_us")
        if [ "$q" = -1 ]; then echo max; else echo "$q"; fi
    fi
}

failed_setup() { # check why: a FAIL that makes the rest meaningless
    fail "$@"
    journalctl -u cpusetd -u containerd --no-pager -n 60 -o short-monotonic || true
    emit "@@DONE"
    exit 0
}

phase "scenario $scenario, idle ${idle}s"
all_cpus=$(cat /sys/devices/system/cpu/online)

# --- cgroup mode -----------------------------------------------------------------------------
case "$(stat -fc %T "$CGROUP")" in
    cgroup2fs) mode=v2 ;;
    tmpfs) mode=v1 ;;
    *) mode=unknown ;;
esac
log "cgroup mounts: $(findmnt -rn -o TARGET,FSTYPE -t cgroup,cgroup2 | tr '\n' ' ')"
want_mode=${scenario#systemd-}
if [ "$mode" = "$want_mode" ] && [ "$(ps -o comm= -p 1)" = systemd ]; then
    pass cgroup-mode
else
    failed_setup cgroup-mode "want systemd as PID 1 on cgroup $want_mode, have $(ps -o comm= -p 1) on $mode"
fi

# --- containerd with the systemd cgroup driver, local images -----------------------------------
phase "containerd"
image_listed() { ctr -n k8s.io images ls -q 2>/dev/null | grep -qxF "$1"; }
crikubelet=()
if [ -x "$E2E/bin/crikubelet" ]; then
    crikubelet=("$E2E/bin/crikubelet" --driver systemd)
fi
mkdir -p /etc/containerd
sed 's|SANDBOX_IMAGE|registry.invalid/pause:none|' "$E2E/containerd.toml" >/etc/containerd/config.toml
systemctl start containerd.service
wait_until 30 ctr version >/dev/null 2>&1 || failed_setup containerd "ctr cannot reach containerd"
if [ "${#crikubelet[@]}" -gt 0 ]; then
    images=$("${crikubelet[@]}" images) || failed_setup containerd "crikubelet images failed"
    log "images: $images"
    pause=$(grep -m1 pause <<<"$images" || true)
    [ -n "$pause" ] || failed_setup containerd "crikubelet images printed no pause image: $images"
    sed "s|SANDBOX_IMAGE|$pause|" "$E2E/containerd.toml" >/etc/containerd/config.toml
    systemctl restart containerd.service
    wait_until 30 ctr version >/dev/null 2>&1 || failed_setup containerd "containerd did not come back"
    # Listed once containerd answers for its images too (right after a restart, `ctr version`
    # answered while `images ls` did not list it yet in a side-by-side run).
    if ! wait_until 30 image_listed "$pause"; then
        failed_setup containerd "$pause is not in containerd's k8s.io namespace: $(ctr -n k8s.io images ls -q 2>&1 | tr '\n' ' ')"
    fi
fi
if containerd config dump | grep -q 'SystemdCgroup = true'; then
    pass containerd
else
    failed_setup containerd "containerd's live config has no SystemdCgroup = true"
fi

# --- install, as an operator would -----------------------------------------------------------
phase "install"
rm -rf "$REPO"
cp -a "$E2E/repo" "$REPO"
if ! CPUSETD_BIN=$E2E/bin/cpusetd "$REPO/scripts/install.sh" --no-start; then
    failed_setup install "scripts/install.sh failed"
fi
# The systemd driver: kubelet's kubepods.slice under the unified root (v2) or in each
# controller's hierarchy (v1); the agent finds the mounts in /proc/self/mountinfo.
sed -i 's|^CPUSETD_ARGS="|CPUSETD_ARGS="--cgroup-driver systemd --kubepods-path kubepods.slice |' \
    /etc/default/cpusetd
cp /etc/default/cpusetd /root/cpusetd.default
log "$(grep '^CPUSETD_ARGS' /etc/default/cpusetd)"
if cmp -s "$REPO/systemd/cpusetd.service" /etc/systemd/system/cpusetd.service &&
    [ "$(systemctl is-enabled cpusetd.service)" = enabled ] &&
    cmp -s "$E2E/bin/cpusetd" /usr/local/bin/cpusetd; then
    pass install
else
    failed_setup install "the unit or the binary is not what the repo ships, or not enabled"
fi

# --- READY (Type=notify) and STATUS ------------------------------------------------------------
phase "start"
if ! systemctl start cpusetd.service; then
    failed_setup ready "systemctl start cpusetd failed: $(unit_prop Result)"
fi
# `systemctl start` of a Type=notify unit returns once READY=1 arrived.
state="$(unit_prop ActiveState)/$(unit_prop SubState)"
status_text=$(unit_prop StatusText)
unit_type=$(unit_prop Type)
if [ "$unit_type" = notify ] && [ "$state" = active/running ] && [ -n "$status_text" ]; then
    pass ready
else
    fail ready "Type=$unit_type, state $state, StatusText '$status_text'"
fi
log "STATUS: $status_text"

# --- pods through the CRI ------------------------------------------------------------------------
pods_ok=no
if [ "${#crikubelet[@]}" -eq 0 ]; then
    for check in pods exclusive-pin shared-pin quota-lifted status-text drift-repair \
        container-restart-repinned; do
        skip "$check" "crikubelet is not built"
    done
else
    phase "pods"
    mkdir -p /root/pods
    cat >/root/pods/gu.json <<EOF
{"name":"gu","namespace":"default","uid":"$GU_UID","containers":[{"name":"app","cpu_request_milli":2000,"cpu_limit_milli":2000,"memory_request":67108864,"memory_limit":67108864}]}
EOF
    cat >/root/pods/bu.json <<EOF
{"name":"bu","namespace":"default","uid":"$BU_UID","containers":[{"name":"app","cpu_request_milli":500,"cpu_limit_milli":1000,"memory_request":33554432,"memory_limit":67108864}]}
EOF
    cat >/root/pods/be.json <<EOF
{"name":"be","namespace":"default","uid":"$BE_UID","containers":[{"name":"app","cpu_request_milli":0,"cpu_limit_milli":0,"memory_request":0,"memory_limit":0}]}
EOF
    pods_ok=yes
    for pod in gu bu be; do
        if ! "${crikubelet[@]}" run-pod "/root/pods/$pod.json" >"/root/pods/$pod.state.json"; then
            fail pods "crikubelet run-pod $pod failed"
            pods_ok=no
            break
        fi
        log "$pod: $(cat "/root/pods/$pod.state.json")"
    done
    if [ "$pods_ok" = yes ]; then
        gu_pid=$(jq -r '.containers[0].pid' /root/pods/gu.state.json)
        bu_pid=$(jq -r '.containers[0].pid' /root/pods/bu.state.json)
        be_pid=$(jq -r '.containers[0].pid' /root/pods/be.state.json)
        for pid in "$gu_pid" "$bu_pid" "$be_pid"; do
            if ! [ -d "/proc/$pid" ]; then
                fail pods "container pid '$pid' is not a live process"
                pods_ok=no
            fi
        done
    fi
    if [ "$pods_ok" = yes ]; then
        case "$(cgroup_dir "$gu_pid" cpuset)" in
            "$CGROUP"*/kubepods.slice/kubepods-pod*.slice/cri-containerd-*.scope) pass pods ;;
            *)
                fail pods "the Guaranteed container is not in a systemd-driver pod slice: $(cgroup_dir "$gu_pid" cpuset)"
                pods_ok=no
                ;;
        esac
    fi
    if [ "$pods_ok" = no ]; then
        for check in exclusive-pin shared-pin quota-lifted status-text drift-repair \
            container-restart-repinned; do
            skip "$check" "no pods"
        done
    fi
fi

# An exclusive set for the Guaranteed 2-CPU container: two CPUs, one core's two threads, not
# the reserved CPU 0.
is_exclusive_pair() {
    local set cpus
    set=$(cpus_of_pid "$1")
    read -ra cpus <<<"$(expand "$set")"
    [ "${#cpus[@]}" = 2 ] || return 1
    [ "${cpus[0]}" != 0 ] || return 1
    same_cpus "$(cat "/sys/devices/system/cpu/cpu${cpus[0]}/topology/thread_siblings_list")" "$set"
}
pinned_as_expected() { # exclusive set: gu has it, bu and be have all the rest
    same_cpus "$(cpus_of_pid "$gu_pid")" "$1" &&
        same_cpus "$(cpus_of_pid "$bu_pid")" "$(minus "$all_cpus" "$1")" &&
        same_cpus "$(cpus_of_pid "$be_pid")" "$(minus "$all_cpus" "$1")"
}

if [ "$pods_ok" = yes ]; then
    phase "pins"
    if wait_until "$CONVERGE" is_exclusive_pair "$gu_pid"; then
        exclusive=$(cpus_of_pid "$gu_pid")
        pass exclusive-pin
        log "exclusive $exclusive"
    else
        exclusive=""
        fail exclusive-pin "the Guaranteed container's process has Cpus_allowed_list $(cpus_of_pid "$gu_pid"), want one core's two threads without CPU 0"
    fi
    shared=$(minus "$all_cpus" "${exclusive:-}")
    if [ -n "$exclusive" ] && wait_until "$CONVERGE" pinned_as_expected "$exclusive"; then
        pass shared-pin
    else
        fail shared-pin "Burstable $(cpus_of_pid "$bu_pid"), BestEffort $(cpus_of_pid "$be_pid"), want $shared"
    fi
    # The pod's and the container's CFS quota are lifted (kubelet's
    # DisableCPUQuotaWithExclusiveCPUs); the Burstable one keeps its limit.
    gu_quota=$(quota_of "$gu_pid")
    bu_quota=$(quota_of "$bu_pid")
    if [ "$gu_quota" = max ] && [ "$bu_quota" != max ]; then
        pass quota-lifted
    else
        fail quota-lifted "Guaranteed quota $gu_quota (want max), Burstable $bu_quota (want its limit)"
    fi
    want_status="1 with exclusive cpus, shared pool $shared"
    status_has() { [[ "$(unit_prop StatusText)" == *"$want_status"* ]]; }
    if wait_until "$CONVERGE" status_has; then
        pass status-text
    else
        fail status-text "StatusText '$(unit_prop StatusText)', want '… $want_status'"
    fi
    log "STATUS: $(unit_prop StatusText)"

    # A foreign write: one of the two CPUs only (a narrowing, valid on v1 and v2).
    phase "drift"
    gu_cpuset=$(cgroup_dir "$gu_pid" cpuset)/cpuset.cpus
    repairs_before=$(metric cpusetd_drift_repairs_total)
    read -ra pair <<<"$(expand "${exclusive:-1}")"
    foreign=${pair[0]}
    echo "$foreign" >"$gu_cpuset"
    repaired() {
        same_cpus "$(cat "$gu_cpuset")" "$exclusive" &&
            same_cpus "$(cpus_of_pid "$gu_pid")" "$exclusive" &&
            [ "$(metric cpusetd_drift_repairs_total)" != "${repairs_before:-}" ]
    }
    if [ -n "$exclusive" ] && wait_until "$CONVERGE" repaired; then
        pass drift-repair
    else
        fail drift-repair "after writing $foreign to $gu_cpuset: file $(cat "$gu_cpuset"), process $(cpus_of_pid "$gu_pid"), drift repairs ${repairs_before:-none} → $(metric cpusetd_drift_repairs_total)"
    fi

    # A container restart (attempt+1, a new cgroup) is pinned again, to the same CPUs.
    phase "container restart"
    if "${crikubelet[@]}" restart /root/pods/gu.state.json app >/root/pods/gu.state2.json; then
        cp /root/pods/gu.state2.json /root/pods/gu.state.json
        old_gu_pid=$gu_pid
        # The later checks follow the new container.
        gu_pid=$(jq -r '.containers[0].pid' /root/pods/gu.state.json)
        # kubelet keeps a container's CPUs across restarts (same pod, same name): so must the agent.
        if [ -d "/proc/$gu_pid" ] && [ "$gu_pid" != "$old_gu_pid" ] &&
            [ "$(jq -r '.containers[0].attempt' /root/pods/gu.state.json)" = 1 ] &&
            wait_until "$CONVERGE" pinned_as_expected "$exclusive"; then
            pass container-restart-repinned
        else
            fail container-restart-repinned "new pid '$gu_pid' (was $old_gu_pid): Cpus_allowed_list $(cpus_of_pid "$gu_pid" 2>/dev/null || echo gone), want $exclusive"
        fi
    else
        fail container-restart-repinned "crikubelet restart failed"
    fi
fi

# --- the watchdog stays quiet ------------------------------------------------------------------
phase "idle ${idle}s"
sleep "$idle"
restarts=$(unit_prop NRestarts)
watchdog_lines=$(journalctl -u cpusetd.service --no-pager -o cat | grep -i watchdog || true)
watchdog=$(unit_prop WatchdogUSec)
if [ "$watchdog" = 30s ] && [ "$restarts" = 0 ] && [ -z "$watchdog_lines" ] &&
    [ "$(unit_prop ActiveState)" = active ]; then
    pass watchdog-idle
else
    fail watchdog-idle "after ${idle}s with WatchdogUSec=$watchdog: NRestarts $restarts, $(unit_prop ActiveState), journal: $(head -n 1 <<<"$watchdog_lines")"
fi

# --- SIGKILL: systemd restarts it, the pins stay -----------------------------------------------
phase "kill"
old_pid=$(unit_prop MainPID)
systemctl kill -s KILL cpusetd.service
restarted() {
    [ "$(unit_prop NRestarts)" = $((restarts + 1)) ] &&
        [ "$(unit_prop ActiveState)/$(unit_prop SubState)" = active/running ] &&
        [ "$(unit_prop MainPID)" != "$old_pid" ]
}
if wait_until 30 restarted; then
    pass kill-restart
else
    fail kill-restart "NRestarts $(unit_prop NRestarts) (was $restarts), $(unit_prop ActiveState)/$(unit_prop SubState), MainPID $(unit_prop MainPID) (was $old_pid)"
fi
if [ "$pods_ok" = yes ]; then
    # The restarted agent adopts the live pins: nothing moves (checked for a few seconds, and
    # after its first pass has sent a status with the containers in it).
    kept=yes
    wait_until "$CONVERGE" status_has || kept=no
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        [ -n "$exclusive" ] && pinned_as_expected "$exclusive" || kept=no
        sleep 0.5
    done
    if [ "$kept" = yes ]; then
        pass pins-kept-after-restart
    else
        fail pins-kept-after-restart "Guaranteed $(cpus_of_pid "$gu_pid") (was $exclusive), Burstable $(cpus_of_pid "$bu_pid"), StatusText '$(unit_prop StatusText)'"
    fi
else
    skip pins-kept-after-restart "no pods"
fi

# --- what the cluster reads: the PodResources socket and /metrics over HTTP --------------------
# `cpusetd pod-resources list` (the client generated from kubelet's proto, as NFD's
# topology-updater asks) must give the Guaranteed container its exclusive cpus as cpu_ids, the
# same as its Cpus_allowed_list; with the opt-in systemd/cpusetd-metrics.conf (the base unit has
# no network) the agent serves /metrics on localhost with the container's series. Then the
# drop-in and the flags go again (the checks below judge the base unit).
phase "pod-resources and metrics"
PODRES=/var/lib/cpusetd/pod-resources.sock
METRICS_PORT=9479
if [ "$pods_ok" = yes ] && [ -n "$exclusive" ]; then
    install -D -m 0644 "$REPO/systemd/cpusetd-metrics.conf" /etc/systemd/system/cpusetd.service.d/metrics.conf
    sed -i "s|^CPUSETD_ARGS=\"|CPUSETD_ARGS=\"--pod-resources-socket $PODRES --metrics-bind-address 127.0.0.1:$METRICS_PORT |" \
        /etc/default/cpusetd
    log "$(grep '^CPUSETD_ARGS' /etc/default/cpusetd)"
    systemctl daemon-reload
    systemctl restart cpusetd.service || log "restart with the metrics drop-in failed: $(unit_prop Result)"
    gu_cpu_ids() {
        cpusetd pod-resources list --socket "$PODRES" 2>>/root/pod-resources.err |
            jq -r '.pod_resources[] | select(.namespace == "default" and .name == "gu")
                   | .containers[] | select(.name == "app") | .cpu_ids | map(tostring) | join(",")'
    }
    pod_resources_agree() {
        local ids
        ids=$(gu_cpu_ids) && [ -n "$ids" ] && same_cpus "$ids" "$(cpus_of_pid "$gu_pid")" &&
            same_cpus "$ids" "$exclusive"
    }
    if wait_until "$CONVERGE" pod_resources_agree; then
        pass pod-resources-cli
        log "pod-resources: gu/app cpu_ids $(gu_cpu_ids)"
    else
        fail pod-resources-cli "cpu_ids '$(gu_cpu_ids || true)' of default/gu/app, Cpus_allowed_list $(cpus_of_pid "$gu_pid") (pinned $exclusive): $(tail -n 1 /root/pod-resources.err 2>/dev/null || true)"
    fi
    scrape() {
        printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' |
            socat -t 5 - "TCP:127.0.0.1:$METRICS_PORT" 2>/dev/null | tr -d '\r'
    }
    served() {
        scrape | grep -qxF 'cpusetd_container_exclusive_cpus{namespace="default",pod="gu",container="app"} 2'
    }
    if wait_until "$CONVERGE" served; then
        pass metrics-http
    else
        fail metrics-http "http://127.0.0.1:$METRICS_PORT/metrics has no 2 exclusive cpus for default/gu/app: '$(scrape | grep -E '^(HTTP|cpusetd_container_exclusive_cpus)' | tr '\n' ' ' || true)' $(journalctl -u cpusetd.service --no-pager -o cat | grep -i metrics | tail -n 1)"
    fi
    rm -f /etc/systemd/system/cpusetd.service.d/metrics.conf
    cp /root/cpusetd.default /etc/default/cpusetd
    systemctl daemon-reload
    systemctl restart cpusetd.service
else
    skip pod-resources-cli "no pinned pod"
    skip metrics-http "no pinned pod"
fi

# --- the opt-in irq drop-in: a pod saying irq-load-balancing.crio.io: "disable" -----------------
# The base unit keeps /proc/irq read-only (ProtectKernelTunables=yes); systemd/cpusetd-irq.conf
# opens that one directory. Every IRQ the kernel lets one move must leave the pod's CPU while it
# runs and come back after; then the drop-in goes again (the checks below judge the base unit).
phase "irq drop-in"
if [ "$pods_ok" = yes ]; then
    install -D -m 0644 "$REPO/systemd/cpusetd-irq.conf" /etc/systemd/system/cpusetd.service.d/irq.conf
    systemctl daemon-reload
    systemctl restart cpusetd.service
    : >/root/irqs.before
    for f in /proc/irq/[0-9]*/smp_affinity_list; do
        list=$(cat "$f")
        if echo "$list" >"$f" 2>/dev/null; then echo "$f $list" >>/root/irqs.before; fi
    done
    default_before=$(cat /proc/irq/default_smp_affinity)
    log "movable IRQs: $(wc -l </root/irqs.before), default_smp_affinity $default_before"
    echo '{"name":"rt","namespace":"telco","uid":"6a0e0000-0000-4000-8000-0000000000c3","annotations":{"irq-load-balancing.crio.io":"disable"},"containers":[{"name":"dp","cpu_request_milli":1000,"cpu_limit_milli":1000,"memory_request":67108864,"memory_limit":67108864}]}' >/root/pods/rt.json
    irq_ok=yes
    if ! "${crikubelet[@]}" run-pod /root/pods/rt.json >/root/pods/rt.state.json; then
        irq_ok=no
        fail irq-dropin "crikubelet run-pod rt failed"
    fi
    rt_pid=$(jq -r '.containers[0].pid' /root/pods/rt.state.json 2>/dev/null || echo 0)
    rt_pinned() { [ "$(expand "$(cpus_of_pid "$rt_pid")" | wc -w)" = 1 ]; }
    irqs_off() { # cpu
        while read -r f list; do
            others=$(expand "$list" | tr ' ' '\n' | grep -vx "$1" | grep -c . || true)
            [ "$others" -gt 0 ] || continue
            expand "$(cat "$f")" | tr ' ' '\n' | grep -qx "$1" && return 1
        done </root/irqs.before
        return 0
    }
    irqs_back() {
        while read -r f list; do [ "$(cat "$f")" = "$list" ] || return 1; done </root/irqs.before
        [ "$(cat /proc/irq/default_smp_affinity)" = "$default_before" ]
    }
    if [ "$irq_ok" = yes ] && wait_until "$CONVERGE" rt_pinned; then
        rt_cpu=$(cpus_of_pid "$rt_pid")
        if wait_until "$CONVERGE" irqs_off "$rt_cpu"; then
            log "IRQs off cpu $rt_cpu, default_smp_affinity $(cat /proc/irq/default_smp_affinity)"
        else
            irq_ok=no
            fail irq-dropin "IRQs still on cpu $rt_cpu: $(journalctl -u cpusetd.service --no-pager -o cat | grep -i interrupt | tail -n 2 | tr '\n' ' ')"
        fi
    elif [ "$irq_ok" = yes ]; then
        irq_ok=no
        fail irq-dropin "the rt container is on $(cpus_of_pid "$rt_pid"), not one exclusive cpu"
    fi
    "${crikubelet[@]}" delete-pod /root/pods/rt.state.json >/dev/null || log "delete-pod rt failed"
    if [ "$irq_ok" = yes ]; then
        if wait_until "$CONVERGE" irqs_back; then
            pass irq-dropin
        else
            fail irq-dropin "IRQs not restored after the pod went (default $(cat /proc/irq/default_smp_affinity), was $default_before)"
        fi
    fi
    rm -f /etc/systemd/system/cpusetd.service.d/irq.conf
    systemctl daemon-reload
    systemctl restart cpusetd.service
else
    skip irq-dropin "no pods"
fi

# --- irqbalance told over its socket, by the confined agent ------------------------------------
# Debian's irqbalance (1.9, started by its own unit: /run/irqbalance/irqbalance<pid>.sock) must
# get the rt pod's CPU in its banned set while the pod runs (read back from the daemon itself
# with `setup`, after its next rescan) and only its own banned CPUs after. The agent runs as the
# shipped unit plus the irq drop-in. irqbalance moves IRQs itself, so this comes after the
# irq-dropin check, which compares affinities exactly.
phase "irqbalance"
if [ "$pods_ok" = yes ] && systemctl start irqbalance.service; then
    install -D -m 0644 "$REPO/systemd/cpusetd-irq.conf" /etc/systemd/system/cpusetd.service.d/irq.conf
    systemctl daemon-reload
    systemctl restart cpusetd.service
    irqb_socket() { find /run/irqbalance -maxdepth 1 -name 'irqbalance*.sock' 2>/dev/null | head -n 1; }
    irqb_banned() { # the daemon's banned CPUs now, as a list
        local socket mask
        socket=$(irqb_socket)
        [ -n "$socket" ] || return 1
        mask=$(printf setup | socat -t 5 - "UNIX-CONNECT:$socket" 2>/dev/null |
            sed -n 's/.*BANNED \([0-9a-f,]*\).*/\1/p') || return 1
        [ -n "$mask" ] || return 1
        local hex=${mask//,/} cpus=() i
        for ((i = 0; i < ${#hex} * 4; i++)); do
            (((16#${hex:$((${#hex} - 1 - i / 4)):1} >> (i % 4)) & 1)) && cpus+=("$i")
        done
        compress "${cpus[*]:-}"
    }
    irqb_bans() { [ "$(irqb_banned)" = "$1" ]; }
    irqb_ok=yes
    if ! wait_until "$CONVERGE" irqb_banned >/dev/null; then
        irqb_ok=no
        fail irqbalance-told "irqbalance answers no setup on $(irqb_socket || true): $(systemctl status irqbalance.service --no-pager 2>&1 | tail -n 3 | tr '\n' ' ')"
    fi
    own=$(irqb_banned || true)
    log "irqbalance $(irqb_socket) bans '${own}' of its own"
    if [ "$irqb_ok" = yes ] && ! "${crikubelet[@]}" run-pod /root/pods/rt.json >/root/pods/rt.state.json; then
        irqb_ok=no
        fail irqbalance-told "crikubelet run-pod rt failed"
    fi
    rt_pid=$(jq -r '.containers[0].pid' /root/pods/rt.state.json 2>/dev/null || echo 0)
    if [ "$irqb_ok" = yes ] && wait_until "$CONVERGE" rt_pinned; then
        rt_cpu=$(cpus_of_pid "$rt_pid")
        want=$(compress "$(expand "$own,$rt_cpu" | tr ' ' '\n' | sort -nu | tr '\n' ' ')")
        if wait_until "$CONVERGE" irqb_bans "$want"; then
            log "irqbalance bans $want while the rt pod runs on cpu $rt_cpu"
            # A restarted irqbalance (a new pid, a new /run/irqbalance) forgot: the agent's
            # next full reconcile tells it again.
            systemctl restart irqbalance.service
            if wait_until $((CONVERGE * 2)) irqb_bans "$want"; then
                log "the restarted irqbalance $(irqb_socket) bans $want again"
            else
                irqb_ok=no
                fail irqbalance-told "the restarted irqbalance bans '$(irqb_banned || true)', not $want: $(journalctl -u cpusetd.service --no-pager -o cat | grep -i irqbalance | tail -n 2 | tr '\n' ' ')"
            fi
        else
            irqb_ok=no
            fail irqbalance-told "irqbalance bans '$(irqb_banned || true)', not $want: $(journalctl -u cpusetd.service --no-pager -o cat | grep -i irqbalance | tail -n 2 | tr '\n' ' ')"
        fi
    elif [ "$irqb_ok" = yes ]; then
        irqb_ok=no
        fail irqbalance-told "the rt container is on $(cpus_of_pid "$rt_pid"), not one exclusive cpu"
    fi
    "${crikubelet[@]}" delete-pod /root/pods/rt.state.json >/dev/null || log "delete-pod rt failed"
    if [ "$irqb_ok" = yes ]; then
        if wait_until "$CONVERGE" irqb_bans "$own"; then
            pass irqbalance-told
        else
            fail irqbalance-told "irqbalance still bans '$(irqb_banned || true)' after the pod went (its own: '$own')"
        fi
    fi
    systemctl stop irqbalance.service || true
    rm -f /etc/systemd/system/cpusetd.service.d/irq.conf
    systemctl daemon-reload
    systemctl restart cpusetd.service
else
    skip irqbalance-told "no pods, or irqbalance.service does not start"
fi

# --- --isolate-host on a systemd host: the host slices confined through systemd ----------------
# cgroup v2 only (systemd's AllowedCPUs= exists only there). The agent runs with --isolate-host
# (reserved cpu 0) and a pod says cpu-load-balancing.crio.io: "disable": system.slice,
# user.slice and init.scope must get AllowedCPUs=0 from systemd itself (the property and the
# cgroup file agree), and keep it, with every pin, across `systemctl daemon-reload`, a restart
# of containerd and a restart of an ordinary service; a kill -9 of the agent changes nothing;
# the pod gone, every slice has its original cpuset.cpus and effective set back; and `cpusetd
# reset` gives them back too.
HOST_UNITS="system.slice user.slice init.scope"
slices_now() { # unit:cpus:effective:AllowedCPUs for each host unit
    local u out=()
    for u in $HOST_UNITS; do
        out+=("$u:$(cat "$CGROUP/$u/cpuset.cpus" 2>/dev/null):$(cat "$CGROUP/$u/cpuset.cpus.effective" 2>/dev/null):$(systemctl show -p AllowedCPUs --value "$u")")
    done
    echo "${out[*]}"
}
slices_confined() { # every host unit: cpuset.cpus, effective and AllowedCPUs all 0
    local u
    for u in $HOST_UNITS; do
        [ "$(cat "$CGROUP/$u/cpuset.cpus")" = 0 ] || return 1
        [ "$(cat "$CGROUP/$u/cpuset.cpus.effective")" = 0 ] || return 1
        [ "$(systemctl show -p AllowedCPUs --value "$u")" = 0 ] || return 1
    done
}
# Given back: each unit's effective set as before, and its cpuset.cpus (and AllowedCPUs) as
# before or, where that was empty (inheriting), the explicit list of its effective set before:
# Linux refuses an empty cpuset.cpus to a populated cgroup (ENOSPC), so systemd cannot put the
# empty one back (docs/DECISIONS.md).
slices_original() {
    local now before u cpus eff allowed bcpus beff ballowed
    read -ra now <<<"$(slices_now)"
    read -ra before <<<"$slices_before"
    [ "${#now[@]}" = "${#before[@]}" ] || return 1
    for u in "${!now[@]}"; do
        IFS=: read -r _ cpus eff allowed <<<"${now[$u]}"
        IFS=: read -r _ bcpus beff ballowed <<<"${before[$u]}"
        same_cpus "$eff" "$beff" || return 1
        same_cpus "$cpus" "$bcpus" || { [ -z "$bcpus" ] && same_cpus "$cpus" "$beff"; } || return 1
        same_cpus "$allowed" "$ballowed" || { [ -z "$ballowed" ] && same_cpus "$allowed" "$beff"; } || return 1
    done
}
unit_pid() { systemctl show -p MainPID --value "$1"; }
pid_on_reserved() { local p; p=$(unit_pid "$1"); [ "$p" != 0 ] && [ "$(cpus_of_pid "$p")" = 0 ]; }
lb_pinned() { # the lb container: 2 cpus of its own, an isolated partition
    local dir
    dir=$(cgroup_dir "$lb_pid" cpuset)
    [ "$(expand "$(cpus_of_pid "$lb_pid")" | wc -w)" = 2 ] &&
        [ "$(cat "$dir/cpuset.cpus.partition" 2>/dev/null)" = isolated ]
}
all_held() { # the confinement and every pin as they were
    slices_confined && pid_on_reserved containerd.service && pid_on_reserved e2e-ordinary.service &&
        [ "$(cpus_of_pid "$lb_pid")" = "$lb_cpus" ] &&
        same_cpus "$(cpus_of_pid "$gu_pid")" "$exclusive" &&
        same_cpus "$(cpus_of_pid "$bu_pid")" "$(minus "$(minus "$all_cpus" "$exclusive")" "$lb_cpus")"
}
held_after() { # check what: $what done just before; PASS if all held at once and stayed so
    local check=$1 what=$2 kept=yes
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        all_held || kept=no
        sleep 0.5
    done
    if [ "$kept" = yes ]; then
        pass "$check"
    else
        fail "$check" "after $what: slices $(slices_now); containerd $(cpus_of_pid "$(unit_pid containerd.service)"), e2e-ordinary $(cpus_of_pid "$(unit_pid e2e-ordinary.service)"); lb $(cpus_of_pid "$lb_pid") (was $lb_cpus), gu $(cpus_of_pid "$gu_pid") (was $exclusive), bu $(cpus_of_pid "$bu_pid")"
    fi
}
SYSTEMD_CHECKS="host-confined-systemd held-daemon-reload held-containerd-restart held-service-restart slice-drift-repaired host-restored-systemd host-reset-systemd"
phase "isolate-host through systemd"
if [ "$mode" = v2 ] && [ "$pods_ok" = yes ] && [ -n "$exclusive" ]; then
    slices_before=$(slices_now)
    log "host slices before: $slices_before"
    printf '[Service]\nExecStart=/bin/sleep infinity\n' >/etc/systemd/system/e2e-ordinary.service
    systemctl daemon-reload
    systemctl start e2e-ordinary.service
    sed -i 's|^CPUSETD_ARGS="|CPUSETD_ARGS="--isolate-host |' /etc/default/cpusetd
    # The lb pod's remote partition wants CAP_SYS_ADMIN (Linux 6.12): the opt-in drop-in,
    # installed the way a user would (scripts/install.sh --partitions); gone after this section.
    CPUSETD_BIN=$E2E/bin/cpusetd "$REPO/scripts/install.sh" --no-start --partitions >/dev/null ||
        log "install.sh --partitions failed"
    systemctl daemon-reload
    systemctl restart cpusetd.service
    echo '{"name":"lb","namespace":"telco","uid":"6a0e0000-0000-4000-8000-0000000000d4","annotations":{"cpu-load-balancing.crio.io":"disable"},"containers":[{"name":"dp","cpu_request_milli":2000,"cpu_limit_milli":2000,"memory_request":67108864,"memory_limit":67108864}]}' >/root/pods/lb.json
    sd_ok=yes
    "${crikubelet[@]}" run-pod /root/pods/lb.json >/root/pods/lb.state.json || sd_ok=no
    lb_pid=$(jq -r '.containers[0].pid' /root/pods/lb.state.json 2>/dev/null || echo 0)
    if [ "$sd_ok" = yes ] && wait_until "$CONVERGE" lb_pinned && wait_until "$CONVERGE" slices_confined; then
        lb_cpus=$(cpus_of_pid "$lb_pid")
        log "lb on $lb_cpus (isolated partition), slices $(slices_now)"
        if wait_until "$CONVERGE" all_held; then
            pass host-confined-systemd
        else
            sd_ok=no
            fail host-confined-systemd "slices $(slices_now), containerd on $(cpus_of_pid "$(unit_pid containerd.service)"), lb $lb_cpus, gu $(cpus_of_pid "$gu_pid"), bu $(cpus_of_pid "$bu_pid")"
        fi
    else
        sd_ok=no
        fail host-confined-systemd "lb pod $(cpus_of_pid "$lb_pid" 2>/dev/null) partition $(cat "$(cgroup_dir "$lb_pid" cpuset 2>/dev/null)/cpuset.cpus.partition" 2>/dev/null), slices $(slices_now): $(journalctl -u cpusetd.service --no-pager -o cat | grep -iE 'systemd|confin|load balancing' | tail -n 3 | tr '\n' ' ')"
    fi
    if [ "$sd_ok" = yes ]; then
        systemctl daemon-reload
        held_after held-daemon-reload "systemctl daemon-reload"
        systemctl restart containerd.service
        wait_until 30 ctr version >/dev/null 2>&1 || log "containerd did not come back"
        held_after held-containerd-restart "systemctl restart containerd"
        systemctl restart e2e-ordinary.service
        held_after held-service-restart "systemctl restart e2e-ordinary"
        # systemd itself rewriting a slice's cpuset (here: asked to, as an admin or another
        # tool would): the agent notices at its next reconcile tick (a quiet one reads the
        # units it confined) and confines it again through systemd.
        confined_logs=$(journalctl -u cpusetd.service --no-pager -o cat | grep -c 'user.slice confined' || true)
        systemctl set-property --runtime user.slice AllowedCPUs="$all_cpus"
        log "user.slice rewritten by systemd: $(slices_now)"
        if ! slices_confined && wait_until "$CONVERGE" slices_confined &&
            [ "$(journalctl -u cpusetd.service --no-pager -o cat | grep -c 'user.slice confined')" -gt "$confined_logs" ]; then
            log "repaired: $(slices_now)"
            held_after slice-drift-repaired "systemd rewrote user.slice's cpuset"
        else
            fail slice-drift-repaired "not confined again within ${CONVERGE}s after set-property user.slice AllowedCPUs=$all_cpus: slices $(slices_now); $(journalctl -u cpusetd.service --no-pager -o cat | grep -E 'user.slice' | tail -n 2 | tr '\n' ' ')"
        fi
        # kill -9 of the agent: systemd restarts it (Restart=on-failure); nothing moves.
        systemctl kill -s KILL cpusetd.service
        sleep 4
        wait_until "$CONVERGE" status_has || log "no status after the kill"
        all_held || log "after kill -9: slices $(slices_now)"
        "${crikubelet[@]}" delete-pod /root/pods/lb.state.json >/dev/null || log "delete-pod lb failed"
        if wait_until "$CONVERGE" slices_original; then
            pass host-restored-systemd
        else
            fail host-restored-systemd "after kill -9 and the pod going: slices $(slices_now), want $slices_before"
        fi
        # `cpusetd reset` (the agent stopped while the host is confined) gives them back too.
        "${crikubelet[@]}" run-pod /root/pods/lb.json >/root/pods/lb.state.json || log "run-pod lb failed"
        if wait_until "$CONVERGE" slices_confined; then
            systemctl stop cpusetd.service
            # shellcheck disable=SC1091
            . /etc/default/cpusetd
            # shellcheck disable=SC2086
            cpusetd reset $CPUSETD_ARGS || log "cpusetd reset failed"
            if slices_original; then
                pass host-reset-systemd
            else
                fail host-reset-systemd "after cpusetd reset: slices $(slices_now), want $slices_before"
            fi
        else
            fail host-reset-systemd "the slices were not confined again: $(slices_now)"
        fi
        "${crikubelet[@]}" delete-pod /root/pods/lb.state.json >/dev/null || log "delete-pod lb failed"
    else
        for check in held-daemon-reload held-containerd-restart held-service-restart \
            slice-drift-repaired host-restored-systemd host-reset-systemd; do
            skip "$check" "the host was not confined"
        done
        "${crikubelet[@]}" delete-pod /root/pods/lb.state.json >/dev/null || log "delete-pod lb failed"
    fi
    systemctl stop e2e-ordinary.service || true
    cp /root/cpusetd.default /etc/default/cpusetd
    rm -f /etc/systemd/system/cpusetd.service.d/partitions.conf
    systemctl daemon-reload
    systemctl restart cpusetd.service
    wait_until "$CONVERGE" pinned_as_expected "$exclusive" || log "the pins did not come back after the systemd checks"
elif [ "$mode" = v2 ]; then
    for check in $SYSTEMD_CHECKS; do skip "$check" "no pinned pod"; done
fi

# --- a configuration error: exit 78, no restart --------------------------------------------------
phase "config error"
sed -i 's|^CPUSETD_ARGS="|CPUSETD_ARGS="--no-such-flag |' /etc/default/cpusetd
if systemctl restart cpusetd.service; then
    fail config-error-78 "the agent started with --no-such-flag"
else
    restarts_after=$(unit_prop NRestarts)
    sleep 6 # RestartSec=2s: a restart would have happened by now
    got="$(unit_prop ExecMainStatus) $(unit_prop ActiveState) $(unit_prop NRestarts)"
    if [ "$got" = "78 failed $restarts_after" ]; then
        pass config-error-78
    else
        fail config-error-78 "ExecMainStatus ActiveState NRestarts = $got, want 78 failed $restarts_after"
    fi
fi
cp /root/cpusetd.default /etc/default/cpusetd
systemctl reset-failed cpusetd.service
systemctl start cpusetd.service || failed_setup config-restored "cpusetd does not start with the restored config"

# --- a clean stop ------------------------------------------------------------------------------
phase "stop"
systemctl stop cpusetd.service
got="$(unit_prop ExecMainCode) $(unit_prop ExecMainStatus) $(unit_prop Result) $(unit_prop ActiveState)"
# ExecMainCode 1 = CLD_EXITED (a process killed by SIGTERM would be 2, status 15).
if [ "$got" = "1 0 success inactive" ]; then
    pass stop-clean
else
    fail stop-clean "ExecMainCode ExecMainStatus Result ActiveState = $got, want 1 0 success inactive"
fi
systemctl start cpusetd.service

# --- nothing the hardening refused -------------------------------------------------------------
denied=$(journalctl -u cpusetd.service --no-pager -o cat |
    grep -E 'EPERM|EACCES|EROFS|Operation not permitted|Permission denied|Read-only file system' || true)
if [ -z "$denied" ]; then
    pass journal-clean
else
    fail journal-clean "$(wc -l <<<"$denied") lines, first: $(head -n 1 <<<"$denied")"
fi

exposure=$(systemd-analyze security cpusetd.service --no-pager 2>&1 |
    sed -n 's/.*Overall exposure level for cpusetd.service: *\([0-9.]*\).*/\1/p')
if [ -n "$exposure" ] && awk -v e="$exposure" 'BEGIN { exit !(e <= 2.0) }'; then
    pass security
else
    fail security "overall exposure '${exposure:-unreadable}', want ≤ 2.0"
fi
log "exposure $exposure"

# --- uninstall: the unit is gone, reset restored the tree ----------------------------------------
phase "uninstall"
if [ "$pods_ok" = yes ]; then
    gu_config=/run/containerd/io.containerd.runtime.v2.task/k8s.io/$(jq -r '.containers[0].id' /root/pods/gu.state.json)/config.json
    want_quota=$(jq -r '.linux.resources.cpu.quota // "max"' "$gu_config" || echo "unreadable $gu_config")
fi
if "$REPO/scripts/uninstall.sh" && [ "$(unit_prop LoadState)" = not-found ] &&
    ! [ -e /usr/local/bin/cpusetd ] && ! [ -e /etc/systemd/system/cpusetd.service ]; then
    pass uninstall
else
    fail uninstall "LoadState $(unit_prop LoadState), $(find /usr/local/bin/cpusetd /etc/systemd/system/cpusetd.service 2>/dev/null | tr '\n' ' ')"
fi
if [ "$pods_ok" = yes ]; then
    all_back() {
        same_cpus "$(cpus_of_pid "$gu_pid")" "$all_cpus" &&
            same_cpus "$(cpus_of_pid "$bu_pid")" "$all_cpus" &&
            same_cpus "$(cpus_of_pid "$be_pid")" "$all_cpus"
    }
    if all_back && [ "$(quota_of "$gu_pid")" = "$want_quota" ]; then
        pass reset-restored
    else
        fail reset-restored "Guaranteed $(cpus_of_pid "$gu_pid") quota $(quota_of "$gu_pid") (want $all_cpus, $want_quota), Burstable $(cpus_of_pid "$bu_pid"), BestEffort $(cpus_of_pid "$be_pid")"
    fi
    for pod in gu bu be; do
        "${crikubelet[@]}" delete-pod "/root/pods/$pod.state.json" >/dev/null || log "delete-pod $pod failed"
    done
else
    skip reset-restored "no pods"
fi

phase "done"
journalctl -u cpusetd.service --no-pager -o short-monotonic | tail -n 40
emit "@@DONE"
