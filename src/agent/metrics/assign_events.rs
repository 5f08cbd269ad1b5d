//! The assignment events a pass decided, counted (kubelet's CPU manager counters among them).

use super::Metrics;
use crate::cpuset::CpuSet;
use crate::planner::AssignEvent;
use crate::topology::Topology;

impl Metrics {
    /// Counts `event` in the metrics; whether the log says it: a failure is said once per
    /// container (key) until it is met or goes, not once per pass (every pass asks again).
    pub fn count_assign_event(
        &mut self,
        event: &AssignEvent,
        full_cores: bool,
        topology: &Topology,
    ) -> bool {
        match event {
            AssignEvent::Allocated { key, cpus } => {
                self.pinning_requests += 1;
                self.count_alignment(Some(cpus), full_cores, topology);
                self.pin_succeeded(key);
                true
            }
            AssignEvent::Released { key, .. } | AssignEvent::Replaced { key, .. } => {
                self.pin_succeeded(key);
                true
            }
            AssignEvent::Adopted { .. }
            | AssignEvent::Grown { .. }
            | AssignEvent::Shrunk { .. }
            | AssignEvent::Reused { .. } => true,
            AssignEvent::Short { key, .. } => self.first_pin_failure(key),
            AssignEvent::PodRejected { key, .. } => self.first_pod_rejection(key.pod_uid()),
            AssignEvent::Failed { key, .. } => {
                let first = self.first_pin_failure(key);
                if first {
                    self.pinning_requests += 1;
                    self.pinning_errors += 1;
                    self.count_alignment(None, full_cores, topology);
                }
                first
            }
        }
    }

    /// kubelet's `container_aligned_compute_resources_count` and `_failure_count` for an
    /// allocation (`Some(cpus)`) or a refusal: physical_cpu under `full-pcpus-only`,
    /// uncore_cache for an allocation within one uncore cache (`full_cores`: the policy has
    /// `full-pcpus-only`).
    fn count_alignment(
        &mut self,
        allocated: Option<&CpuSet>,
        full_cores: bool,
        topology: &Topology,
    ) {
        let Some(cpus) = allocated else {
            self.aligned_physical_cpu_failures += u64::from(full_cores);
            return;
        };
        self.aligned_physical_cpu += u64::from(full_cores);
        let mut caches = cpus.iter().map(|c| topology.cpu(c).map(|i| i.uncore));
        let first = caches.next().flatten();
        if first.is_some() && caches.all(|c| c == first) {
            self.aligned_uncore_cache += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::AllocationError;
    use crate::state::AssignmentKey;
    use crate::topology::RegularShape;

    #[test]
    fn allocations_and_first_failures_are_counted_with_their_alignment() {
        let topology = Topology::regular(RegularShape {
            sockets: 1,
            numa_nodes_per_socket: 1,
            uncore_caches_per_numa_node: 2,
            cores_per_uncore_cache: 2,
            threads_per_core: 1,
        })
        .unwrap();
        let key = AssignmentKey::Named {
            pod_uid: "u".to_string(),
            container: "c".to_string(),
        };
        let failed = AssignEvent::Failed {
            key: key.clone(),
            requested: 3,
            error: AllocationError::SmtNotMultipleOfCore {
                requested: 3,
                cpus_per_core: 2,
            },
        };
        let mut metrics = Metrics::default();
        assert!(metrics.count_assign_event(&failed, true, &topology));
        assert!(
            !metrics.count_assign_event(&failed, true, &topology),
            "said once"
        );
        assert_eq!((metrics.pinning_requests, metrics.pinning_errors), (1, 1));
        assert_eq!(metrics.aligned_physical_cpu_failures, 1);
        // Cpus 0-1 share an uncore cache; 1-2 do not.
        for cpus in ["0-1", "1-2"] {
            let allocated = AssignEvent::Allocated {
                key: key.clone(),
                cpus: cpus.parse().unwrap(),
            };
            assert!(metrics.count_assign_event(&allocated, false, &topology));
        }
        assert_eq!(
            (metrics.pinning_requests, metrics.aligned_uncore_cache),
            (3, 1)
        );
        assert_eq!(metrics.aligned_physical_cpu, 0);
        // Pinned: a later failure is new again.
        assert!(metrics.count_assign_event(&failed, false, &topology));
    }
}
