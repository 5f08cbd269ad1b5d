//! The flags shared by the commands that work on a node's cgroup tree (`run`, `plan`, `status`,
//! `reset`), and turning them into the values the library takes: the cgroup layout, the
//! topology, the static policy and the runtime config lookup. Host paths appear here only as
//! flag defaults.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{cpuset_arg, CommandError};
use crate::allocator::{PolicyError, PolicyOptions, ReservedCpus, StaticPolicy};
use crate::cgroupfs::{
    detect_layout, CgroupDriver, CgroupLayout, CgroupPath, Hierarchy, LayoutConfig, Scanner,
};
use crate::classify::CgroupNaming;
use crate::cpuset::CpuSet;
use crate::runtime::{ConfigTemplate, RuntimeLookup, DEFAULT_CONFIG_TEMPLATES};
use crate::topology::{discover, Topology};

/// Where the node's trees are.
#[derive(Debug, Clone, Args)]
pub struct TreeArgs {
    /// The cgroup root: on v1 the folder holding the controller mounts (`cpuset/`, `cpu,cpuacct/`),
    /// on v2 the unified root. Default: found from <proc-root>/self/mountinfo.
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,
    /// The kubepods cgroup, relative to the root (to each controller's mount on v1).
    /// Default: `kubepods` or `kubepods.slice`, whichever exists.
    #[arg(long, value_name = "REL")]
    pub kubepods_path: Option<String>,
    /// kubelet's cgroup driver. Default: from the kubepods name.
    #[arg(long, value_name = "DRIVER", value_parser = ["cgroupfs", "systemd"])]
    pub cgroup_driver: Option<String>,
    /// Where sysfs is mounted.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Where procfs is mounted (mountinfo, cmdline).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Where a container's OCI config.json is; `{id}` is the container id. Repeatable.
    /// Default: containerd's and CRI-O's locations.
    #[arg(long, value_name = "TEMPLATE")]
    pub runtime_config_path: Vec<String>,
}

/// kubelet's CPU manager policy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyName {
    /// Manage nothing.
    None,
    /// Exclusive CPUs for Guaranteed containers with whole-CPU requests.
    Static,
}

/// The policy and what it may use.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    #[arg(long, value_enum, default_value = "static")]
    pub cpu_manager_policy: PolicyName,
    /// kubelet's static policy options, e.g. full-pcpus-only=true.
    #[arg(long, value_name = "k=v,k=v", default_value = "")]
    pub cpu_manager_policy_options: String,
    /// CPUs reserved for the system: never exclusive.
    #[arg(long, value_name = "LIST", value_parser = cpuset_arg, conflicts_with = "reserved_cpu_count")]
    pub reserved_cpus: Option<CpuSet>,
    /// Reserve this many CPUs, chosen the way kubelet chooses them.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub reserved_cpu_count: Option<u32>,
    /// Keep CPUs the kernel isolates (isolcpus=, nohz_full=) away from every pod.
    #[arg(long)]
    pub respect_isolcpus: bool,
    /// Leave the CFS quota of exclusive containers as kubelet set it.
    #[arg(long)]
    pub keep_cfs_quota: bool,
    /// Restrict an exclusive container's cpuset.mems to the NUMA nodes of its CPUs.
    #[arg(long)]
    pub align_memory: bool,
}

/// Everything a command needs to look at the node's cgroup tree.
#[derive(Debug)]
pub struct NodeView {
    pub layout: CgroupLayout,
    pub hierarchy: Hierarchy,
    pub naming: CgroupNaming,
    pub topology: Topology,
    pub runtime: RuntimeLookup,
}

impl NodeView {
    pub fn scanner(&self) -> Scanner {
        Scanner::new(self.hierarchy.clone(), self.layout.kubepods.clone())
    }
}

impl TreeArgs {
    /// Detects the layout, reads the topology, opens the hierarchy. Every failure is a
    /// configuration error naming the flag to fix.
    pub fn open(&self) -> Result<NodeView, CommandError> {
        let kubepods = self
            .kubepods_path
            .as_deref()
            .map(|p| {
                CgroupPath::new(p.trim_matches('/'))
                    .map_err(|e| CommandError::usage(format!("--kubepods-path {p:?}: {e}")))
            })
            .transpose()?;
        let driver = self
            .cgroup_driver
            .as_deref()
            .map(|d| d.parse::<CgroupDriver>())
            .transpose()
            .map_err(|e| CommandError::usage(format!("--cgroup-driver: {e}")))?;
        let layout = detect_layout(&LayoutConfig {
            proc_root: self.proc_root.clone(),
            cgroup_root: self.cgroup_root.clone(),
            driver,
            kubepods,
        })
        .map_err(|e| CommandError::usage(super::error_chain(&e)))?;
        let hierarchy =
            Hierarchy::open(&layout).map_err(|e| CommandError::usage(super::error_chain(&e)))?;
        if !hierarchy.cpuset.exists(&layout.kubepods) {
            return Err(CommandError::usage(format!(
                "kubepods cgroup {} does not exist under {}: is kubelet running with this \
                 cgroup root? Otherwise pass --kubepods-path",
                layout.kubepods,
                layout.cpuset_root.display()
            )));
        }
        if !self.sysfs_root.is_dir() {
            return Err(CommandError::usage(format!(
                "--sysfs-root {}: not a directory",
                self.sysfs_root.display()
            )));
        }
        let topology =
            discover(&self.sysfs_root, &self.proc_root).map_err(|e| CommandError::failure(&e))?;
        let templates: Vec<String> = if self.runtime_config_path.is_empty() {
            DEFAULT_CONFIG_TEMPLATES
                .iter()
                .map(|t| t.to_string())
                .collect()
        } else {
            self.runtime_config_path.clone()
        };
        let templates = templates
            .iter()
            .map(|t| {
                ConfigTemplate::new(t)
                    .map_err(|e| CommandError::usage(format!("--runtime-config-path: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let naming = CgroupNaming::new(layout.driver, &layout.kubepods);
        Ok(NodeView {
            layout,
            hierarchy,
            naming,
            topology,
            runtime: RuntimeLookup::new(templates),
        })
    }
}

impl PolicyArgs {
    /// The static policy, or `None` for `--cpu-manager-policy none`. The static policy needs
    /// reserved CPUs, as kubelet's does.
    pub fn policy(&self, topology: &Topology) -> Result<Option<StaticPolicy>, CommandError> {
        if self.cpu_manager_policy == PolicyName::None {
            return Ok(None);
        }
        let options = PolicyOptions::parse(&self.cpu_manager_policy_options)
            .map_err(|e| CommandError::usage(format!("--cpu-manager-policy-options: {e}")))?;
        let reserved = match (&self.reserved_cpus, self.reserved_cpu_count) {
            (Some(cpus), _) if !cpus.is_empty() => {
                let unknown = cpus.difference(topology.all_cpus());
                if !unknown.is_empty() {
                    return Err(CommandError::usage(format!(
                        "--reserved-cpus: cpus {unknown} are not online (online: {})",
                        topology.all_cpus()
                    )));
                }
                ReservedCpus::List(cpus.clone())
            }
            (None, Some(count)) => ReservedCpus::Count(count as usize),
            _ => {
                return Err(CommandError::usage(
                    "the static policy needs reserved cpus for the system, as kubelet's does: \
                     pass --reserved-cpus LIST or --reserved-cpu-count N",
                ))
            }
        };
        StaticPolicy::new(topology, options, reserved, self.respect_isolcpus)
            .map(Some)
            .map_err(|e| match e {
                PolicyError::Options(_) => {
                    CommandError::usage(format!("--cpu-manager-policy-options: {e}"))
                }
                _ => CommandError::usage(format!("--reserved-cpus/--reserved-cpu-count: {e}")),
            })
    }
}
