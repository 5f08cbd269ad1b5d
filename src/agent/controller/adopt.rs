//! Migration from kubelet's static policy: adopting the pins kubelet's `cpu_manager_state`
//! names, before the first pass, where the live tree agrees and the container is entitled to
//! exclusive cpus; every other entry is said with the reason it was not adopted.

use super::*;
use crate::classify::{Exclusivity, SharedReason};

/// A running container or sandbox as adoption sees it.
struct Live {
    id: Option<String>,
    cpus: Option<CpuSet>,
    exclusivity: Exclusivity,
}

/// Why one entry of kubelet's checkpoint was not adopted.
enum NotAdopted {
    /// No container of that name (or id) runs.
    NotRunning,
    /// It runs but is not entitled to exclusive cpus (Burstable, a fraction, a sandbox …).
    NotExclusive(String),
    /// It runs on another set: the live tree wins.
    Elsewhere(Option<CpuSet>),
    /// The set overlaps one adopted already.
    Refused(String),
}

impl Controller {
    /// Each pin kubelet's checkpoint names is adopted when its container is entitled to
    /// exclusive cpus and runs on exactly those cpus; every other entry is said, with why.
    /// Returns the pins adopted, each as `<label> cpus <set>` (the caller counts and names
    /// them).
    pub fn adopt_kubelet_pins(&mut self, kubelet: &KubeletState) -> Vec<String> {
        let scan = self.model_scan();
        let classes = self.classify_model(&scan);
        let (live, by_id) = live_containers(&scan, &classes);
        let mut wanted: Vec<(AssignmentKey, &CpuSet)> = kubelet
            .entries
            .iter()
            .map(|(k, c)| (k.clone(), c))
            .collect();
        for (id, cpus) in &kubelet.legacy_entries {
            match by_id.get(id) {
                Some(key) => wanted.push((key.clone(), cpus)),
                None => log::info!(
                    "kubelet's cpu_manager_state: container {} (cpus {cpus}) is not running: \
                     nothing to adopt",
                    crate::logging::excerpt(id)
                ),
            }
        }
        self.learn_pod_names(wanted.iter().map(|(k, _)| k), &classes);
        let mut adopted = Vec::new();
        for (key, cpus) in wanted {
            let label = self.label(&key);
            match self.adopt_one(key, cpus, &live) {
                Ok(()) => adopted.push(format!("{label} cpus {cpus}")),
                Err(why) => say_not_adopted(&label, cpus, why),
            }
        }
        adopted
    }

    fn adopt_one(
        &mut self,
        key: AssignmentKey,
        cpus: &CpuSet,
        live: &HashMap<AssignmentKey, Live>,
    ) -> Result<(), NotAdopted> {
        let found = live.get(&key).ok_or(NotAdopted::NotRunning)?;
        match &found.exclusivity {
            Exclusivity::Exclusive { .. } => {}
            Exclusivity::Shared { reason } => {
                return Err(NotAdopted::NotExclusive(reason.to_string()))
            }
            Exclusivity::NotApplicable => {
                return Err(NotAdopted::NotExclusive("not a container".into()))
            }
        }
        if found.cpus.as_ref() != Some(cpus) {
            return Err(NotAdopted::Elsewhere(found.cpus.clone()));
        }
        let assignment = ExclusiveAssignment {
            cpus: cpus.clone(),
            container_id: found.id.clone(),
            adopted: Some(Adoption::Kubelet),
            wanted: None,
        };
        self.parts
            .assignments
            .insert(key, assignment)
            .map_err(|e| NotAdopted::Refused(e.to_string()))
    }
}

/// The running containers and sandboxes by assignment key, and their keys by container id
/// (kubelet's legacy v1 format names containers by id).
fn live_containers(
    scan: &Scan,
    classes: &[Class],
) -> (HashMap<AssignmentKey, Live>, HashMap<String, AssignmentKey>) {
    let mut live = HashMap::new();
    let mut by_id = HashMap::new();
    for (cgroup, class) in scan.cgroups.iter().zip(classes) {
        if !matches!(class.kind, CgroupKind::Container | CgroupKind::Sandbox) {
            continue;
        }
        let Some(key) = class.assignment_key() else {
            continue;
        };
        if let Some(id) = &class.container_id {
            by_id.insert(id.clone(), key.clone());
        }
        let exclusivity = match class.kind {
            CgroupKind::Sandbox => Exclusivity::Shared {
                reason: SharedReason::Sandbox,
            },
            _ => class.exclusivity.clone(),
        };
        live.insert(
            key,
            Live {
                id: class.container_id.clone(),
                cpus: cgroup.cpus.value().cloned(),
                exclusivity,
            },
        );
    }
    (live, by_id)
}

fn say_not_adopted(label: &str, cpus: &CpuSet, why: NotAdopted) {
    match why {
        NotAdopted::NotRunning => log::info!(
            "kubelet's cpu_manager_state: {label} (cpus {cpus}) is not running: nothing to adopt"
        ),
        NotAdopted::NotExclusive(reason) => log::info!(
            "kubelet's cpu_manager_state: {label} (cpus {cpus}) not adopted: {reason} (not \
             entitled to exclusive cpus)"
        ),
        NotAdopted::Elsewhere(current) => log::warn!(
            "kubelet's cpu_manager_state gives {label} cpus {cpus}, but it runs on {}: the live \
             tree wins",
            current.map_or_else(|| "an unreadable set".to_string(), |c| c.to_string())
        ),
        NotAdopted::Refused(e) => {
            log::warn!("kubelet's cpu_manager_state: {label}: {e}; not adopted")
        }
    }
}
