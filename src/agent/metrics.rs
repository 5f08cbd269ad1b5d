//! The agent's metrics, in Prometheus text format, written atomically to `--metrics-file` after
//! each pass for node_exporter's textfile collector, and served by `--metrics-bind-address`.
//! Names follow kubelet's CPU manager metrics where they mean the same (`pinning_requests_total`,
//! `pinning_errors_total`, `shared_pool_size_millicores`, `exclusive_cpu_allocation_count`,
//! `allocation_per_numa`, `container_aligned_compute_resources_count` and `_failure_count`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod assign_events;

use crate::cgroupfs::{CgroupPath, InterfaceFile};
use crate::classify::Classification;
use crate::planner::Plan;
use crate::state::{AdmissionReason, AssignmentKey};
use crate::topology::Topology;
use crate::writer::Tally;

/// How many recent samples the latency summary keeps for its quantiles.
const SUMMARY_WINDOW: usize = 1024;

/// A Prometheus summary over the most recent samples.
#[derive(Debug, Default, Clone)]
pub struct LatencySummary {
    recent: VecDeque<Duration>,
    sum: Duration,
    count: u64,
}

impl LatencySummary {
    pub fn record(&mut self, sample: Duration) {
        if self.recent.len() == SUMMARY_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(sample);
        self.sum += sample;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `q` quantile of the recent samples (nearest rank).
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        self.quantiles(&[q]).pop().flatten()
    }

    /// Several quantiles from one sort of the recent samples (`render` runs after every pass).
    pub fn quantiles(&self, qs: &[f64]) -> Vec<Option<Duration>> {
        if self.recent.is_empty() {
            return vec![None; qs.len()];
        }
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        qs.iter()
            .map(|q| {
                let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
                sorted.get(rank - 1).copied()
            })
            .collect()
    }
}

/// Counters and gauges of the running agent.
#[derive(Debug, Default)]
pub struct Metrics {
    pub pinning_requests: u64,
    pub pinning_errors: u64,
    pub drift_repairs: u64,
    /// Narrowings left undone because a child's write failed under them, and empty children
    /// whose write failed (their parents narrowed past them).
    pub narrowings_blocked: u64,
    /// Cgroups found fought over by another writer (each fight once).
    pub drift_fights: u64,
    /// CPUs device interrupts are kept off now (`irq-load-balancing.crio.io`).
    pub irq_isolated_cpus: u64,
    /// IRQ affinity files written (`/proc/irq`).
    pub irq_affinity_writes: u64,
    /// IRQs the kernel would not move, at the last change.
    pub irq_unchangeable: u64,
    /// CPUs irqbalance was told to keep interrupts off (its own banned CPUs included), 0 when
    /// it was told nothing.
    pub irqbalance_banned_cpus: u64,
    /// CPUs out of scheduler load balancing now (`cpu-load-balancing.crio.io`).
    pub sched_isolated_cpus: u64,
    /// CPUs whose `pm_qos_resume_latency_us` reads back as a pod's `cpu-c-states.crio.io`.
    pub cstates_cpus: u64,
    /// CPUs whose `scaling_governor` reads back as a pod's `cpu-freq-governor.crio.io`.
    pub governor_cpus: u64,
    /// CPUs whose asked-for governor was refused (not in `scaling_available_governors`).
    pub governor_refused_cpus: u64,
    /// Containers on their exclusive CPUs plus the shared pool (`cpu-shared.crio.io`).
    pub cpu_shared_containers: u64,
    /// Per-cpu power files written (settings and restores).
    pub cpu_power_writes: u64,
    /// `cpuset.sched_load_balance` and host `cpuset.cpus` files written for it.
    pub sched_balance_writes: u64,
    /// Projection files replaced, and projection failures (see `crate::projection`).
    pub projection_writes: u64,
    pub projection_failures: u64,
    pub rescans: u64,
    pub passes: u64,
    /// Reconciles that found nothing to do and ran no pass.
    pub skipped_passes: u64,
    /// Passes that planned only new pods' chains (see `controller::incremental`).
    pub incremental_passes: u64,
    /// Planned writes a pass held back while new cgroups arrived (made by a later pass).
    pub writes_held_back: u64,
    /// Reconcile ticks that only compared each cgroup's `cpuset.cpus` (a quiet node).
    pub quiet_reconciles: u64,
    /// Cgroup writes issued (accepted or failed), for the burst figure's writes issued ÷
    /// writes necessary.
    pub writes_issued: u64,
    /// Failed cgroup writes by errno.
    pub write_errors: BTreeMap<i32, u64>,
    /// Cgroup writes the kernel refused in a race and the agent re-planned at once, by errno.
    pub write_retries: BTreeMap<i32, u64>,
    pub event_to_pin: LatencySummary,
    pub reconcile_duration: Option<Duration>,
    pub last_reconcile: Option<SystemTime>,
    pub shared_pool_millicores: u64,
    pub exclusive_cpus: u64,
    pub containers: u64,
    /// Cpus seen going offline, and coming online, while the agent ran (hotplug).
    pub cpus_offlined: u64,
    pub cpus_onlined: u64,
    /// Cpus online as the topology the agent plans on says.
    pub online_cpus: u64,
    /// Exclusive cpus containers are short of: theirs went offline and no replacement was free.
    pub exclusive_cpus_missing: u64,
    /// The agent could not set up inotify (a per-user limit) and scans every period instead.
    pub without_inotify: bool,
    /// The last full scan stopped at its limit: no new exclusive CPUs are given.
    pub scan_incomplete: bool,
    /// Pods kubelet would reject at admission now, by kubelet's reason.
    pub pods_rejected: BTreeMap<AdmissionReason, u64>,
    /// kubelet's `container_aligned_compute_resources_count{scope="container"}`: allocations
    /// met with whole cores (`full-pcpus-only`), and allocations within one uncore (L3) cache.
    pub aligned_physical_cpu: u64,
    pub aligned_uncore_cache: u64,
    /// kubelet's `container_aligned_compute_resources_failure_count{scope="container",
    /// boundary="physical_cpu"}`: allocations refused under `full-pcpus-only`.
    pub aligned_physical_cpu_failures: u64,
    /// Exclusive CPUs held, by NUMA node (every node of the topology, 0 included).
    pub allocation_per_numa: BTreeMap<u32, u64>,
    /// Each container's exclusive CPUs, by name (`cpusetd_container_exclusive_cpus`).
    pub container_cpus: Vec<(PodName, String, u64)>,
    /// Each pod kubelet would reject: its name, the container whose request failed, the reason.
    pub pod_rejections: Vec<(PodName, String, AdmissionReason)>,
    /// Pods' names as their runtimes gave them, by UID (kept while they hold or are refused
    /// CPUs: an incremental pass classifies only new pods).
    pod_names: HashMap<String, PodName>,
    // Log-once bookkeeping: failures already reported.
    reported_writes: HashSet<(CgroupPath, InterfaceFile, i32)>,
    reported_pins: HashSet<AssignmentKey>,
    reported_rejections: HashSet<String>,
}

/// A pod's namespace and name; while its runtime has not named it, no namespace and its UID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodName {
    pub namespace: String,
    pub pod: String,
}

impl Metrics {
    /// Updates the gauges from a pass over `classes` (all the tree's, or an incremental pass's).
    pub fn record_pass(
        &mut self,
        plan: &Plan,
        report: &Tally,
        topology: &Topology,
        reserved: Option<&crate::cpuset::CpuSet>,
        classes: &[std::sync::Arc<Classification>],
    ) {
        self.record_pass_counts(plan, report);
        if let (Some(pools), Some(reserved)) = (&plan.pools, reserved) {
            // kubelet's meaning: the shared pool less the reserved CPUs (what a new exclusive
            // allocation could take), not the cpuset shared containers run on.
            self.shared_pool_millicores = pools.shared.difference(reserved).len() as u64 * 1000;
        }
        self.record_numa(plan, topology);
        self.record_names(plan, classes);
    }

    fn record_pass_counts(&mut self, plan: &Plan, report: &Tally) {
        self.passes += 1;
        self.writes_issued += (report.written + report.failed) as u64;
        self.exclusive_cpus = plan.assignments.exclusive_cpus().len() as u64;
        self.exclusive_cpus_missing = plan
            .assignments
            .iter()
            .map(|(_, a)| a.entitled().saturating_sub(a.cpus.len()) as u64)
            .sum();
        self.pods_rejected.clear();
        for (_, rejection) in plan.assignments.rejected() {
            *self.pods_rejected.entry(rejection.reason).or_default() += 1;
        }
        if report.is_clean() {
            // A write that succeeds again may fail again later and deserves a new report.
            self.reported_writes.clear();
        }
    }

    /// Exclusive CPUs by NUMA node, kubelet's `cpu_manager_allocation_per_numa`.
    fn record_numa(&mut self, plan: &Plan, topology: &Topology) {
        self.allocation_per_numa = topology.cpus().iter().map(|c| (c.numa, 0)).collect();
        for cpu in &plan.assignments.exclusive_cpus() {
            if let Some(info) = topology.cpu(cpu) {
                *self.allocation_per_numa.entry(info.numa).or_default() += 1;
            }
        }
    }

    /// The per-container and per-pod series, named as the runtime names them. Runs after every
    /// pass: a name is copied once per pod, not once per pass.
    fn record_names(&mut self, plan: &Plan, classes: &[std::sync::Arc<Classification>]) {
        // Containers held by id alone (no name in their config when they got their CPUs).
        let by_id: HashSet<&str> = plan
            .assignments
            .iter()
            .filter_map(|(key, _)| match key {
                AssignmentKey::Id { container_id, .. } => Some(container_id.as_str()),
                AssignmentKey::Named { .. } => None,
            })
            .collect();
        let mut container_names: HashMap<&str, &str> = HashMap::new();
        for class in classes {
            if let (Some(uid), Some(pod)) = (&class.pod_uid, &class.pod_name) {
                if !self.pod_names.contains_key(uid) {
                    let namespace = class.pod_namespace.clone().unwrap_or_default();
                    let pod = pod.clone();
                    self.pod_names
                        .insert(uid.clone(), PodName { namespace, pod });
                }
            }
            if let (Some(id), Some(name)) = (&class.container_id, &class.container_name) {
                if by_id.contains(id.as_str()) {
                    container_names.insert(id, name);
                }
            }
        }
        let keep: HashSet<&str> = plan
            .assignments
            .iter()
            .map(|(k, _)| k.pod_uid())
            .chain(plan.assignments.rejected().map(|(uid, _)| uid.as_str()))
            .collect();
        self.pod_names.retain(|uid, _| keep.contains(uid.as_str()));
        let name_of = |uid: &str| {
            self.pod_names.get(uid).cloned().unwrap_or_else(|| PodName {
                namespace: String::new(),
                pod: uid.to_string(),
            })
        };
        self.container_cpus = plan
            .assignments
            .iter()
            .map(|(key, a)| {
                let container = match key {
                    AssignmentKey::Named { container, .. } => container.clone(),
                    AssignmentKey::Id { container_id, .. } => container_names
                        .get(container_id.as_str())
                        .map_or_else(|| container_id.clone(), |n| n.to_string()),
                };
                (name_of(key.pod_uid()), container, a.cpus.len() as u64)
            })
            .collect();
        self.container_cpus.sort();
        self.pod_rejections = plan
            .assignments
            .rejected()
            .map(|(uid, r)| (name_of(uid), r.container.clone(), r.reason))
            .collect();
        self.pod_rejections.sort();
    }

    /// Whether this write failure is new (to be logged) rather than a retry of a known one.
    pub fn first_failure(&mut self, path: &CgroupPath, file: InterfaceFile, errno: i32) -> bool {
        self.reported_writes.insert((path.clone(), file, errno))
    }

    /// Whether this container's allocation failure is new.
    pub fn first_pin_failure(&mut self, key: &AssignmentKey) -> bool {
        self.reported_pins.insert(key.clone())
    }

    /// The container is pinned (or its pin released): a later failure is new again.
    pub fn pin_succeeded(&mut self, key: &AssignmentKey) {
        self.reported_pins.remove(key);
    }

    /// Whether this pod's rejection is new (to be logged).
    pub fn first_pod_rejection(&mut self, pod_uid: &str) -> bool {
        self.reported_rejections.insert(pod_uid.to_string())
    }

    /// Forgets the rejections of pods kubelet would no longer reject (gone, or admitted now).
    pub fn retain_pod_rejections(&mut self, rejected: impl Fn(&str) -> bool) {
        self.reported_rejections.retain(|uid| rejected(uid));
    }

    /// Forgets failures of containers that are no longer asking (gone, or now shared).
    pub fn retain_pin_failures(&mut self, asking: impl Fn(&AssignmentKey) -> bool) {
        self.reported_pins.retain(|k| asking(k));
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_series(&mut |name: &str,
                                 kind: &str,
                                 help: &str,
                                 lines: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        });
        self.render_event_to_pin(&mut out);
        out
    }

    /// Every series but the event-to-pin summary, in their order of the exposition.
    fn render_series(&self, metric: &mut impl FnMut(&str, &str, &str, &[(String, String)])) {
        metric(
            "cpusetd_pinning_requests_total",
            "counter",
            "Exclusive CPU allocations attempted.",
            &plain(self.pinning_requests),
        );
        metric(
            "cpusetd_pinning_errors_total",
            "counter",
            "Exclusive CPU allocations that could not be met (the container stays shared).",
            &plain(self.pinning_errors),
        );
        metric(
            "cpusetd_pods_rejected",
            "gauge",
            "Pods kubelet would reject at admission (by kubelet's reason): no container of them holds exclusive CPUs.",
            &AdmissionReason::ALL
                .iter()
                .map(|reason| {
                    let n = self.pods_rejected.get(reason).copied().unwrap_or(0);
                    (format!("{{reason=\"{reason}\"}}"), n.to_string())
                })
                .collect::<Vec<_>>(),
        );
        self.render_operator_series(metric);
        self.render_pool_series(metric);
        self.render_health_series(metric);
        self.render_effect_series(metric);
        self.render_side_file_series(metric);
        self.render_pass_series(metric);
        self.render_write_error_series(metric);
    }

    /// The shared pool, the exclusive CPUs, the online CPUs and hotplug, the containers.
    fn render_pool_series(&self, metric: &mut impl FnMut(&str, &str, &str, &[(String, String)])) {
        metric(
            "cpusetd_shared_pool_size_millicores",
            "gauge",
            "Size of the shared CPU pool in millicores, the reserved CPUs left out (kubelet's meaning: what exclusive allocations may still take).",
            &plain(self.shared_pool_millicores),
        );
        metric(
            "cpusetd_exclusive_cpu_allocation_count",
            "gauge",
            "CPUs held exclusively by containers.",
            &plain(self.exclusive_cpus),
        );
        metric(
            "cpusetd_exclusive_cpus_missing",
            "gauge",
            "Exclusive CPUs containers are short of: theirs went offline and no replacement was free.",
            &plain(self.exclusive_cpus_missing),
        );
        metric(
            "cpusetd_online_cpus",
            "gauge",
            "CPUs online in the topology the agent plans on (read again on CPU hotplug).",
            &plain(self.online_cpus),
        );
        metric(
            "cpusetd_cpu_hotplug_events_total",
            "counter",
            "CPUs seen going offline or coming online while the agent ran.",
            &[
                (
                    "{direction=\"offline\"}".to_string(),
                    self.cpus_offlined.to_string(),
                ),
                (
                    "{direction=\"online\"}".to_string(),
                    self.cpus_onlined.to_string(),
                ),
            ],
        );
        metric(
            "cpusetd_containers",
            "gauge",
            "Containers under the kubepods cgroup.",
            &plain(self.containers),
        );
    }

    /// What limits the agent's view (no inotify, an incomplete scan) and its repairs.
    fn render_health_series(&self, metric: &mut impl FnMut(&str, &str, &str, &[(String, String)])) {
        metric(
            "cpusetd_watching_without_inotify",
            "gauge",
            "1 when inotify could not be set up (fs.inotify limits): changes are seen by the periodic full scan only.",
            &plain(u64::from(self.without_inotify)),
        );
        metric(
            "cpusetd_scan_incomplete",
            "gauge",
            "1 when the last full scan stopped at its limit (65,536 cgroups): no new exclusive cpus are given and the shared pool does not grow until a scan sees the whole tree.",
            &plain(u64::from(self.scan_incomplete)),
        );
        metric(
            "cpusetd_drift_repairs_total",
            "counter",
            "Cgroups whose cpuset was changed by someone else and written back.",
            &plain(self.drift_repairs),
        );
        metric(
            "cpusetd_narrowings_blocked_total",
            "counter",
            "Narrowings of a cgroup left for the next reconcile because the write of a child below it failed, and empty children the agent cannot write (their parent is narrowed past them).",
            &plain(self.narrowings_blocked),
        );
    }

    /// The per-pod CPU effects: interrupts kept off, C-states, governors, load balancing.
    fn render_effect_series(&self, metric: &mut impl FnMut(&str, &str, &str, &[(String, String)])) {
        metric(
            "cpusetd_irq_isolated_cpus",
            "gauge",
            "CPUs device interrupts are kept off (pods with irq-load-balancing.crio.io: disable).",
            &plain(self.irq_isolated_cpus),
        );
        metric(
            "cpusetd_cstates_cpus",
            "gauge",
            "CPUs whose power/pm_qos_resume_latency_us reads back as their pod's cpu-c-states.crio.io asks.",
            &plain(self.cstates_cpus),
        );
        metric(
            "cpusetd_governor_cpus",
            "gauge",
            "CPUs whose cpufreq/scaling_governor reads back as their pod's cpu-freq-governor.crio.io asks.",
            &plain(self.governor_cpus),
        );
        metric(
            "cpusetd_governor_refused_cpus",
            "gauge",
            "CPUs whose pod asks for a cpufreq governor the CPU does not offer (left as they are).",
            &plain(self.governor_refused_cpus),
        );
        metric(
            "cpusetd_cpu_shared_containers",
            "gauge",
            "Containers running on their exclusive CPUs plus the shared pool (cpu-shared.crio.io/<container>: enable), as their cpuset was last written or read back.",
            &plain(self.cpu_shared_containers),
        );
        metric(
            "cpusetd_cpu_power_writes_total",
            "counter",
            "Per-cpu power files (pm_qos_resume_latency_us, scaling_governor) written, settings and restores.",
            &plain(self.cpu_power_writes),
        );
        metric(
            "cpusetd_sched_isolated_cpus",
            "gauge",
            "CPUs in no scheduler domain (pods with cpu-load-balancing.crio.io: disable), as the cpuset tree read back says.",
            &plain(self.sched_isolated_cpus),
        );
        metric(
            "cpusetd_sched_balance_writes_total",
            "counter",
            "Writes of cpuset.sched_load_balance, and of host cpusets confined by --isolate-host.",
            &plain(self.sched_balance_writes),
        );
    }

    /// Writes outside the cgroup tree: projection files, /proc/irq, irqbalance.
    fn render_side_file_series(
        &self,
        metric: &mut impl FnMut(&str, &str, &str, &[(String, String)]),
    ) {
        metric(
            "cpusetd_projection_writes_total",
            "counter",
            "Projection files replaced (a container's CPUs changed, or it is new).",
            &plain(self.projection_writes),
        );
        metric(
            "cpusetd_projection_failures_total",
            "counter",
            "Projection files that could not be written or removed (the first of each kind is logged).",
            &plain(self.projection_failures),
        );
        metric(
            "cpusetd_irq_affinity_writes_total",
            "counter",
            "Writes to /proc/irq affinity files (default_smp_affinity, smp_affinity_list).",
            &plain(self.irq_affinity_writes),
        );
        metric(
            "cpusetd_irq_unchangeable",
            "gauge",
            "IRQs the kernel refused to move at the last change (per-CPU or managed interrupts).",
            &plain(self.irq_unchangeable),
        );
        metric(
            "cpusetd_irqbalance_banned_cpus",
            "gauge",
            "CPUs irqbalance was told to keep interrupts off (its own banned CPUs included); 0 when it was told nothing.",
            &plain(self.irqbalance_banned_cpus),
        );
    }

    /// The controller's passes and cgroup writes.
    fn render_pass_series(&self, metric: &mut impl FnMut(&str, &str, &str, &[(String, String)])) {
        metric(
            "cpusetd_drift_fights_total",
            "counter",
            "Times a cgroup's cpuset was found rewritten by someone else again and again (repairs then back off).",
            &plain(self.drift_fights),
        );
        metric(
            "cpusetd_passes_total",
            "counter",
            "Passes (classify, plan, write) run by the controller.",
            &plain(self.passes),
        );
        metric(
            "cpusetd_incremental_passes_total",
            "counter",
            "Passes that planned only the cgroups of new pods and their ancestors (included in cpusetd_passes_total).",
            &plain(self.incremental_passes),
        );
        metric(
            "cpusetd_reconciles_without_pass_total",
            "counter",
            "Reconciles whose scan showed no change, so no pass ran.",
            &plain(self.skipped_passes),
        );
        metric(
            "cpusetd_cgroup_writes_held_back_total",
            "counter",
            "Planned writes held back while new cgroups arrived (the shared pool's rewrites, made by a later pass).",
            &plain(self.writes_held_back),
        );
        metric(
            "cpusetd_quiet_reconciles_total",
            "counter",
            "Reconcile ticks that only re-read each cgroup's cpuset.cpus (nothing had changed).",
            &plain(self.quiet_reconciles),
        );
        metric(
            "cpusetd_cgroup_writes_total",
            "counter",
            "Cgroup interface file writes issued (accepted or not).",
            &plain(self.writes_issued),
        );
    }

    /// Failed and retried cgroup writes by errno, and when the last reconcile ran and how long.
    fn render_write_error_series(
        &self,
        metric: &mut impl FnMut(&str, &str, &str, &[(String, String)]),
    ) {
        metric(
            "cpusetd_rescans_total",
            "counter",
            "Full rescans forced by the watcher losing track (queue overflow, watch limit).",
            &plain(self.rescans),
        );
        let errors = by_errno(&self.write_errors);
        metric(
            "cpusetd_cgroup_write_errors_total",
            "counter",
            "Failed cgroup writes, by errno.",
            &errors,
        );
        let retries = by_errno(&self.write_retries);
        metric(
            "cpusetd_cgroup_write_retries_total",
            "counter",
            "Cgroup writes refused in a race with a runtime (a child set up meanwhile) and re-planned at once, by errno.",
            &retries,
        );
        if let Some(d) = self.reconcile_duration {
            metric(
                "cpusetd_reconcile_duration_seconds",
                "gauge",
                "Duration of the last full reconcile pass.",
                &[(String::new(), format!("{:.6}", d.as_secs_f64()))],
            );
        }
        if let Some(t) = self.last_reconcile {
            let secs = t
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            metric(
                "cpusetd_last_reconcile_timestamp_seconds",
                "gauge",
                "When the last full reconcile pass finished.",
                &[(String::new(), format!("{secs:.3}"))],
            );
        }
    }

    /// The event-to-pin summary (quantiles over the recent window, sum and count).
    fn render_event_to_pin(&self, out: &mut String) {
        let mut lines = Vec::new();
        let qs = [0.5, 0.9, 0.99];
        for (q, v) in qs.iter().zip(self.event_to_pin.quantiles(&qs)) {
            if let Some(v) = v {
                lines.push((
                    format!("{{quantile=\"{q}\"}}"),
                    format!("{:.6}", v.as_secs_f64()),
                ));
            }
        }
        let summary = &self.event_to_pin;
        let name = "cpusetd_event_to_pin_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} From a container cgroup appearing to its cpuset being final (recent {SUMMARY_WINDOW})."
        );
        let _ = writeln!(out, "# TYPE {name} summary");
        for (labels, value) in lines {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
        let _ = writeln!(out, "{name}_sum {:.6}", summary.sum.as_secs_f64());
        let _ = writeln!(out, "{name}_count {}", summary.count);
    }

    fn render_operator_series(
        &self,
        metric: &mut impl FnMut(&str, &str, &str, &[(String, String)]),
    ) {
        metric(
            "cpusetd_pod_rejected",
            "gauge",
            "1 for each pod kubelet would reject at admission, with the container whose request failed and kubelet's reason; no container of it holds exclusive CPUs.",
            &self
                .pod_rejections
                .iter()
                .map(|(pod, container, reason)| {
                    let labels = pod_labels(pod, container);
                    (format!("{{{labels},reason=\"{reason}\"}}"), "1".into())
                })
                .collect::<Vec<_>>(),
        );
        metric(
            "cpusetd_container_exclusive_cpus",
            "gauge",
            "Exclusive CPUs each container holds (also while it is not running: a restart, the pod's next container).",
            &self
                .container_cpus
                .iter()
                .map(|(pod, container, n)| {
                    (format!("{{{}}}", pod_labels(pod, container)), n.to_string())
                })
                .collect::<Vec<_>>(),
        );
        metric(
            "cpusetd_allocation_per_numa",
            "gauge",
            "Exclusive CPUs held, by NUMA node (kubelet's cpu_manager_allocation_per_numa).",
            &self
                .allocation_per_numa
                .iter()
                .map(|(node, n)| (format!("{{numa_node=\"{node}\"}}"), n.to_string()))
                .collect::<Vec<_>>(),
        );
        let aligned = |boundary: &str, n: u64| {
            (
                format!("{{boundary=\"{boundary}\",scope=\"container\"}}"),
                n.to_string(),
            )
        };
        metric(
            "cpusetd_container_aligned_compute_resources_count",
            "counter",
            "Exclusive CPU allocations aligned to a boundary (kubelet's meaning): physical_cpu, whole cores under full-pcpus-only; uncore_cache, all within one uncore (L3) cache.",
            &[
                aligned("physical_cpu", self.aligned_physical_cpu),
                aligned("uncore_cache", self.aligned_uncore_cache),
            ],
        );
        metric(
            "cpusetd_container_aligned_compute_resources_failure_count",
            "counter",
            "Exclusive CPU allocations refused that had to be aligned (kubelet's meaning): physical_cpu, under full-pcpus-only.",
            &[aligned("physical_cpu", self.aligned_physical_cpu_failures)],
        );
    }

    /// Writes the exposition to `path` atomically (temporary file, then rename).
    pub fn write_file(&self, path: &Path) -> io::Result<()> {
        write_text(path, &self.render())
    }
}

/// `namespace="…",pod="…",container="…"`, escaped.
fn pod_labels(pod: &PodName, container: &str) -> String {
    format!(
        "namespace=\"{}\",pod=\"{}\",container=\"{}\"",
        escape_label(&pod.namespace),
        escape_label(&pod.pod),
        escape_label(container)
    )
}

/// A label value as the exposition format writes it: backslash, double quote and line feed
/// escaped (names come from runtime configs, whatever they hold).
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The errnos a cgroup write meets (busy, a list the kernel will not take, an empty cpuset
/// with tasks, no permission): their series exist from the start, at 0, so a rate or an alert
/// on them works before the first failure.
const WRITE_ERRNOS: [nix::errno::Errno; 5] = [
    nix::errno::Errno::EBUSY,
    nix::errno::Errno::EINVAL,
    nix::errno::Errno::ENOSPC,
    nix::errno::Errno::EACCES,
    nix::errno::Errno::EPERM,
];

/// `{errno="EBUSY"}`-labelled lines of a per-errno counter, [`WRITE_ERRNOS`] always.
fn by_errno(counts: &BTreeMap<i32, u64>) -> Vec<(String, String)> {
    let mut counts = counts.clone();
    for errno in WRITE_ERRNOS {
        counts.entry(errno as i32).or_default();
    }
    counts
        .iter()
        .map(|(errno, n)| {
            let name = format!("{:?}", nix::errno::Errno::from_raw(*errno));
            (format!("{{errno=\"{name}\"}}"), n.to_string())
        })
        .collect()
}

/// Writes a rendered exposition to `path` atomically: a fresh temporary file beside it (an
/// unpredictable name, `O_EXCL | O_NOFOLLOW`, so nothing planted there is written through),
/// then a rename over `path` (which replaces a symlink there rather than following it).
pub fn write_text(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ (COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u32).rotate_left(16);
    let tmp = path.with_file_name(format!(
        ".{}.{}.{nonce:08x}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&tmp)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Why `--metrics-file` cannot be used, if it cannot: a directory, a parent that is not a
/// directory, or a file in the agent's state directory (the checkpoint and lock live there,
/// and the metrics file is replaced after every pass).
pub fn metrics_file_problem(path: &Path, state_dir: &Path) -> Option<String> {
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        return Some("it names no file".into());
    }
    if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Some("it is a directory; name a file in it, such as cpusetd.prom".into());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // A directory that does not exist yet may be made later (node_exporter's set-up): the
    // writes fail, said once, until it does.
    let Ok(parent) = fs::canonicalize(parent) else {
        return None;
    };
    if !parent.is_dir() {
        return Some(format!("{} is not a directory", parent.display()));
    }
    // The state directory is where the hardened unit may write; the checkpoint, its
    // quarantined copies and the lock live there too: only a `*.prom` name is allowed there.
    let is_prom = path.extension().is_some_and(|e| e == "prom");
    if !is_prom && fs::canonicalize(state_dir).is_ok_and(|state| parent.starts_with(&state)) {
        return Some(format!(
            "it is in the state directory {} where the checkpoint and lock live; name it \
             <something>.prom",
            state_dir.display()
        ));
    }
    None
}

/// One series without labels.
fn plain(v: u64) -> Vec<(String, String)> {
    vec![(String::new(), v.to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 17, item 14: nothing planted beside the metrics file is written through.
    #[test]
    fn the_metrics_file_is_written_through_a_fresh_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let path = dir.path().join("cpusetd.prom");
        // The old fixed temporary name, planted as a symlink.
        std::os::unix::fs::symlink(&victim, dir.path().join("cpusetd.prom.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("cpusetd.prom")).unwrap();
        write_text(&path, "x 1\n").unwrap();
        write_text(&path, "x 2\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(fs::read_to_string(&path).unwrap(), "x 2\n");
        assert!(!fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp") && n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_metrics_file_in_the_state_dir_or_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::create_dir(&state).unwrap();
        let ok = dir.path().join("m.prom");
        assert_eq!(metrics_file_problem(&ok, &state), None);
        assert_eq!(
            metrics_file_problem(&state.join("cpusetd.prom"), &state),
            None
        );
        for bad in [
            state.join("state.json"),
            state.join("lock"),
            dir.path().to_path_buf(),
        ] {
            assert!(
                metrics_file_problem(&bad, &state).is_some(),
                "{}",
                bad.display()
            );
        }
    }

    #[test]
    fn summary_quantiles_use_recent_samples() {
        let mut s = LatencySummary::default();
        for ms in 1..=100 {
            s.record(Duration::from_millis(ms));
        }
        assert_eq!(s.quantile(0.5), Some(Duration::from_millis(50)));
        assert_eq!(s.quantile(0.99), Some(Duration::from_millis(99)));
        assert_eq!(s.count(), 100);
    }

    /// Issue 26: every series that counts errors or refusals is there before the first one.
    #[test]
    fn error_series_exist_from_the_start_at_zero() {
        let text = Metrics::default().render();
        for line in [
            "cpusetd_pinning_errors_total 0",
            "cpusetd_pinning_requests_total 0",
            "cpusetd_container_aligned_compute_resources_failure_count{boundary=\"physical_cpu\",scope=\"container\"} 0",
            "cpusetd_container_aligned_compute_resources_count{boundary=\"physical_cpu\",scope=\"container\"} 0",
            "cpusetd_container_aligned_compute_resources_count{boundary=\"uncore_cache\",scope=\"container\"} 0",
            "cpusetd_pods_rejected{reason=\"SMTAlignmentError\"} 0",
            "cpusetd_pods_rejected{reason=\"UnexpectedAdmissionError\"} 0",
            "cpusetd_cgroup_write_errors_total{errno=\"EBUSY\"} 0",
            "cpusetd_cgroup_write_errors_total{errno=\"EINVAL\"} 0",
            "cpusetd_cgroup_write_retries_total{errno=\"EBUSY\"} 0",
            "cpusetd_drift_fights_total 0",
            "cpusetd_narrowings_blocked_total 0",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} missing:\n{text}");
        }
    }

    /// Names come from runtime configs: quotes, backslashes and line feeds are escaped so a
    /// hostile name cannot end its label or add a series.
    #[test]
    fn container_and_pod_labels_are_escaped() {
        let m = Metrics {
            container_cpus: vec![(
                PodName {
                    namespace: "ns".into(),
                    pod: "a\"} 9\ncpusetd_fake 1 \\".into(),
                },
                "c".into(),
                2,
            )],
            pod_rejections: vec![(
                PodName {
                    namespace: String::new(),
                    pod: "uid-1".into(),
                },
                "big".into(),
                AdmissionReason::SmtAlignment,
            )],
            ..Metrics::default()
        };
        let text = m.render();
        assert!(text.contains(
            "cpusetd_container_exclusive_cpus{namespace=\"ns\",pod=\"a\\\"} 9\\ncpusetd_fake 1 \\\\\",container=\"c\"} 2\n"
        ), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("cpusetd_fake")));
        assert!(text.contains(
            "cpusetd_pod_rejected{namespace=\"\",pod=\"uid-1\",container=\"big\",reason=\"SMTAlignmentError\"} 1\n"
        ), "{text}");
    }

    #[test]
    fn exposition_has_kubelet_like_names_and_errno_labels() {
        let mut m = Metrics {
            pinning_requests: 3,
            pinning_errors: 1,
            ..Metrics::default()
        };
        m.write_errors.insert(16, 2);
        m.event_to_pin.record(Duration::from_micros(300));
        let text = m.render();
        assert!(text.contains("cpusetd_pinning_requests_total 3\n"));
        assert!(text.contains("cpusetd_pinning_errors_total 1\n"));
        assert!(text.contains("cpusetd_cgroup_write_errors_total{errno=\"EBUSY\"} 2\n"));
        assert!(text.contains("cpusetd_event_to_pin_seconds{quantile=\"0.5\"} 0.000300\n"));
        assert!(text.contains("cpusetd_event_to_pin_seconds_count 1\n"));
    }
}
