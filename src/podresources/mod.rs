//! kubelet's PodResources v1 API (`List`, `Get`, `GetAllocatableResources`), served by
//! `cpusetd run` on a Unix socket of its own, so the tools that ask kubelet which cpus a
//! container holds (NFD's topology-updater, the resource-topology-exporter, …) see cpusetd's
//! pins while kubelet's CPU manager runs the `none` policy.
//!
//! ```text
//!  controller ── PodResourcesSnapshot (after each save; newest wins) ──► Published
//!                                                                          │ read, never waited on
//!  cpusetd-podres thread (current-thread tokio runtime): gRPC on --pod-resources-socket
//!        └── devices, memory, DRA and the pod list from kubelet's own socket when it answers
//! ```
//!
//! The cpu ids are cpusetd's: a container's exclusive cpus as kubelet's static policy would
//! report them (its assignment; none for shared containers), and the allocatable cpus (online
//! minus reserved; none under the `none` policy, as kubelet). Where kubelet's socket answers
//! (`--kubelet-pod-resources-socket`), its answer is the picture (pods, containers, devices,
//! memory, dynamic resources) and only `cpu_ids` are replaced; where it does not, the pods and
//! containers cpusetd sees in the cgroup tree are listed, with cpus alone.

mod client;
mod merge;
mod server;
mod snapshot;

pub use client::{ask, Answer, Ask, AskError};
pub use merge::{own_list, with_cpusetd_cpus};
pub use server::{PodResourcesServer, ServeError, KUBELET_SOCKET};
pub(crate) use snapshot::snapshot;

use std::sync::{Arc, Mutex};

use crate::cpuset::CpuSet;

/// The code generated from `proto/podresources/v1/api.proto` (kubelet's, unchanged): the
/// server this module serves and the client it asks kubelet with (tests ask cpusetd with it).
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    unused_qualifications
)]
pub mod v1 {
    tonic::include_proto!("v1");
}

/// What the server answers from: the controller's view after a pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodResourcesSnapshot {
    /// Pods by namespace and name; containers by name.
    pub pods: Vec<PodCpus>,
    /// kubelet's allocatable cpus: online minus reserved (empty under the `none` policy).
    pub allocatable: CpuSet,
}

/// A pod the cgroup tree shows, with its name from the runtime config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCpus {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub containers: Vec<ContainerCpus>,
}

/// A container and its exclusive cpus (empty: it runs on the shared pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCpus {
    pub name: String,
    pub cpus: CpuSet,
}

/// The newest snapshot. The controller swaps an `Arc` in (a pointer, under a lock held for
/// nothing else); the server clones the `Arc` out: neither ever waits for the other's work.
#[derive(Debug, Default)]
pub struct Published(Mutex<Arc<PodResourcesSnapshot>>);

impl Published {
    pub fn publish(&self, snapshot: PodResourcesSnapshot) {
        let snapshot = Arc::new(snapshot);
        // The old one is dropped outside the lock.
        let _old = std::mem::replace(
            &mut *self.0.lock().unwrap_or_else(|e| e.into_inner()),
            snapshot,
        );
    }

    pub fn current(&self) -> Arc<PodResourcesSnapshot> {
        Arc::clone(&self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A cpu set as the API spells it: its ids, ascending (kubelet gives the same ids in no
/// particular order, `CPUSet.UnsortedList`; readers treat them as a set).
pub fn cpu_ids(cpus: &CpuSet) -> Vec<i64> {
    cpus.iter().map(i64::from).collect()
}

/// What is wrong with `path` as the server's socket, seen from the flag alone: too long for a
/// Unix socket address, or something else already there.
pub fn socket_problem(path: &std::path::Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    // sun_path is 108 bytes with its terminating NUL.
    const MAX: usize = 107;
    let len = path.as_os_str().as_bytes().len();
    if len > MAX {
        return Some(format!(
            "{len} bytes, longer than a Unix socket path may be ({MAX})"
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            Some("exists and is not a socket (cpusetd replaces only an old socket)".into())
        }
        _ => None,
    }
}
