//! CPU hotplug while the agent runs (kubelet does not support it).
//!
//! The kernel's online CPUs are read once per reconcile tick: `<sysfs>/devices/system/cpu/online`,
//! one small file. The kernel announces hotplug only as uevents over netlink, which the shipped
//! unit does not allow (`RestrictAddressFamilies=AF_UNIX`), and the file offers no poll
//! notification. When the list differs from the topology's, the topology is read again (under
//! the same `--sysfs-root` and `--proc-root`) and the policy rebuilt on it; the controller swaps
//! both in and plans: pins that lost CPUs get replacements (see `planner::assign`), CPUs that
//! came back join the shared pool.

use std::path::PathBuf;

use crate::allocator::StaticPolicy;
use crate::cpuset::CpuSet;
use crate::logging::error_chain;
use crate::topology::{discover, Topology};

/// Where the node's CPUs are read from, and what a rebuilt policy keeps.
#[derive(Debug)]
pub struct Hotplug {
    sysfs_root: PathBuf,
    proc_root: PathBuf,
    /// The reserved cpus as configured: after a change those online are reserved.
    reserved: CpuSet,
    /// An online list that could not be used (a topology read that failed midway through a
    /// change, a policy that cannot be built on it): said once, tried again every tick.
    failed: Option<CpuSet>,
}

/// The node after CPUs went offline or came online.
#[derive(Debug)]
pub struct CpuChange {
    pub topology: Topology,
    pub policy: Option<StaticPolicy>,
    /// Cpus that went offline, and that came online, since the last topology.
    pub offline: CpuSet,
    pub online: CpuSet,
}

impl CpuChange {
    /// Says what changed: the cpus that went offline or came online, and the reserved cpus
    /// among them (`before`: the policy this change replaces).
    pub fn say(&self, before: Option<&StaticPolicy>) {
        let online = self.topology.all_cpus();
        if !self.offline.is_empty() {
            log::info!(
                "cpus {} went offline (online now: {online}): topology read again; pins on them \
             get replacements, the shared pool goes without them",
                self.offline
            );
        }
        if !self.online.is_empty() {
            log::info!(
                "cpus {} came online (online now: {online}): topology read again; they join the \
             shared pool",
                self.online
            );
        }
        if let (Some(before), Some(after)) = (before, &self.policy) {
            let gone = before.reserved().difference(after.reserved());
            let back = after.reserved().difference(before.reserved());
            if !gone.is_empty() && after.reserved().is_empty() {
                log::warn!(
                    "reserved cpus {gone} went offline and no reserved cpu is online: nothing \
                 keeps the shared pool from emptying but the agent, which refuses pins that \
                 would empty it and releases the smallest if it must"
                );
            } else if !gone.is_empty() {
                log::warn!(
                    "reserved cpus {gone} went offline: reserved now {}",
                    after.reserved()
                );
            }
            if !back.is_empty() {
                log::info!(
                    "reserved cpus {back} are online again: reserved now {}",
                    after.reserved()
                );
            }
        }
    }
}

impl Hotplug {
    /// `reserved`: the reserved cpus as configured (`--reserved-cpus`, or those chosen for
    /// `--reserved-cpu-count` at start), offline ones among them.
    pub fn new(sysfs_root: PathBuf, proc_root: PathBuf, reserved: CpuSet) -> Self {
        Hotplug {
            sysfs_root,
            proc_root,
            reserved,
            failed: None,
        }
    }

    /// Reads the online cpus; when they differ from `topology`'s, the new topology and the
    /// policy rebuilt on it. `None`: no change, or one that cannot be used yet (said once).
    pub fn check(
        &mut self,
        topology: &Topology,
        policy: Option<&StaticPolicy>,
    ) -> Option<CpuChange> {
        let path = self.sysfs_root.join("devices/system/cpu/online");
        let online = match crate::bounded::read_file(&path, crate::bounded::KERNEL_FILE_LIMIT)
            .map_err(|e| e.to_string())
            .and_then(|text| CpuSet::parse(text.trim()).map_err(|e| e.to_string()))
        {
            Ok(online) => online,
            Err(e) => {
                self.say_failed_once(CpuSet::new(), || {
                    format!("cannot read the online cpus from {}: {e}", path.display())
                });
                return None;
            }
        };
        if &online == topology.all_cpus() {
            self.failed = None;
            return None;
        }
        // A topology read can race the kernel taking further cpus offline (their files go).
        let new = match discover(&self.sysfs_root, &self.proc_root) {
            Ok(new) => new,
            Err(e) => {
                self.say_failed_once(online, || {
                    format!("online cpus changed, but {}", error_chain(&e))
                });
                return None;
            }
        };
        let rebuilt = match policy.map(|p| p.for_topology(&new, &self.reserved)) {
            None => None,
            Some(Ok(policy)) => Some(policy),
            Some(Err(e)) => {
                let cpus = new.all_cpus().clone();
                self.say_failed_once(cpus.clone(), || {
                    format!("online cpus are {cpus} now, but the policy cannot use them: {e}")
                });
                return None;
            }
        };
        self.failed = None;
        Some(CpuChange {
            offline: topology.all_cpus().difference(new.all_cpus()),
            online: new.all_cpus().difference(topology.all_cpus()),
            topology: new,
            policy: rebuilt,
        })
    }

    fn say_failed_once(&mut self, online: CpuSet, why: impl FnOnce() -> String) {
        if self.failed.as_ref() != Some(&online) {
            log::warn!(
                "{}; pools and pins stay as they are, tried again at the next reconcile",
                why()
            );
            self.failed = Some(online);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{PolicyOptions, ReservedCpus};
    use crate::topology::{write_fake_sysfs, RegularShape};
    use std::fs;
    use std::path::Path;

    /// What the kernel's list says (the topology reads only it; per-cpu `online` files are not).
    fn set_online(sysfs: &Path, online: &str) {
        fs::write(
            sysfs.join("devices/system/cpu/online"),
            format!("{online}\n"),
        )
        .unwrap();
    }

    /// The sysfs of a 2-socket node, 4 cores each, HT: core n = cpus n and n+8.
    fn fake_sysfs(dir: &Path) -> (PathBuf, PathBuf) {
        let topology = Topology::regular(RegularShape {
            sockets: 2,
            numa_nodes_per_socket: 1,
            uncore_caches_per_numa_node: 1,
            cores_per_uncore_cache: 4,
            threads_per_core: 2,
        })
        .unwrap();
        let (sysfs, proc) = (dir.join("sys"), dir.join("proc"));
        write_fake_sysfs(&topology, &sysfs, &proc).unwrap();
        (sysfs, proc)
    }

    #[test]
    fn a_cpu_going_offline_and_back_rebuilds_topology_and_policy() {
        let dir = tempfile::tempdir().unwrap();
        let (sysfs, proc) = fake_sysfs(dir.path());
        let topology = discover(&sysfs, &proc).unwrap();
        let policy = StaticPolicy::new(
            &topology,
            PolicyOptions::default(),
            ReservedCpus::List(CpuSet::parse("0,8").unwrap()),
            false,
        )
        .unwrap();
        let mut hotplug = Hotplug::new(sysfs.clone(), proc, policy.reserved().clone());
        assert!(hotplug.check(&topology, Some(&policy)).is_none());

        // Cpu 5 and the reserved cpu 8 go offline.
        set_online(&sysfs, "0-4,6-7,9-15");
        let change = hotplug.check(&topology, Some(&policy)).expect("a change");
        assert_eq!(change.offline.to_string(), "5,8");
        assert!(change.online.is_empty());
        assert_eq!(change.topology.all_cpus().to_string(), "0-4,6-7,9-15");
        let rebuilt = change.policy.expect("a policy");
        assert_eq!(rebuilt.reserved().to_string(), "0");
        // Nothing changes until the list does again.
        assert!(hotplug.check(&change.topology, Some(&rebuilt)).is_none());

        // Back online: reserved again.
        set_online(&sysfs, "0-15");
        let back = hotplug
            .check(&change.topology, Some(&rebuilt))
            .expect("a change");
        assert_eq!(back.online.to_string(), "5,8");
        assert_eq!(back.policy.unwrap().reserved().to_string(), "0,8");
        assert_eq!(back.topology.all_cpus(), topology.all_cpus());
    }

    #[test]
    fn an_unusable_online_list_changes_nothing_and_is_said_once() {
        let dir = tempfile::tempdir().unwrap();
        let (sysfs, proc) = fake_sysfs(dir.path());
        let topology = discover(&sysfs, &proc).unwrap();
        let mut hotplug = Hotplug::new(sysfs.clone(), proc, CpuSet::new());
        for garbage in ["0-", "x"] {
            set_online(&sysfs, garbage);
            assert!(hotplug.check(&topology, None).is_none());
            assert_eq!(hotplug.failed, Some(CpuSet::new()));
        }
        // Online cpus whose topology files are gone (the kernel took them away meanwhile).
        set_online(&sysfs, "0-16");
        assert!(hotplug.check(&topology, None).is_none());
        assert_eq!(hotplug.failed, Some(CpuSet::parse("0-16").unwrap()));
        set_online(&sysfs, "0-15");
        assert!(hotplug.check(&topology, None).is_none());
        assert_eq!(hotplug.failed, None);
    }
}
