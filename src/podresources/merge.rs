//! The answers: cpusetd's own (pods from the cgroup tree, cpus alone) and kubelet's with
//! cpusetd's cpu ids in it.

use std::collections::HashMap;

use super::v1::{ContainerResources, PodResources};
use super::{cpu_ids, PodResourcesSnapshot};
use crate::cpuset::CpuSet;

/// The pods cpusetd sees, each container with its exclusive cpus: the answer when kubelet's
/// socket does not answer.
pub fn own_list(snapshot: &PodResourcesSnapshot) -> Vec<PodResources> {
    snapshot
        .pods
        .iter()
        .map(|pod| PodResources {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            containers: pod
                .containers
                .iter()
                .map(|c| ContainerResources {
                    name: c.name.clone(),
                    cpu_ids: cpu_ids(&c.cpus),
                    ..Default::default()
                })
                .collect(),
        })
        .collect()
}

/// kubelet's answer with every container's `cpu_ids` replaced by cpusetd's (none for a
/// container cpusetd does not pin, as kubelet's static policy). Pods and containers, devices,
/// memory and dynamic resources stay kubelet's: one picture, kubelet's, with cpusetd's cpus.
pub fn with_cpusetd_cpus(
    mut pods: Vec<PodResources>,
    snapshot: &PodResourcesSnapshot,
) -> Vec<PodResources> {
    // By (namespace, pod, container). The API names pods, not UIDs: should two pods of one
    // name be seen (one going, its successor coming), the one holding cpus is the one kubelet
    // lists (kubelet releases a pod's cpus only once it is gone from its list).
    let mut held: HashMap<(&str, &str, &str), &CpuSet> = HashMap::new();
    for pod in &snapshot.pods {
        for c in &pod.containers {
            let key = (pod.namespace.as_str(), pod.name.as_str(), c.name.as_str());
            let entry = held.entry(key).or_insert(&c.cpus);
            if entry.is_empty() {
                *entry = &c.cpus;
            }
        }
    }
    for pod in &mut pods {
        for c in &mut pod.containers {
            c.cpu_ids = held
                .get(&(pod.namespace.as_str(), pod.name.as_str(), c.name.as_str()))
                .map(|cpus| cpu_ids(cpus))
                .unwrap_or_default();
        }
    }
    pods
}

#[cfg(test)]
mod tests {
    use super::super::v1::ContainerDevices;
    use super::super::{ContainerCpus, PodCpus};
    use super::*;

    fn snapshot() -> PodResourcesSnapshot {
        let container = |name: &str, cpus: &str| ContainerCpus {
            name: name.into(),
            cpus: CpuSet::parse(cpus).unwrap(),
        };
        PodResourcesSnapshot {
            pods: vec![
                PodCpus {
                    uid: "u1".into(),
                    name: "web".into(),
                    namespace: "shop".into(),
                    containers: vec![container("app", "2-3"), container("log", "")],
                },
                PodCpus {
                    uid: "u2".into(),
                    name: "db".into(),
                    namespace: "shop".into(),
                    containers: vec![container("pg", "")],
                },
                // The successor of db, pinned.
                PodCpus {
                    uid: "u3".into(),
                    name: "db".into(),
                    namespace: "shop".into(),
                    containers: vec![container("pg", "4")],
                },
            ],
            allocatable: CpuSet::parse("1-7").unwrap(),
        }
    }

    #[test]
    fn own_list_gives_each_container_its_cpus() {
        let pods = own_list(&snapshot());
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[0].containers[0].cpu_ids, vec![2, 3]);
        assert!(pods[0].containers[1].cpu_ids.is_empty());
        assert!(pods[0].containers[0].devices.is_empty());
    }

    #[test]
    fn kubelet_answer_keeps_its_devices_and_takes_cpusetd_cpus() {
        let device = ContainerDevices {
            resource_name: "intel.com/sriov".into(),
            device_ids: vec!["0000:3b:02.0".into()],
            topology: None,
        };
        let kubelet = vec![PodResources {
            name: "web".into(),
            namespace: "shop".into(),
            containers: vec![
                ContainerResources {
                    name: "app".into(),
                    devices: vec![device.clone()],
                    // kubelet's none policy says nothing; a stale value is replaced too.
                    cpu_ids: vec![7],
                    ..Default::default()
                },
                ContainerResources {
                    name: "not-started".into(),
                    ..Default::default()
                },
            ],
        }];
        let merged = with_cpusetd_cpus(kubelet, &snapshot());
        assert_eq!(merged.len(), 1, "kubelet's pods, not cpusetd's");
        assert_eq!(merged[0].containers[0].cpu_ids, vec![2, 3]);
        assert_eq!(merged[0].containers[0].devices, vec![device]);
        assert!(merged[0].containers[1].cpu_ids.is_empty());
        let db = with_cpusetd_cpus(
            vec![PodResources {
                name: "db".into(),
                namespace: "shop".into(),
                containers: vec![ContainerResources {
                    name: "pg".into(),
                    ..Default::default()
                }],
            }],
            &snapshot(),
        );
        assert_eq!(db[0].containers[0].cpu_ids, vec![4]);
    }
}
