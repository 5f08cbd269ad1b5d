//! What kubelet computes from a pod spec: the QoS class, each container's
//! `LinuxContainerResources` and the pod cgroup's CPU and memory settings
//! (`pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`, `pkg/kubelet/cm/helpers_linux.go`).

use serde::{Deserialize, Serialize};

use crate::ContainerSpec;

/// The CFS period kubelet uses, µs.
pub const CPU_PERIOD_US: u64 = 100_000;
const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;
const MIN_QUOTA_US: u64 = 1_000;

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    /// The QoS directory under kubepods (`""` for Guaranteed pods, which sit directly in it).
    pub fn dir(self) -> &'static str {
        match self {
            Qos::Guaranteed => "",
            Qos::Burstable => "burstable",
            Qos::BestEffort => "besteffort",
        }
    }

    /// The `oom_score_adj` kubelet gives a container of this class (Burstable: for a request
    /// of `memory_request` on a node of `node_memory` bytes).
    pub fn oom_score_adj(self, memory_request: u64, node_memory: u64) -> i64 {
        match self {
            Qos::Guaranteed => -997,
            Qos::BestEffort => 1000,
            Qos::Burstable => {
                let used = if node_memory == 0 {
                    0
                } else {
                    (1000 * u128::from(memory_request) / u128::from(node_memory)) as i64
                };
                (1000 - used).clamp(3, 999)
            }
        }
    }
}

/// The request kubelet sees after API defaulting: a limit without a request requests the limit.
fn cpu_request(c: &ContainerSpec) -> u64 {
    if c.cpu_request_milli == 0 {
        c.cpu_limit_milli
    } else {
        c.cpu_request_milli
    }
}

fn memory_request(c: &ContainerSpec) -> u64 {
    if c.memory_request == 0 {
        c.memory_limit
    } else {
        c.memory_request
    }
}

/// kubelet's QoS rules: Guaranteed when every container has CPU and memory limits equal to its
/// requests, BestEffort when none has any request or limit, Burstable otherwise.
pub fn qos(containers: &[ContainerSpec]) -> Qos {
    let nothing = containers.iter().all(|c| {
        c.cpu_request_milli == 0
            && c.cpu_limit_milli == 0
            && c.memory_request == 0
            && c.memory_limit == 0
    });
    if nothing {
        return Qos::BestEffort;
    }
    let guaranteed = !containers.is_empty()
        && containers.iter().all(|c| {
            c.cpu_limit_milli > 0
                && c.memory_limit > 0
                && cpu_request(c) == c.cpu_limit_milli
                && memory_request(c) == c.memory_limit
        });
    if guaranteed {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

/// `MilliCPUToShares`.
pub fn shares(milli: u64) -> u64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// `MilliCPUToQuota` for [`CPU_PERIOD_US`]: 0 (no quota) without a limit.
pub fn quota(milli: u64) -> u64 {
    if milli == 0 {
        return 0;
    }
    (milli * CPU_PERIOD_US / 1000).max(MIN_QUOTA_US)
}

/// A container's CPU and memory settings as kubelet passes them to the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerResources {
    pub cpu_shares: u64,
    /// 0: no quota.
    pub cpu_quota: u64,
    pub cpu_period: u64,
    /// 0: no limit.
    pub memory_limit: u64,
    pub oom_score_adj: i64,
}

/// `generateLinuxContainerResources` for container `c` of a pod of class `qos`.
pub fn container_resources(c: &ContainerSpec, qos: Qos, node_memory: u64) -> ContainerResources {
    let limit = c.cpu_limit_milli;
    ContainerResources {
        cpu_shares: shares(cpu_request(c)),
        cpu_quota: quota(limit),
        cpu_period: if limit > 0 { CPU_PERIOD_US } else { 0 },
        memory_limit: c.memory_limit,
        oom_score_adj: qos.oom_score_adj(memory_request(c), node_memory),
    }
}

/// The pod cgroup's settings (`ResourceConfigForPod`): shares from the summed requests, a
/// quota only when every container has a CPU limit, a memory limit only when every container
/// has one. BestEffort pods get the minimum shares and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodResources {
    pub cpu_shares: u64,
    /// 0: no quota.
    pub cpu_quota: u64,
    /// 0: no limit.
    pub memory_limit: u64,
}

pub fn pod_resources(containers: &[ContainerSpec]) -> PodResources {
    if qos(containers) == Qos::BestEffort {
        return PodResources {
            cpu_shares: MIN_SHARES,
            cpu_quota: 0,
            memory_limit: 0,
        };
    }
    let requests: u64 = containers.iter().map(cpu_request).sum();
    let all_cpu_limits = containers.iter().all(|c| c.cpu_limit_milli > 0);
    let all_memory_limits = containers.iter().all(|c| c.memory_limit > 0);
    PodResources {
        cpu_shares: shares(requests),
        cpu_quota: if all_cpu_limits {
            quota(containers.iter().map(|c| c.cpu_limit_milli).sum())
        } else {
            0
        },
        memory_limit: if all_memory_limits {
            containers.iter().map(|c| c.memory_limit).sum()
        } else {
            0
        },
    }
}

/// cgroup v2's `cpu.weight` for v1 shares, as runc converts it.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + ((shares.max(2) - 2) * 9999) / 262_142
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_kubelet() {
        let gu = ContainerSpec::guaranteed("a", 2000);
        let sidecar = ContainerSpec::guaranteed("b", 500);
        let bu = ContainerSpec::burstable("c", 250);
        let be = ContainerSpec::best_effort("d");
        assert_eq!(qos(&[gu.clone(), sidecar.clone()]), Qos::Guaranteed);
        assert_eq!(qos(&[gu.clone(), bu.clone()]), Qos::Burstable);
        assert_eq!(qos(std::slice::from_ref(&be)), Qos::BestEffort);
        assert_eq!(qos(&[be, bu]), Qos::Burstable);
        // A limit without a request requests the limit (API defaulting).
        let mut limit_only = gu;
        limit_only.cpu_request_milli = 0;
        limit_only.memory_request = 0;
        assert_eq!(qos(&[limit_only]), Qos::Guaranteed);
    }

    #[test]
    fn shares_and_quota_match_kubelet() {
        assert_eq!(shares(0), 2);
        assert_eq!(shares(1), 2);
        assert_eq!(shares(250), 256);
        assert_eq!(shares(2000), 2048);
        assert_eq!(quota(0), 0);
        assert_eq!(quota(5), 1000);
        assert_eq!(quota(500), 50_000);
        assert_eq!(quota(2000), 200_000);
        let pod = pod_resources(&[
            ContainerSpec::guaranteed("a", 2000),
            ContainerSpec::guaranteed("b", 500),
        ]);
        assert_eq!(pod.cpu_shares, 2560);
        assert_eq!(pod.cpu_quota, 250_000);
        assert_eq!(pod.memory_limit, 128 << 20);
        let burstable = pod_resources(&[ContainerSpec::burstable("c", 250)]);
        assert_eq!((burstable.cpu_shares, burstable.cpu_quota), (256, 0));
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }

    #[test]
    fn oom_scores_match_kubelet() {
        assert_eq!(Qos::Guaranteed.oom_score_adj(0, 1 << 30), -997);
        assert_eq!(Qos::BestEffort.oom_score_adj(0, 1 << 30), 1000);
        assert_eq!(Qos::Burstable.oom_score_adj(0, 1 << 30), 999);
        assert_eq!(Qos::Burstable.oom_score_adj(1 << 30, 1 << 30), 3);
        assert_eq!(Qos::Burstable.oom_score_adj(1 << 29, 1 << 30), 500);
    }
}
