//! A scripted kubelet for cpusetd's tests: it does to a real container runtime what kubelet
//! does for a pod, and nothing else. It makes the pod-level cgroups the way kubelet's cgroup
//! drivers do ([`cgroups`]), then drives the runtime over CRI ([`cri`]): RunPodSandbox with the
//! pod's `cgroup_parent` (host network, so no CNI), CreateContainer/StartContainer with the
//! `LinuxContainerResources` kubelet computes from the pod spec ([`resources`]), a restart as a
//! new container with `attempt + 1` in the same sandbox, and pod deletion (stop, remove, remove
//! the pod cgroup). No registry is needed: [`image`] builds the pause and workload images from
//! a static busybox and imports them with `ctr`.
//!
//! The library drives the tests in `tests/containerd.rs` (host, cgroup v1, cgroupfs driver);
//! the `crikubelet` binary drives the systemd node in `scripts/node-e2e.sh` (cgroup v2, systemd
//! driver).

// The crate's 60-line function limit (clippy.toml), tests aside.
#![deny(clippy::too_many_lines)]

pub mod cgroups;
pub mod cri;
pub mod image;
pub mod resources;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use cgroups::{CgroupDriver, NodeCgroups};
pub use cri::{Cri, CriError};
pub use resources::Qos;

/// A container of a pod spec: what kubelet reads from `spec.containers[i]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub name: String,
    #[serde(default)]
    pub cpu_request_milli: u64,
    #[serde(default)]
    pub cpu_limit_milli: u64,
    #[serde(default)]
    pub memory_request: u64,
    #[serde(default)]
    pub memory_limit: u64,
    /// The command; default: print the CPUs the first instruction may run on, then sleep.
    #[serde(default)]
    pub command: Vec<String>,
    /// The image; default: the busybox image [`image`] builds.
    #[serde(default)]
    pub image: Option<String>,
    /// hostPath volumes, as kubelet passes them.
    #[serde(default)]
    pub mounts: Vec<MountSpec>,
    /// `securityContext.privileged` (the pod's sandbox is privileged too, as kubelet makes it).
    #[serde(default)]
    pub privileged: bool,
    /// The cpuset kubelet's own static CPU manager would pass (`cpuset_cpus`); none by default,
    /// as with `cpuManagerPolicy: none`.
    #[serde(default)]
    pub cpuset_cpus: Option<String>,
}

/// A host path mounted into a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    pub host_path: String,
    pub container_path: String,
    #[serde(default)]
    pub readonly: bool,
}

impl ContainerSpec {
    /// A container asking for `milli` CPU and 64 MiB, requests equal to limits.
    pub fn guaranteed(name: &str, milli: u64) -> ContainerSpec {
        ContainerSpec {
            name: name.to_string(),
            cpu_request_milli: milli,
            cpu_limit_milli: milli,
            memory_request: 64 << 20,
            memory_limit: 64 << 20,
            command: Vec::new(),
            image: None,
            mounts: Vec::new(),
            privileged: false,
            cpuset_cpus: None,
        }
    }

    /// A container with a CPU request and no limits.
    pub fn burstable(name: &str, request_milli: u64) -> ContainerSpec {
        ContainerSpec {
            name: name.to_string(),
            cpu_request_milli: request_milli,
            cpu_limit_milli: 0,
            memory_request: 0,
            memory_limit: 0,
            command: Vec::new(),
            image: None,
            mounts: Vec::new(),
            privileged: false,
            cpuset_cpus: None,
        }
    }

    /// A container without requests or limits.
    pub fn best_effort(name: &str) -> ContainerSpec {
        ContainerSpec::burstable(name, 0)
    }
}

/// A pod spec, reduced to what kubelet passes to the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    #[serde(default)]
    pub annotations: HashMap<String, String>,
    pub containers: Vec<ContainerSpec>,
}

impl PodSpec {
    /// The pod's QoS class, by kubelet's rules.
    pub fn qos(&self) -> Qos {
        resources::qos(&self.containers)
    }
}

/// A container as started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningContainer {
    pub name: String,
    pub id: String,
    /// Its init process in the node's pid namespace.
    pub pid: u32,
    pub attempt: u32,
    /// The CRI log file: what the container printed.
    pub log_path: String,
}

/// A pod as started: enough to restart its containers and delete it, from another process too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningPod {
    pub spec: PodSpec,
    pub sandbox_id: String,
    /// What RunPodSandbox got as `cgroup_parent`.
    pub cgroup_parent: String,
    pub containers: Vec<RunningContainer>,
}

impl RunningPod {
    pub fn container(&self, name: &str) -> Option<&RunningContainer> {
        self.containers.iter().find(|c| c.name == name)
    }
}
