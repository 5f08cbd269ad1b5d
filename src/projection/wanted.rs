//! What each projected container's file should say, from what the agent knows of it (its
//! cgroup's cpuset as last written or read, its classification), the assignments and what the
//! host effects have in force: a pure function of them, reading nothing.

use std::collections::BTreeMap;

use super::{ProjectionBody, Wanted};
use crate::cgroupfs::CgroupPath;
use crate::classify::{self, CgroupKind, Classification};
use crate::cpuset::CpuSet;
use crate::effects::InForce;
use crate::state::Assignments;
use crate::topology::Topology;

/// A container as the agent knows it: its cgroup, its classification and its `cpuset.cpus` as
/// last written or read.
pub(crate) type Known<'a> = (&'a CgroupPath, &'a Classification, Option<&'a CpuSet>);

/// What the host gives the containers besides their cgroups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Host<'a> {
    pub(crate) assignments: &'a Assignments,
    pub(crate) topology: &'a Topology,
    /// The CFS quotas the agent lifted (by cgroup).
    pub(crate) quota_lifted: &'a BTreeMap<CgroupPath, String>,
    /// What the host effects have in force, as read back.
    pub(crate) effects: &'a InForce,
}

/// The files of the containers of pods that ask for them (`cpusetd.io/projection: "enable"`),
/// or of every container with `all` (`--project-all`), by pod uid and container name. A
/// container not named by its runtime config, or on no cpus, has none.
pub(crate) fn wanted<'a>(
    containers: impl Iterator<Item = Known<'a>>,
    all: bool,
    host: Host<'_>,
) -> Wanted {
    let mut wanted = Wanted::new();
    for (path, class, cpus) in containers {
        if class.kind != CgroupKind::Container || !(all || class.projection) {
            continue;
        }
        let (Some(uid), Some(name)) = (&class.pod_uid, &class.container_name) else {
            continue;
        };
        let Some(cpus) = cpus.filter(|c| !c.is_empty()) else {
            continue;
        };
        let exclusive = class
            .assignment_key()
            .and_then(|k| host.assignments.get(&k))
            .map(|a| a.cpus.intersection(cpus))
            .unwrap_or_default();
        let isolation = in_force(path, class, cpus, &exclusive, host);
        let body = ProjectionBody::new(
            uid,
            name,
            cpus,
            &exclusive,
            |cpu| host.topology.cpu(cpu).map(|c| c.numa),
            isolation,
        );
        wanted
            .entry(uid.clone())
            .or_default()
            .insert(name.clone(), body);
    }
    wanted
}

/// The high-performance annotations in force for a container on `cpus`, `exclusive` of them
/// its own, as read back (none without exclusive cpus).
fn in_force(
    path: &CgroupPath,
    class: &Classification,
    cpus: &CpuSet,
    exclusive: &CpuSet,
    host: Host<'_>,
) -> Vec<String> {
    let mut in_force: Vec<&str> = Vec::new();
    if exclusive.is_empty() {
        return Vec::new();
    }
    let wanted = &class.isolation;
    if wanted.no_cpu_quota && host.quota_lifted.contains_key(path) {
        in_force.push(classify::CPU_QUOTA_ANNOTATION);
    }
    let effects = host.effects;
    if wanted.no_load_balancing && exclusive.is_subset(&effects.sched) {
        in_force.push(classify::CPU_LOAD_BALANCING_ANNOTATION);
    }
    if wanted.no_irqs && exclusive.is_subset(&effects.irq) {
        in_force.push(classify::IRQ_LOAD_BALANCING_ANNOTATION);
    }
    if class.cpu_shared && cpus.len() > exclusive.len() {
        in_force.push("cpu-shared.crio.io");
    }
    let power = &effects.power;
    if wanted.c_states.is_some() && exclusive.is_subset(&power.latency_in_force) {
        in_force.push(classify::CPU_C_STATES_ANNOTATION);
    }
    if wanted.governor.is_some() && exclusive.is_subset(&power.governor_in_force) {
        in_force.push(classify::CPU_FREQ_GOVERNOR_ANNOTATION);
    }
    in_force.into_iter().map(String::from).collect()
}

/// How many containers `cpu-shared.crio.io` is in force for: their cgroup holds their
/// exclusive cpus and more (for the metrics; one flag read per container but theirs).
pub(crate) fn cpu_shared<'a>(
    containers: impl Iterator<Item = (&'a Classification, Option<&'a CpuSet>)>,
    assignments: &Assignments,
) -> usize {
    containers
        .filter(|(class, cpus)| {
            let held = class
                .cpu_shared
                .then(|| class.assignment_key())
                .flatten()
                .and_then(|k| assignments.get(&k));
            match (held, cpus) {
                (Some(held), Some(cpus)) => {
                    held.cpus.is_subset(cpus) && cpus.len() > held.cpus.len()
                }
                _ => false,
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroupfs::{CgroupDriver, CpuSettings, FileValue};
    use crate::classify::{classify, CgroupNaming};
    use crate::state::{AssignmentKey, ExclusiveAssignment};
    use crate::topology::RegularShape;

    const UID: &str = "0f9e1a6c-0000-4000-8000-00000000000a";

    fn container(id: u8, name: &str) -> (CgroupPath, Classification) {
        let kubepods = CgroupPath::new("kubepods").unwrap();
        let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, &kubepods);
        let relative = format!("pod{UID}/{id:064x}");
        let (path, relative) = (format!("kubepods/{relative}"), CgroupPath::new(&relative));
        let relative = relative.unwrap();
        let settings = CpuSettings::V2 {
            max: FileValue::Missing,
            weight: FileValue::Missing,
        };
        let mut class = classify(&naming, &relative, &settings, None);
        assert_eq!(class.kind, CgroupKind::Container);
        class.container_name = Some(name.to_string());
        (CgroupPath::new(&path).unwrap(), class)
    }

    fn pin(assignments: &mut Assignments, name: &str, cpus: &str) {
        let key = AssignmentKey::Named {
            pod_uid: UID.to_string(),
            container: name.to_string(),
        };
        let held = ExclusiveAssignment {
            cpus: cpus.parse().unwrap(),
            container_id: None,
            adopted: None,
            wanted: None,
        };
        assignments.insert(key, held).unwrap();
    }

    fn topology() -> Topology {
        Topology::regular(RegularShape {
            sockets: 1,
            numa_nodes_per_socket: 2,
            uncore_caches_per_numa_node: 1,
            cores_per_uncore_cache: 2,
            threads_per_core: 1,
        })
        .unwrap()
    }

    #[test]
    fn projects_the_containers_that_ask_with_what_is_in_force_for_them() {
        let (path, mut pinned) = container(1, "pinned");
        pinned.projection = true;
        pinned.cpu_shared = true;
        pinned.isolation.no_irqs = true;
        pinned.isolation.no_load_balancing = true;
        pinned.isolation.no_cpu_quota = true;
        let (other_path, other) = container(2, "other");
        let mut assignments = Assignments::default();
        pin(&mut assignments, "pinned", "2-3");
        let effects = InForce {
            irq: "1-3".parse().unwrap(),
            ..InForce::default()
        };
        let quota_lifted = BTreeMap::from([(path.clone(), "200000".to_string())]);
        let topology = topology();
        let host = Host {
            assignments: &assignments,
            topology: &topology,
            quota_lifted: &quota_lifted,
            effects: &effects,
        };
        let (cpus, shared): (CpuSet, CpuSet) = ("0-3".parse().unwrap(), "0-1".parse().unwrap());
        let known = || {
            [
                (&path, &pinned, Some(&cpus)),
                (&other_path, &other, Some(&shared)),
            ]
            .into_iter()
        };
        let got = wanted(known(), false, host);
        let body = &got[UID]["pinned"];
        assert_eq!(got[UID].len(), 1, "only the container whose pod asks");
        assert_eq!(
            (body.cpus.as_str(), body.exclusive_cpus.as_str()),
            ("0-3", "2-3")
        );
        assert_eq!(
            (body.shared_cpus.as_str(), &body.exclusive_numa_nodes),
            ("0-1", &vec![1])
        );
        // Load balancing is not off on its cpus: not in force.
        assert_eq!(
            body.isolation,
            [
                "cpu-quota.crio.io",
                "irq-load-balancing.crio.io",
                "cpu-shared.crio.io"
            ]
        );
        let all = wanted(known(), true, host);
        let other = &all[UID]["other"];
        assert_eq!(
            (other.exclusive_cpus.as_str(), other.isolation.len()),
            ("", 0)
        );
        // A container on no cpus yet has no file.
        let empty = CpuSet::new();
        let none = wanted([(&path, &pinned, Some(&empty))].into_iter(), true, host);
        assert!(none.is_empty());
    }

    #[test]
    fn counts_the_containers_that_hold_their_exclusive_cpus_and_more() {
        let (_, mut a) = container(1, "a");
        let (_, mut b) = container(2, "b");
        let (_, c) = container(3, "c");
        a.cpu_shared = true;
        b.cpu_shared = true;
        let mut assignments = Assignments::default();
        pin(&mut assignments, "a", "2");
        pin(&mut assignments, "b", "3");
        pin(&mut assignments, "c", "1");
        let (wide, narrow): (CpuSet, CpuSet) = ("0,2".parse().unwrap(), "3".parse().unwrap());
        let known = [(&a, Some(&wide)), (&b, Some(&narrow)), (&c, Some(&wide))];
        assert_eq!(cpu_shared(known.into_iter(), &assignments), 1);
    }
}
