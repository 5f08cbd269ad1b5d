//! The snapshot the server answers from, built from what the agent knows: the classifications
//! of the cgroups in its model and the exclusive assignments (a pure function of them).

use std::collections::BTreeMap;

use super::{ContainerCpus, PodCpus, PodResourcesSnapshot};
use crate::classify::{CgroupKind, Classification};
use crate::cpuset::CpuSet;
use crate::state::{AssignmentKey, Assignments};

/// Every pod with a container known by name (from its runtime config) among `classes`, each
/// container with its exclusive cpus as kubelet's static policy reports them (its assignment;
/// none when shared), and `allocatable` (online minus reserved; none under the `none` policy,
/// as kubelet). Pods by namespace, name and uid; containers by name.
pub(crate) fn snapshot<'a>(
    classes: impl Iterator<Item = &'a Classification>,
    assignments: &Assignments,
    allocatable: CpuSet,
) -> PodResourcesSnapshot {
    let mut pods: BTreeMap<(&str, &str, &str), PodCpus> = BTreeMap::new();
    for class in classes {
        if class.kind != CgroupKind::Container {
            continue;
        }
        let (Some(uid), Some(container), Some(name), Some(namespace)) = (
            class.pod_uid.as_deref(),
            class.container_name.as_deref(),
            class.pod_name.as_deref(),
            class.pod_namespace.as_deref(),
        ) else {
            continue;
        };
        let pod = pods
            .entry((namespace, name, uid))
            .or_insert_with(|| PodCpus {
                uid: uid.to_string(),
                name: name.to_string(),
                namespace: namespace.to_string(),
                containers: Vec::new(),
            });
        // A restarting container can show two cgroups for a moment: one entry.
        if pod.containers.iter().any(|c| c.name == container) {
            continue;
        }
        let key = AssignmentKey::Named {
            pod_uid: uid.to_string(),
            container: container.to_string(),
        };
        let cpus = assignments
            .get(&key)
            .map(|a| a.cpus.clone())
            .unwrap_or_default();
        pod.containers.push(ContainerCpus {
            name: container.to_string(),
            cpus,
        });
    }
    let mut pods: Vec<PodCpus> = pods.into_values().collect();
    for pod in &mut pods {
        pod.containers.sort_by(|a, b| a.name.cmp(&b.name));
    }
    PodResourcesSnapshot { pods, allocatable }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroupfs::{CgroupDriver, CgroupPath, CpuSettings, FileValue};
    use crate::classify::{classify, CgroupNaming};
    use crate::state::ExclusiveAssignment;

    fn container(pod: (&str, &str, &str), id: &str, name: Option<&str>) -> Classification {
        let naming = CgroupNaming::new(
            CgroupDriver::Cgroupfs,
            &CgroupPath::new("kubepods").unwrap(),
        );
        let relative = CgroupPath::new(&format!("pod{}/{id}", pod.2)).unwrap();
        let settings = CpuSettings::V2 {
            max: FileValue::Missing,
            weight: FileValue::Missing,
        };
        let mut class = classify(&naming, &relative, &settings, None);
        assert_eq!(class.kind, CgroupKind::Container);
        class.pod_namespace = Some(pod.0.to_string());
        class.pod_name = Some(pod.1.to_string());
        class.container_name = name.map(str::to_string);
        class
    }

    #[test]
    fn lists_named_containers_by_pod_with_their_exclusive_cpus_only() {
        let uid_a = "0f9e1a6c-0000-4000-8000-00000000000a";
        let uid_b = "0f9e1a6c-0000-4000-8000-00000000000b";
        let id = |n: u8| format!("{n:064x}");
        let a = ("ns", "a", uid_a);
        let b = ("default", "b", uid_b);
        let classes = [
            container(a, &id(1), Some("web")),
            container(a, &id(2), Some("app")),
            // Restarting: a second cgroup of the same container, listed once.
            container(a, &id(3), Some("app")),
            // Not named by its runtime config: not listed.
            container(b, &id(4), None),
            container(b, &id(5), Some("db")),
        ];
        let mut assignments = Assignments::default();
        let key = AssignmentKey::Named {
            pod_uid: uid_a.to_string(),
            container: "app".to_string(),
        };
        let held = ExclusiveAssignment {
            cpus: "2-3".parse().unwrap(),
            container_id: None,
            adopted: None,
            wanted: None,
        };
        assignments.insert(key, held).unwrap();
        let got = snapshot(classes.iter(), &assignments, "1-7".parse().unwrap());
        assert_eq!(got.allocatable, "1-7".parse().unwrap());
        let pods: Vec<(&str, Vec<(&str, String)>)> = got
            .pods
            .iter()
            .map(|p| {
                let containers = p.containers.iter();
                let containers = containers.map(|c| (c.name.as_str(), c.cpus.to_string()));
                (p.name.as_str(), containers.collect())
            })
            .collect();
        assert_eq!(
            pods,
            vec![
                ("b", vec![("db", String::new())]),
                (
                    "a",
                    vec![("app", "2-3".to_string()), ("web", String::new())]
                ),
            ]
        );
        assert_eq!(got.pods[1].uid, uid_a);
        assert_eq!(got.pods[1].namespace, "ns");
    }
}
