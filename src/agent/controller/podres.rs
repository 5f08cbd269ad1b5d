//! The controller's view for the PodResources server (see [`crate::podresources`]).

use super::*;
use crate::podresources::{ContainerCpus, PodCpus, PodResourcesSnapshot};

impl Controller {
    /// Every pod with a container the model knows by name (from its runtime config), each
    /// container with its exclusive cpus as kubelet's static policy reports them (its
    /// assignment; none when shared), and the allocatable cpus (online minus reserved; none
    /// under the `none` policy, as kubelet).
    pub fn pod_resources(&self) -> PodResourcesSnapshot {
        let mut pods: BTreeMap<(&str, &str, &str), PodCpus> = BTreeMap::new();
        for entry in self.model.values() {
            let Some(class) = &entry.class else { continue };
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
            let cpus = self
                .parts
                .assignments
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
        PodResourcesSnapshot {
            pods,
            allocatable: self
                .parts
                .policy
                .as_ref()
                .map(|p| self.parts.topology.all_cpus().difference(p.reserved()))
                .unwrap_or_default(),
        }
    }
}
