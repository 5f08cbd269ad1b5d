//! What `plan`, `status` and `demo` show of the tree: one row per container, sandbox or other
//! non-structural cgroup, with its class, request, current and desired sets, as a table or JSON.

use std::fmt::Write;

use serde::Serialize;

use crate::cgroupfs::Scan;
use crate::classify::{CgroupKind, Classification, Exclusivity};
use crate::cpuset::CpuSet;
use crate::devices::{describe_all, ContainerDevice};
use crate::planner::{AssignEvent, Plan};
use crate::state::{AssignmentKey, ExclusiveAssignment, Refusals};

/// One cgroup as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupRow {
    /// Relative to the kubepods root.
    pub path: String,
    pub kind: String,
    pub pod_uid: Option<String>,
    /// The pod's name and namespace as the runtime's config gives them.
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub container: Option<String>,
    pub container_id: Option<String>,
    pub qos: Option<String>,
    /// `None` where there is none (a sandbox, a BestEffort container).
    pub request: Option<String>,
    pub limit: Option<String>,
    /// `cpuset.cpus` now (`None`: missing or unreadable; "" not yet initialised); on cgroup v2
    /// for a cgroup left to inherit its parent's set (empty `cpuset.cpus`), its
    /// `cpuset.cpus.effective`: what is in force.
    pub current: Option<String>,
    /// What the plan wants (`None`: left alone).
    pub desired: Option<String>,
    pub exclusive: bool,
    /// The cpus it holds exclusively (also while it is not running: see [`held_rows`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// Why the row is what it is: exclusive, or why shared.
    pub note: String,
    /// The high-performance annotations in force for an exclusive container: `cpu-quota`
    /// (quota lifted), `cpu-load-balancing` (its CPUs in no scheduler domain),
    /// `irq-load-balancing` (interrupts kept off its CPUs), `cpu-shared` (its cgroup holds the
    /// shared pool too), `cpu-c-states` and `cpu-freq-governor` (its CPUs' power files read
    /// back as asked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub isolation: Vec<&'static str>,
    /// The devices its runtime config gives it and their NUMA nodes (the topology hint its
    /// exclusive CPUs were allocated with).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceRow>,
}

/// One device of a container as `status --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRow {
    /// `vfio/<group>` or a PCI address.
    pub device: String,
    /// The PCI functions behind it (a VFIO group's members; the address itself).
    pub pci: Vec<String>,
    /// Its NUMA nodes; empty when sysfs does not say (`numa_node` is -1 or missing).
    pub numa: Vec<u32>,
}

impl DeviceRow {
    fn of(device: &ContainerDevice) -> DeviceRow {
        DeviceRow {
            device: device.id.to_string(),
            pci: device.pci.iter().map(ToString::to_string).collect(),
            numa: device.numa.iter().collect(),
        }
    }
}

impl CgroupRow {
    /// Current and desired differ (drift, or a write still to come).
    pub fn differs(&self) -> bool {
        self.desired.is_some() && self.current != self.desired
    }
}

/// What is in force of the high-performance annotations that the checkpoint (or the agent)
/// knows node-wide.
#[derive(Debug, Clone, Copy)]
pub struct InForce<'a> {
    /// The CPUs interrupts are kept off now, as read back after the writes.
    pub irq: &'a CpuSet,
    /// The CPUs out of scheduler load balancing now.
    pub sched: &'a CpuSet,
    /// Why `cpu-load-balancing.crio.io` is not (wholly) in force, when it is not.
    pub sched_not_in_force: Option<&'a str>,
    /// The exclusive cpus the agent refused, by container, with kubelet's reason (the
    /// checkpoint's): what a row says when the plan has no event of its own for it.
    pub refused: &'a Refusals,
    /// The per-cpu power settings in force (`cpu-c-states.crio.io`, `cpu-freq-governor.crio.io`).
    pub power: &'a crate::cpu_power::PowerSaved,
    /// The node's cores, for `irq-load-balancing.crio.io: "housekeeping"` (`None`: every cpu
    /// its own core).
    pub topology: Option<&'a crate::topology::Topology>,
}

impl InForce<'static> {
    /// Nothing in force (`plan`).
    pub fn none() -> InForce<'static> {
        static EMPTY: std::sync::OnceLock<CpuSet> = std::sync::OnceLock::new();
        static NO_REFUSALS: Refusals = Refusals::new();
        static NO_POWER: std::sync::OnceLock<crate::cpu_power::PowerSaved> =
            std::sync::OnceLock::new();
        let empty = EMPTY.get_or_init(CpuSet::new);
        InForce {
            irq: empty,
            sched: empty,
            sched_not_in_force: None,
            refused: &NO_REFUSALS,
            power: NO_POWER.get_or_init(Default::default),
            topology: None,
        }
    }
}

/// `note` with what the pod's power annotations have in force on `held` (the exclusive cpus).
fn power_note(
    note: String,
    class: &Classification,
    held: Option<&CpuSet>,
    in_force: &InForce<'_>,
) -> String {
    let Some(held) = held else {
        return note;
    };
    let mut parts = vec![note];
    if let Some(c_states) = class.isolation.c_states {
        let value = c_states.sysfs_value();
        parts.push(if held.is_subset(&in_force.power.latency_in_force) {
            format!("cpu-c-states.crio.io in force (pm_qos_resume_latency_us {value})")
        } else {
            format!(
                "cpu-c-states.crio.io not in force: pm_qos_resume_latency_us of cpus {} does not read back {value} (see the agent log)",
                held.difference(&in_force.power.latency_in_force)
            )
        });
    }
    if let Some(governor) = class.isolation.governor {
        parts.push(if held.is_subset(&in_force.power.governor_in_force) {
            format!("cpu-freq-governor.crio.io in force ({governor})")
        } else {
            format!(
                "cpu-freq-governor.crio.io not in force on cpus {}: {governor} not offered there or not read back (see the agent log)",
                held.difference(&in_force.power.governor_in_force)
            )
        });
    }
    parts.join("; ")
}

/// The annotations besides the three "no ..." ones in force for an exclusive container
/// holding `held`, as read back: `cpu-shared` (its cgroup holds more than its own cpus),
/// `cpu-c-states` and `cpu-freq-governor` (every one of its cpus reads back the value asked).
fn also_in_force(
    class: &Classification,
    held: &CpuSet,
    current: Option<&CpuSet>,
    in_force: &InForce<'_>,
) -> Vec<&'static str> {
    let mut also = Vec::new();
    if class.cpu_shared && current.is_some_and(|now| held.is_subset(now) && now.len() > held.len())
    {
        also.push("cpu-shared");
    }
    if class.isolation.c_states.is_some() && held.is_subset(&in_force.power.latency_in_force) {
        also.push("cpu-c-states");
    }
    if class.isolation.governor.is_some() && held.is_subset(&in_force.power.governor_in_force) {
        also.push("cpu-freq-governor");
    }
    also
}

/// Whether an `isolation` entry reads "no <entry>" in the table (the others are said in the
/// note already).
fn is_a_no(entry: &str) -> bool {
    ["cpu-quota", "cpu-load-balancing", "irq-load-balancing"]
        .iter()
        .any(|no| entry.starts_with(no))
}

/// Why the container's exclusive cpus were refused: the plan's own decision (`plan`), else the
/// agent's, as its checkpoint keeps it; with the number of cpus asked for.
fn failure_of(key: &AssignmentKey, plan: &Plan, in_force: &InForce<'_>) -> Option<(usize, String)> {
    plan.events
        .iter()
        .find_map(|e| match e {
            AssignEvent::Failed {
                key: fk,
                requested,
                error,
            } if fk == key => Some((*requested, error.to_string())),
            AssignEvent::Short {
                key: fk,
                wanted,
                error,
                ..
            } if fk == key => Some((*wanted, error.to_string())),
            _ => None,
        })
        .or_else(|| {
            in_force
                .refused
                .get(key)
                .map(|r| (r.requested, r.reason.clone()))
        })
}

/// What a row says of its exclusive cpus: held, refused (and why), or why it is shared.
fn assignment_note(class: &Classification, plan: &Plan, in_force: &InForce<'_>) -> String {
    let key = class.assignment_key();
    let assigned = key.as_ref().and_then(|k| plan.assignments.get(k));
    let failure = key.as_ref().and_then(|k| failure_of(k, plan, in_force));
    // kubelet would reject the pod: said on each of its rows that would be exclusive.
    let rejection = class
        .pod_uid
        .as_deref()
        .and_then(|uid| plan.assignments.rejection(uid));
    match (&class.kind, assigned, failure, &class.exclusivity) {
        _ if plan.pools.is_none() => "not managed (policy none)".to_string(),
        (_, None, _, Exclusivity::Exclusive { .. }) if rejection.is_some() => {
            let r = rejection.expect("checked");
            format!(
                "shared: pod rejected {} ({}, container {}): {}",
                r.reason.rejected_as(),
                r.reason,
                r.container,
                r.message
            )
        }
        (_, Some(held), failure, _) if held.wanted.is_some() => format!(
            "exclusive, {} of {} cpus (the others went offline or out of reach){}",
            held.cpus.len(),
            held.entitled(),
            failure.map(|(_, e)| format!(": {e}")).unwrap_or_default()
        ),
        (_, Some(held), _, _) => match held.adopted {
            Some(how) => format!("exclusive, {how}"),
            None => "exclusive".to_string(),
        },
        (_, None, Some((requested, error)), _) => {
            format!("shared: {requested} exclusive cpus refused: {error}")
        }
        (CgroupKind::Unknown { reason }, ..) => format!("unknown: {reason}"),
        (CgroupKind::ContainerChild, ..) => "inside its container's set".to_string(),
        (_, None, None, Exclusivity::Shared { reason }) => format!("shared: {reason}"),
        (_, None, None, Exclusivity::Exclusive { cpus }) => {
            format!("shared: {cpus} exclusive cpus not given yet")
        }
        _ => "shared".to_string(),
    }
}

/// The cpus interrupts are to be kept off (all but the first core with housekeeping).
fn irq_banned(
    held: &ExclusiveAssignment,
    class: &Classification,
    in_force: &InForce<'_>,
) -> CpuSet {
    match in_force.topology {
        Some(topo) if class.isolation.irq_housekeeping => {
            held.cpus.difference(&topo.housekeeping_cpus(&held.cpus))
        }
        None if class.isolation.irq_housekeeping => held.cpus.iter().skip(1).collect::<CpuSet>(),
        _ => held.cpus.clone(),
    }
}

/// The isolations in force for a container holding exclusive cpus, as `status` names them.
fn isolation_in_force(
    class: &Classification,
    assigned: Option<&ExclusiveAssignment>,
    in_force: &InForce<'_>,
) -> Vec<&'static str> {
    let mut isolation = Vec::new();
    if let Some(held) = assigned {
        if class.isolation.no_cpu_quota {
            isolation.push("cpu-quota");
        }
        if class.isolation.no_load_balancing && held.cpus.is_subset(in_force.sched) {
            isolation.push("cpu-load-balancing");
        }
        let irq_banned = irq_banned(held, class, in_force);
        if class.isolation.no_irqs && irq_banned.is_subset(in_force.irq) {
            isolation.push(if class.isolation.irq_housekeeping {
                "irq-load-balancing (housekeeping)"
            } else {
                "irq-load-balancing"
            });
        }
    }
    isolation
}

/// `note` with what of the pod's requests is not in force (load balancing, interrupts), the
/// shared pool beside its own cpus (`cpu-shared.crio.io`) and its devices.
fn effect_notes(
    note: String,
    class: &Classification,
    assigned: Option<&ExclusiveAssignment>,
    now: Option<&CpuSet>,
    in_force: &InForce<'_>,
) -> String {
    let note = match assigned {
        Some(held) if class.isolation.no_load_balancing && !held.cpus.is_subset(in_force.sched) => {
            format!(
                "{note}; cpu-load-balancing.crio.io not in force: {}",
                in_force.sched_not_in_force.unwrap_or("not applied yet")
            )
        }
        Some(held)
            if class.isolation.no_irqs
                && !irq_banned(held, class, in_force).is_subset(in_force.irq) =>
        {
            format!(
                "{note}; irq-load-balancing.crio.io not in force: an interrupt affinity \
                 read back still has its cpus, or none was read back yet (see the agent log)"
            )
        }
        _ => note,
    };
    let note = match (assigned, now) {
        // In force as read back: the cgroup holds more than its own cpus.
        (Some(held), Some(now)) if class.cpu_shared && held.cpus.is_subset(now) => {
            if now.len() > held.cpus.len() {
                format!(
                    "{note}; cpu-shared.crio.io: {} own + shared pool",
                    held.cpus
                )
            } else {
                format!("{note}; cpu-shared.crio.io: not in force yet")
            }
        }
        _ => note,
    };
    if assigned.is_some() && !class.devices.is_empty() {
        format!("{note}; devices {}", describe_all(&class.devices))
    } else {
        note
    }
}

/// Rows for every cgroup that is not the root, a QoS directory or a pod.
pub fn rows(
    scan: &Scan,
    classes: &[Classification],
    plan: &Plan,
    in_force: &InForce<'_>,
) -> Vec<CgroupRow> {
    let mut rows = Vec::new();
    for (i, (cgroup, class)) in scan.cgroups.iter().zip(classes).enumerate() {
        if matches!(
            class.kind,
            CgroupKind::KubepodsRoot | CgroupKind::QosDir | CgroupKind::Pod
        ) {
            continue;
        }
        let key = class.assignment_key();
        let assigned = key.as_ref().and_then(|k| plan.assignments.get(k));
        let note = assignment_note(class, plan, in_force);
        let mut isolation = isolation_in_force(class, assigned, in_force);
        if let Some(held) = assigned {
            isolation.extend(also_in_force(
                class,
                &held.cpus,
                cgroup.cpus.value(),
                in_force,
            ));
        }
        let note = power_note(note, class, assigned.map(|h| &h.cpus), in_force);
        let note = effect_notes(note, class, assigned, cgroup.cpus.value(), in_force);
        rows.push(CgroupRow {
            path: cgroup.relative.to_string(),
            kind: class.kind.to_string(),
            pod_uid: class.pod_uid.clone(),
            pod_name: class.pod_name.clone(),
            namespace: class.pod_namespace.clone(),
            container: class.container_name.clone(),
            container_id: class.container_id.clone(),
            qos: class.qos.map(|q| q.to_string()),
            request: class
                .resources
                .as_ref()
                .filter(|_| has_request(class))
                .map(|r| r.request.to_string()),
            limit: class
                .resources
                .as_ref()
                .and_then(|r| r.limit.as_ref())
                .map(|l| l.to_string()),
            current: current_cpus(cgroup, &plan.desired[i]),
            desired: plan.desired[i].cpus.as_ref().map(|c| c.to_string()),
            exclusive: assigned.is_some(),
            held: assigned.map(|a| a.cpus.to_string()),
            note,
            isolation,
            devices: class.devices.iter().map(DeviceRow::of).collect(),
        });
    }
    rows
}

/// What a row shows as its current set: `cpuset.cpus`, or for a v2 cgroup left to inherit its
/// parent's set, `cpuset.cpus.effective` (what is in force there).
fn current_cpus(
    cgroup: &crate::cgroupfs::ScannedCgroup,
    desired: &crate::planner::DesiredCgroup,
) -> Option<String> {
    let shown = if desired.cpus_inherited {
        &cgroup.effective_cpus
    } else {
        &cgroup.cpus
    };
    shown.value().map(|c| c.to_string())
}

/// Whether a row has a CPU request to show: a sandbox and a BestEffort container have none
/// (kubelet's minimum `cpu.shares` 2, read back as `0m..2m`, or `0m..28m` from a v2 weight).
fn has_request(class: &Classification) -> bool {
    class.kind != CgroupKind::Sandbox
        && class.qos != Some(crate::classify::QosClass::BestEffort)
        && class
            .resources
            .as_ref()
            .is_some_and(|r| r.request != crate::classify::Millicores::Exact(0))
}

/// Rows for the assignments no scanned container holds now: a container that exited and
/// will restart, or whose cpus the pod's next container may take (kubelet's init-container
/// reuse). The agent keeps their cpus exclusive, so they are shown, with the pod's names
/// and class as its other rows have them.
pub fn held_rows(
    scan: &Scan,
    classes: &[Classification],
    assignments: &crate::state::Assignments,
) -> Vec<CgroupRow> {
    use crate::state::AssignmentKey;
    let seen: std::collections::HashSet<AssignmentKey> =
        classes.iter().filter_map(|c| c.assignment_key()).collect();
    let mut rows = Vec::new();
    for (key, held) in assignments.iter().filter(|(k, _)| !seen.contains(*k)) {
        let uid = key.pod_uid();
        let of_pod = || {
            scan.cgroups
                .iter()
                .zip(classes)
                .filter(move |(_, c)| c.pod_uid.as_deref() == Some(uid))
        };
        let pod_dir = of_pod().find(|(_, c)| c.kind == CgroupKind::Pod);
        let named = of_pod().find(|(_, c)| c.pod_name.is_some()).map(|(_, c)| c);
        let (container, container_id) = match key {
            // No container runs under the name: no id (the last one's is gone).
            AssignmentKey::Named { container, .. } => (Some(container.clone()), None),
            AssignmentKey::Id { container_id, .. } => (None, Some(container_id.clone())),
        };
        rows.push(CgroupRow {
            path: pod_dir
                .map(|(g, _)| g.relative.to_string())
                .unwrap_or_default(),
            kind: "held".to_string(),
            pod_uid: Some(uid.to_string()),
            pod_name: named.and_then(|c| c.pod_name.clone()),
            namespace: named.and_then(|c| c.pod_namespace.clone()),
            container,
            container_id,
            qos: pod_dir.and_then(|(_, c)| c.qos).map(|q| q.to_string()),
            request: None,
            limit: None,
            current: None,
            desired: None,
            exclusive: true,
            held: Some(held.cpus.to_string()),
            note: format!(
                "exclusive cpus {} held while it is not running (its restart, or the pod's \
                 next container, takes them)",
                held.cpus
            ),
            isolation: Vec::new(),
            devices: Vec::new(),
        });
    }
    rows
}

/// Orders rows as an operator looks for them: by pod (`namespace/name`, then UID; rows of no
/// pod last), in a pod the sandbox first, then containers by name, each followed by the
/// cgroups it made itself.
pub fn sort_rows(rows: &mut [CgroupRow]) {
    let sandbox = CgroupKind::Sandbox.to_string();
    let child = CgroupKind::ContainerChild.to_string();
    // A child cgroup sorts with the row whose path contains it.
    let owner = |row: &CgroupRow| -> (u8, String) {
        let owner = if row.kind == child {
            rows.iter()
                .filter(|o| o.kind != child && row.path.starts_with(&format!("{}/", o.path)))
                .max_by_key(|o| o.path.len())
                .unwrap_or(row)
        } else {
            row
        };
        (u8::from(owner.kind != sandbox), owner.container_label())
    };
    // A pod's names as any of its rows has them (a child cgroup has no runtime config).
    let mut names: std::collections::HashMap<&str, (String, String)> = Default::default();
    for r in rows.iter().filter(|r| r.pod_name.is_some()) {
        if let Some(uid) = r.pod_uid.as_deref() {
            names.entry(uid).or_insert_with(|| {
                (
                    r.namespace.clone().unwrap_or_default(),
                    r.pod_name.clone().unwrap_or_default(),
                )
            });
        }
    }
    let mut keyed: Vec<_> = rows
        .iter()
        .map(|r| {
            let (rank, label) = owner(r);
            let uid = r.pod_uid.clone().unwrap_or_default();
            let (namespace, name) = names.get(uid.as_str()).cloned().unwrap_or_default();
            (
                (r.pod_uid.is_none(), namespace, name, uid),
                rank,
                label,
                r.path.clone(),
                r.clone(),
            )
        })
        .collect();
    keyed.sort_by(|a, b| (&a.0, a.1, &a.2, &a.3).cmp(&(&b.0, b.1, &b.2, &b.3)));
    for (slot, keyed) in rows.iter_mut().zip(keyed) {
        *slot = keyed.4;
    }
}

/// Cuts `s` to `n` characters (with `…`); `-` for nothing, `""` for empty.
fn short(s: Option<&str>, n: usize) -> String {
    match s {
        Some(s) if s.chars().count() > n => s.chars().take(n).collect::<String>() + "…",
        Some("") => "\"\"".to_string(),
        Some(s) => s.to_string(),
        None => "-".to_string(),
    }
}

impl CgroupRow {
    /// How an operator names the pod: `namespace/name` where the runtime said, else the UID's
    /// first characters.
    pub fn pod_label(&self) -> String {
        match (&self.namespace, &self.pod_name) {
            (Some(namespace), Some(name)) => short(Some(&format!("{namespace}/{name}")), 40),
            (None, Some(name)) => short(Some(name), 40),
            _ => short(self.pod_uid.as_deref(), 8),
        }
    }

    /// The container's name, `POD` for a sandbox (as `crictl ps` shows it), else its id's
    /// first characters.
    pub fn container_label(&self) -> String {
        match (&self.container, &self.container_id) {
            (Some(name), _) => name.clone(),
            (None, _) if self.kind == CgroupKind::Sandbox.to_string() => "POD".to_string(),
            (None, Some(id)) => short(Some(id), 12),
            (None, None) => self.kind.clone(),
        }
    }
}

/// The rows as a fixed-width table; `*` marks rows whose current set is not the desired one.
/// `wide` adds the pod UID and the container id in full.
pub fn render_table(rows: &[CgroupRow], wide: bool) -> String {
    let mut headers = vec!["POD", "CONTAINER"];
    if wide {
        headers.extend(["POD UID", "CONTAINER ID"]);
    }
    headers.extend(["QOS", "REQUEST", "CURRENT", "DESIRED", "NOTE"]);
    let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let table: Vec<Vec<String>> = rows.iter().map(|r| table_cells(r, wide)).collect();
    align(&headers, &table)
}

/// One row's cells for [`render_table`], printable only (names and notes come from runtime
/// configs and directory names).
fn table_cells(r: &CgroupRow, wide: bool) -> Vec<String> {
    let mark = if r.differs() { "*" } else { "" };
    let mut row = vec![r.pod_label(), r.container_label()];
    if wide {
        row.push(short(r.pod_uid.as_deref(), 36));
        row.push(short(r.container_id.as_deref(), 64));
    }
    row.extend([
        r.qos.clone().unwrap_or_else(|| "-".into()),
        r.request.clone().unwrap_or_else(|| "-".into()),
        short(r.current.as_deref(), 24) + mark,
        short(r.desired.as_deref(), 24),
        {
            let no: Vec<&str> = r.isolation.iter().copied().filter(|i| is_a_no(i)).collect();
            if no.is_empty() {
                r.note.clone()
            } else {
                format!("{} (no {})", r.note, no.join(", no "))
            }
        },
    ]);
    row.into_iter()
        .map(|cell| crate::logging::printable(&cell).into_owned())
        .collect()
}

/// The header and rows in columns two spaces apart, the last column unpadded.
fn align(headers: &[String], table: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                let _ = write!(text, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers);
    for row in table {
        line(row);
    }
    out
}
