//! Migration from kubelet's static policy: which pins of kubelet's `cpu_manager_state` (see
//! [`super::kubelet_state`]) are adopted at start, before the first pass. A pin is adopted where
//! the live tree agrees and its container is entitled to exclusive cpus; every other entry is
//! said with the reason it was not. Decided from the running cgroups' classifications and
//! cpusets alone (nothing read here).

use std::collections::HashMap;

use super::kubelet_state::KubeletState;
use crate::classify::{CgroupKind, Classification, Exclusivity, SharedReason};
use crate::cpuset::CpuSet;
use crate::state::{Adoption, AssignmentKey, Assignments, ExclusiveAssignment};

/// A running container or sandbox as adoption sees it.
#[derive(Debug)]
struct Live {
    id: Option<String>,
    cpus: Option<CpuSet>,
    exclusivity: Exclusivity,
}

/// Why one entry of kubelet's checkpoint was not adopted.
#[derive(Debug)]
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

/// kubelet's pins matched against the running containers.
#[derive(Debug)]
pub(crate) struct KubeletPins<'k> {
    live: HashMap<AssignmentKey, Live>,
    wanted: Vec<(AssignmentKey, &'k CpuSet)>,
}

impl<'k> KubeletPins<'k> {
    /// The pins `kubelet` names, by assignment key (a legacy entry's container id is looked
    /// up among the running ones: one not running is said and dropped), and the running
    /// cgroups, each as its classification and `cpuset.cpus` as read.
    pub(crate) fn new<'a>(
        kubelet: &'k KubeletState,
        running: impl Iterator<Item = (&'a Classification, Option<&'a CpuSet>)>,
    ) -> Self {
        let (live, by_id) = live_containers(running);
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
        KubeletPins { live, wanted }
    }

    /// The containers kubelet's checkpoint pins.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &AssignmentKey> {
        self.wanted.iter().map(|(k, _)| k)
    }

    /// Adopts into `assignments` each pin whose container is entitled to exclusive cpus and
    /// runs on exactly those cpus; says every other, with why (`label` names a container).
    /// Returns the pins adopted, each as `<label> cpus <set>`.
    pub(crate) fn adopt(
        self,
        assignments: &mut Assignments,
        label: impl Fn(&AssignmentKey) -> String,
    ) -> Vec<String> {
        let mut adopted = Vec::new();
        for (key, cpus) in self.wanted {
            let label = label(&key);
            match adopt_one(assignments, key, cpus, &self.live) {
                Ok(()) => adopted.push(format!("{label} cpus {cpus}")),
                Err(why) => say_not_adopted(&label, cpus, why),
            }
        }
        adopted
    }
}

fn adopt_one(
    assignments: &mut Assignments,
    key: AssignmentKey,
    cpus: &CpuSet,
    live: &HashMap<AssignmentKey, Live>,
) -> Result<(), NotAdopted> {
    let found = live.get(&key).ok_or(NotAdopted::NotRunning)?;
    match &found.exclusivity {
        Exclusivity::Exclusive { .. } => {}
        Exclusivity::Shared { reason } => return Err(NotAdopted::NotExclusive(reason.to_string())),
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
    assignments
        .insert(key, assignment)
        .map_err(|e| NotAdopted::Refused(e.to_string()))
}

/// The running containers and sandboxes by assignment key, and their keys by container id
/// (kubelet's legacy v1 format names containers by id).
fn live_containers<'a>(
    running: impl Iterator<Item = (&'a Classification, Option<&'a CpuSet>)>,
) -> (HashMap<AssignmentKey, Live>, HashMap<String, AssignmentKey>) {
    let mut live = HashMap::new();
    let mut by_id = HashMap::new();
    for (class, cpus) in running {
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
        let id = class.container_id.clone();
        let cpus = cpus.cloned();
        live.insert(
            key,
            Live {
                id,
                cpus,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cgroupfs::{CgroupDriver, CgroupPath, CpuSettings, FileValue, Quota};
    use crate::checkpoint::kubelet_state::KubeletFormat;
    use crate::classify::{classify, CgroupNaming};

    const UID: &str = "0f9e1a6c-0000-4000-8000-00000000000a";

    /// A container of a Guaranteed pod asking for `millis` of cpu.
    fn container(id: u8, name: &str, millis: u64) -> Classification {
        let kubepods = CgroupPath::new("kubepods").unwrap();
        let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, &kubepods);
        let relative = CgroupPath::new(&format!("pod{UID}/{id:064x}")).unwrap();
        let settings = CpuSettings::V1 {
            shares: FileValue::Value(millis * 1024 / 1000),
            cfs_quota: FileValue::Value(Quota::Micros(millis * 100)),
            cfs_period_us: FileValue::Value(100_000),
        };
        let mut class = classify(&naming, &relative, &settings, None);
        class.container_name = Some(name.to_string());
        class
    }

    fn key(name: &str) -> AssignmentKey {
        AssignmentKey::Named {
            pod_uid: UID.to_string(),
            container: name.to_string(),
        }
    }

    fn set(text: &str) -> CpuSet {
        text.parse().unwrap()
    }

    #[test]
    fn adopts_only_pins_the_live_tree_agrees_with() {
        let running = [
            (container(1, "app", 2000), Some(set("2-3"))),
            (container(2, "web", 500), Some(set("0-7"))),
            (container(3, "db", 2000), Some(set("4-5"))),
            (container(4, "old", 1000), Some(set("6"))),
            (container(5, "late", 1000), Some(set("3"))),
        ];
        assert!(matches!(
            running[0].0.exclusivity,
            Exclusivity::Exclusive { cpus: 2 }
        ));
        let kubelet = KubeletState {
            format: KubeletFormat::V2,
            policy_name: "static".to_string(),
            default_cpu_set: set("0-1"),
            checksum_verified: true,
            entries: BTreeMap::from([
                (key("app"), set("2-3")),
                (key("web"), set("0-1")),
                (key("db"), set("6-7")),
                (key("gone"), set("1")),
                (key("late"), set("3")),
            ]),
            legacy_entries: BTreeMap::from([
                (format!("{:064x}", 4), set("6")),
                (format!("{:064x}", 9), set("7")),
            ]),
            pod_entries: BTreeMap::new(),
        };
        let pins = KubeletPins::new(&kubelet, running.iter().map(|(c, s)| (c, s.as_ref())));
        let keys: Vec<&AssignmentKey> = pins.keys().collect();
        // The legacy entry of a running container is named; the other is dropped.
        assert_eq!(keys.len(), 6);
        assert!(keys.contains(&&key("old")));
        let mut assignments = Assignments::default();
        let adopted = pins.adopt(&mut assignments, |k| format!("<{k}>"));
        // "web" is shared, "db" runs elsewhere, "gone" is not running, "late" overlaps "app".
        assert_eq!(adopted.len(), 2, "{adopted:?}");
        assert_eq!(assignments.get(&key("app")).unwrap().cpus, set("2-3"));
        let old = assignments.get(&key("old")).unwrap();
        assert_eq!(old.adopted, Some(Adoption::Kubelet));
        assert_eq!(old.container_id.as_deref(), Some(&*format!("{:064x}", 4)));
        assert!(adopted[0].starts_with('<') && adopted[0].ends_with(" cpus 2-3"));
        for refused in ["web", "db", "gone", "late"] {
            assert!(assignments.get(&key(refused)).is_none(), "{refused}");
        }
    }
}
