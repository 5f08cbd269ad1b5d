//! The flags shared by the commands that work on a node's cgroup tree (`run`, `plan`, `status`,
//! `reset`), and turning them into the values the library takes: the cgroup layout, the
//! topology, the static policy and the runtime config lookup. Host paths appear here only as
//! flag defaults.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{cpuset_arg, CommandError};
use crate::allocator::{Placement, PolicyError, PolicyOptions, ReservedCpus, StaticPolicy};
use crate::cgroupfs::{
    detect_layout, CgroupDriver, CgroupLayout, CgroupPath, Hierarchy, LayoutConfig, LayoutError,
    Scanner,
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
    /// Default: `kubepods` or `kubepods.slice`, whichever exists. Never the root itself.
    #[arg(long, value_name = "REL", value_parser = kubepods_path_arg)]
    pub kubepods_path: Option<String>,
    /// kubelet's cgroup driver. Default: from the kubepods name.
    #[arg(long, value_name = "DRIVER", value_parser = ["cgroupfs", "systemd"])]
    pub cgroup_driver: Option<String>,
    /// Where sysfs is mounted.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Where procfs is mounted (mountinfo, cmdline, irq). irqbalance's socket is looked for in
    /// `run/irqbalance` beside it (`/run/irqbalance` for `/proc`).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Where a container's OCI config.json is; `{id}` is the container id. Repeatable.
    /// Default: containerd's and CRI-O's locations.
    #[arg(long, value_name = "TEMPLATE")]
    pub runtime_config_path: Vec<String>,
}

/// clap value parser for `--kubepods-path`: a cgroup below the root, without its leading and
/// trailing `/`. An empty path, `/` or `.` would name the root itself: the agent would take
/// every cgroup on the host for a pod's and `reset` would widen the host's cpusets, so they
/// are refused here, before anything is read, by every command that takes the flag.
pub fn kubepods_path_arg(text: &str) -> Result<String, String> {
    let fix = "give kubelet's kubepods cgroup relative to the cgroup root, such as \
               kubepods.slice (systemd driver) or kubepods (cgroupfs driver)";
    let trimmed = text.trim_matches('/');
    if trimmed.split('/').all(|c| c.is_empty() || c == ".") {
        return Err(format!(
            "{text:?} names the cgroup root itself, which would make every cgroup on the host \
             a pod's: {fix}"
        ));
    }
    CgroupPath::new(trimmed)
        .map(|_| trimmed.to_string())
        .map_err(|e| format!("{e}: {fix}"))
}

/// kubelet's CPU manager policy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyName {
    /// Manage nothing.
    None,
    /// Exclusive CPUs for Guaranteed containers with whole-CPU requests.
    Static,
}

/// How the static policy places exclusive CPUs (`--placement`). A flag of cpusetd's own, not
/// a policy option: kubelet's option names stay kubelet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum PlacementName {
    /// kubelet's algorithm, exactly.
    #[default]
    Kubelet,
    /// The tightest cache, NUMA node or socket that holds the request, whole cores first;
    /// kubelet's algorithm where best fit finds nothing better.
    BestFit,
}

/// `--core-type`: the core type best fit places on first on a hybrid part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CoreTypeName {
    /// Performance cores (Intel P-cores, arm big cores).
    #[default]
    Performance,
    /// Efficient cores (Intel E-cores, arm LITTLE cores).
    Efficient,
}

impl From<CoreTypeName> for crate::topology::CoreType {
    fn from(name: CoreTypeName) -> Self {
        match name {
            CoreTypeName::Performance => crate::topology::CoreType::Performance,
            CoreTypeName::Efficient => crate::topology::CoreType::Efficient,
        }
    }
}

impl From<PlacementName> for Placement {
    fn from(name: PlacementName) -> Self {
        match name {
            PlacementName::Kubelet => Placement::Kubelet,
            PlacementName::BestFit => Placement::BestFit,
        }
    }
}

/// Checks `--placement` against the policy options (best fit refuses the spreading ones).
pub fn check_placement(
    placement: PlacementName,
    options: &PolicyOptions,
) -> Result<(), CommandError> {
    Placement::from(placement)
        .check_options(options)
        .map_err(|e| CommandError::usage(format!("--placement: {e}")))
}

/// The policy and what it may use.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    #[arg(long, value_enum, default_value = "static")]
    pub cpu_manager_policy: PolicyName,
    /// kubelet's static policy options, e.g. full-pcpus-only=true.
    #[arg(long, value_name = "k=v,k=v", default_value = "")]
    pub cpu_manager_policy_options: String,
    /// How exclusive CPUs are placed: `kubelet` (kubelet's static policy, exactly) or `best-fit`
    /// (cpusetd's own: the tightest cache, NUMA node or socket that holds the request).
    #[arg(long, value_enum, default_value = "kubelet")]
    pub placement: PlacementName,
    /// CPUs reserved for the system: never exclusive.
    #[arg(long, value_name = "LIST", value_parser = cpuset_arg, conflicts_with = "reserved_cpu_count")]
    pub reserved_cpus: Option<CpuSet>,
    /// Reserve this many CPUs, chosen the way kubelet chooses them.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub reserved_cpu_count: Option<u32>,
    /// Keep CPUs the kernel isolates from its scheduler domains (isolcpus=, sysfs isolated)
    /// away from every pod; nohz_full= CPUs stay allocatable.
    #[arg(long)]
    pub respect_isolcpus: bool,
    /// Leave the CFS quota of exclusive containers as kubelet set it.
    #[arg(long)]
    pub keep_cfs_quota: bool,
    /// Restrict an exclusive container's cpuset.mems to the NUMA nodes of its CPUs.
    #[arg(long)]
    pub align_memory: bool,
}

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cpusetd";
/// Default projection directory (a tmpfs on systemd hosts: nothing in it outlives a boot).
pub const DEFAULT_PROJECTION_DIR: &str = "/run/cpusetd/projection";

/// The flags shared by `run`, `plan`, `status` and `reset` (DESIGN.md §7), so one set of flags
/// (the systemd env file's) works for all of them.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub tree: TreeArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Where the agent's checkpoint (state.json) and lock live.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// How often `run` does a full read-only scan that repairs drift and catches anything missed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub cpu_manager_reconcile_period: std::time::Duration,
    /// For pods that say `cpu-load-balancing.crio.io: "disable"`: while one holds exclusive
    /// cpus, confine every cgroup outside kubepods (system.slice, user.slice …) to the reserved
    /// cpus, so none balances load over the pod's; given back when the last such pod goes, and
    /// by `reset`. On cgroup v1 by writing their cpusets; on a cgroup v2 systemd host through
    /// systemd (`systemctl set-property --runtime <unit> AllowedCPUs=`).
    #[arg(long)]
    pub isolate_host: bool,
    /// `run` keeps the projection files here: `<DIR>/<pod uid>/<container>.json` for every
    /// container of a pod that says `cpusetd.io/projection: "enable"` (see --project-all).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PROJECTION_DIR)]
    pub projection_dir: PathBuf,
    /// `run` keeps a projection file for every container of every pod, annotated or not.
    #[arg(long)]
    pub project_all: bool,
    /// `run` writes Prometheus metrics here after each pass (node_exporter textfile collector).
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
    /// `run` serves its metrics over HTTP at http://HOST:PORT/metrics (for Prometheus), from
    /// threads of its own; off unless given. 127.0.0.1:9617 serves this node alone,
    /// 0.0.0.0:9617 every interface.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::agent::http::parse_bind_address)]
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    /// kubelet's CPU manager checkpoint. On a first start (no checkpoint of its own) `run`
    /// adopts the pins it names that the live tree agrees with (migration from kubelet's static
    /// policy); `none` skips it.
    #[arg(long, value_name = "PATH|none", default_value = crate::checkpoint::kubelet_state::DEFAULT_PATH)]
    pub kubelet_state: String,
    /// `run` serves kubelet's PodResources v1 API (List, Get, GetAllocatableResources) here,
    /// with cpusetd's exclusive cpus, for NFD's topology-updater, the resource-topology-exporter
    /// and the like (default: pod-resources.sock in the state directory); `none`: not served.
    #[arg(long, value_name = "PATH|none")]
    pub pod_resources_socket: Option<String>,
    /// kubelet's own PodResources socket: the served answers take pods, devices and memory
    /// from it when it answers (cpus alone, from the cgroup tree, when not); `none`: never ask.
    #[arg(long, value_name = "PATH|none", default_value = crate::podresources::KUBELET_SOCKET)]
    pub kubelet_pod_resources_socket: String,
}

/// The PodResources socket's name in the state directory.
pub const POD_RESOURCES_SOCKET: &str = "pod-resources.sock";

impl AgentArgs {
    /// `--kubelet-state`, `None` for `none`.
    pub fn kubelet_state_path(&self) -> Option<PathBuf> {
        (self.kubelet_state != "none").then(|| PathBuf::from(&self.kubelet_state))
    }

    /// `--pod-resources-socket` and `--kubelet-pod-resources-socket`; `None` when not served.
    pub fn pod_resources(&self) -> Option<crate::agent::PodResourcesConfig> {
        let socket = match self.pod_resources_socket.as_deref() {
            Some("none") => return None,
            Some(path) => PathBuf::from(path),
            None => self.state_dir.join(POD_RESOURCES_SOCKET),
        };
        let kubelet = (self.kubelet_pod_resources_socket != "none")
            .then(|| PathBuf::from(&self.kubelet_pod_resources_socket));
        Some(crate::agent::PodResourcesConfig { socket, kubelet })
    }
}

impl AgentArgs {
    /// Checks what can be checked from the flags alone, before anything on the node is looked
    /// at, so a wrong option is reported as itself rather than after an unrelated check.
    pub fn validate(&self) -> Result<(), CommandError> {
        let options = PolicyOptions::parse(&self.policy.cpu_manager_policy_options)
            .map_err(|e| CommandError::usage(format!("--cpu-manager-policy-options: {e}")))?;
        check_placement(self.policy.placement, &options)?;
        if let Some(config) = self.pod_resources() {
            if config.kubelet.as_ref() == Some(&config.socket) {
                return Err(CommandError::usage(format!(
                    "--kubelet-pod-resources-socket {} is cpusetd's own --pod-resources-socket: \
                     name kubelet's (default {}), or none",
                    config.socket.display(),
                    crate::podresources::KUBELET_SOCKET
                )));
            }
            if let Some(why) = crate::podresources::socket_problem(&config.socket) {
                return Err(CommandError::usage(format!(
                    "--pod-resources-socket {}: {why}; name another path, or none to not serve \
                     kubelet's PodResources API",
                    config.socket.display()
                )));
            }
        }
        if let Some(path) = &self.metrics_file {
            if let Some(why) = crate::agent::metrics::metrics_file_problem(path, &self.state_dir) {
                return Err(CommandError::usage(format!(
                    "--metrics-file {}: {why}",
                    path.display()
                )));
            }
        }
        Ok(())
    }
}

/// A Go-style duration (`10s`, `500ms`, `1m30s`, `2h`), between 10ms and 24h.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    use std::time::Duration;
    const MAX_SECONDS: f64 = 86_400.0;
    let mut total_seconds = 0.0_f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration such as 10s, 500ms or 1m30s"))?;
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
                ))
            }
        };
        // Summed in seconds and bounded before a `Duration` is made: a huge or overflowing
        // value (`18446744073709551616s`, `1e400h`) is an error, never a panic.
        total_seconds += value * seconds;
        if !total_seconds.is_finite() || total_seconds > MAX_SECONDS {
            return Err(format!("{text:?} is outside 10ms..24h"));
        }
        rest = tail;
    }
    let total = Duration::from_secs_f64(total_seconds);
    if total < Duration::from_millis(10) {
        return Err(format!("{text:?} is outside 10ms..24h"));
    }
    Ok(total)
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

    /// What kubepods' parent lets pods have (see [`Scanner::kubepods_parent_limits`]), said
    /// when it is less than the node.
    pub fn limits(&self) -> crate::planner::NodeLimits {
        let (cpus, mems) = self.scanner().kubepods_parent_limits();
        if let Some(cpus) = &cpus {
            let missing = self.topology.all_cpus().difference(cpus);
            if !missing.is_empty() {
                log::warn!(
                    "the parent of the kubepods cgroup {} gives pods only cpus {cpus}: cpus \
                     {missing} are not used",
                    self.layout.kubepods
                );
            }
        }
        crate::planner::NodeLimits { cpus, mems }
    }

    /// Scans the kubepods tree and classifies every cgroup in it.
    pub fn scan_and_classify(
        &mut self,
    ) -> Result<(crate::cgroupfs::Scan, Vec<crate::classify::Classification>), CommandError> {
        let scan = self
            .scanner()
            .scan()
            .map_err(|e| CommandError::failure(&e))?;
        let runtime = &mut self.runtime;
        let classes = crate::classify::classify_scan(&self.naming, &scan, |id| runtime.lookup(id));
        Ok((scan, classes))
    }
}

impl TreeArgs {
    /// Where the kubepods cgroup is expected (said for a person) and the nearest directory
    /// above it that exists,
    /// when the rest of the layout is fine but the kubepods cgroup is not there (yet: kubelet
    /// makes it when it starts, after the agent at boot). `None` when it exists or the layout
    /// fails for another reason.
    /// The cpuset hierarchy's root and version, also when kubepods does not exist (`reset` on
    /// a node without it still puts back what the agent changed there).
    pub fn cpuset_hierarchy(&self) -> Option<(PathBuf, crate::cgroupfs::CgroupVersion)> {
        use crate::cgroupfs::CgroupVersion;
        let config = LayoutConfig {
            proc_root: self.proc_root.clone(),
            cgroup_root: self.cgroup_root.clone(),
            driver: None,
            kubepods: None,
        };
        let root = match detect_layout_quietly(&config) {
            Ok(layout) => return Some((layout.cpuset_root, layout.version)),
            Err(LayoutError::KubepodsNotFound { root, .. }) => root,
            Err(_) => return None,
        };
        let version = if root.join("cgroup.controllers").exists() {
            CgroupVersion::V2
        } else {
            CgroupVersion::V1
        };
        Some((root, version))
    }

    pub fn missing_kubepods(&self) -> Option<(String, PathBuf)> {
        let kubepods = match &self.kubepods_path {
            Some(p) => Some(CgroupPath::new(p.trim_matches('/')).ok()?),
            None => None,
        };
        let driver = match self.cgroup_driver.as_deref() {
            Some(d) => Some(d.parse::<CgroupDriver>().ok()?),
            None => None,
        };
        let config = LayoutConfig {
            proc_root: self.proc_root.clone(),
            cgroup_root: self.cgroup_root.clone(),
            driver,
            kubepods,
        };
        match detect_layout_quietly(&config) {
            Ok(layout) => {
                let expected = layout.kubepods.under(&layout.cpuset_root);
                if expected.is_dir() {
                    return None;
                }
                let watch = expected.ancestors().skip(1).find(|d| d.is_dir())?;
                Some((expected.display().to_string(), watch.to_path_buf()))
            }
            Err(LayoutError::KubepodsNotFound { root, looked_for }) => {
                Some((format!("{looked_for} under {}", root.display()), root))
            }
            Err(_) => None,
        }
    }

    /// `--runtime-config-path`'s templates, the runtimes' defaults when none is given.
    fn config_templates(&self) -> Result<Vec<ConfigTemplate>, CommandError> {
        let templates: Vec<String> = if self.runtime_config_path.is_empty() {
            DEFAULT_CONFIG_TEMPLATES
                .iter()
                .map(|t| t.to_string())
                .collect()
        } else {
            self.runtime_config_path.clone()
        };
        templates
            .iter()
            .map(|t| {
                ConfigTemplate::new(t)
                    .map_err(|e| CommandError::usage(format!("--runtime-config-path: {e}")))
            })
            .collect()
    }

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
        let topology = discover_topology(&self.sysfs_root, &self.proc_root)?;
        let templates = self.config_templates()?;
        let naming = CgroupNaming::new(layout.driver, &layout.kubepods);
        Ok(NodeView {
            layout,
            hierarchy,
            naming,
            topology,
            runtime: RuntimeLookup::new(templates).with_sysfs(&self.sysfs_root),
        })
    }
}

/// The topology under `--sysfs-root` and `--proc-root`. One that cannot be read is a
/// configuration error (exit 2, or 78 for `run`) naming the flag whose directory it is under.
pub fn discover_topology(
    sysfs_root: &std::path::Path,
    proc_root: &std::path::Path,
) -> Result<Topology, CommandError> {
    discover(sysfs_root, proc_root).map_err(|e| {
        // The sysfs files are read first and name most errors; procfs only gives `cmdline`.
        let under_proc = e.path().starts_with(proc_root) && !e.path().starts_with(sysfs_root);
        let (flag, root, what) = if under_proc {
            ("--proc-root", proc_root, "procfs")
        } else {
            ("--sysfs-root", sysfs_root, "sysfs")
        };
        CommandError::usage(format!(
            "{flag} {}: {}; pass the directory where {what} is mounted",
            root.display(),
            super::error_chain(&e)
        ))
    })
}

/// [`detect_layout`] without its log lines (it is asked again and again while waiting).
fn detect_layout_quietly(config: &LayoutConfig) -> Result<CgroupLayout, LayoutError> {
    let level = log::max_level();
    log::set_max_level(log::LevelFilter::Error);
    let layout = detect_layout(config);
    log::set_max_level(level);
    layout
}

impl PolicyArgs {
    /// The reserved cpus as configured: `--reserved-cpus`, or those `policy` chose for
    /// `--reserved-cpu-count` (what CPU hotplug keeps reserved while online).
    pub fn configured_reserved(&self, policy: Option<&StaticPolicy>) -> CpuSet {
        match &self.reserved_cpus {
            Some(cpus) if !cpus.is_empty() => cpus.clone(),
            _ => policy.map(|p| p.reserved().clone()).unwrap_or_default(),
        }
    }

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
                // Present but offline (hotplug): reserved again when they come online.
                let offline = cpus.intersection(topology.offline());
                let unknown = cpus.difference(topology.all_cpus()).difference(&offline);
                if !unknown.is_empty() {
                    return Err(CommandError::usage(format!(
                        "--reserved-cpus: cpus {unknown} are not online (online: {})",
                        topology.all_cpus()
                    )));
                }
                if !offline.is_empty() {
                    log::warn!(
                        "--reserved-cpus: cpus {offline} are offline: reserved are {} until they \
                         come online",
                        cpus.difference(&offline)
                    );
                }
                ReservedCpus::List(cpus.difference(&offline))
            }
            (None, Some(count)) => ReservedCpus::Count(count as usize),
            _ => {
                return Err(CommandError::usage(
                    "the static policy needs reserved cpus for the system, as kubelet's does: \
                     pass --reserved-cpus LIST or --reserved-cpu-count N",
                ))
            }
        };
        check_placement(self.placement, &options)?;
        let policy = StaticPolicy::new(topology, options, reserved, self.respect_isolcpus)
            .map_err(|e| match e {
                PolicyError::Options(_) => {
                    CommandError::usage(format!("--cpu-manager-policy-options: {e}"))
                }
                _ => CommandError::usage(format!("--reserved-cpus/--reserved-cpu-count: {e}")),
            })?;
        policy
            .with_placement(self.placement.into())
            .map(Some)
            .map_err(|e| CommandError::usage(format!("--placement: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, PolicyArgs};
    use crate::allocator::Placement;
    use crate::topology::{RegularShape, Topology};
    use clap::Parser;
    use std::time::Duration;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        policy: PolicyArgs,
    }

    #[test]
    fn the_placement_flag_reaches_the_policy() {
        let topology = Topology::regular(RegularShape {
            sockets: 1,
            numa_nodes_per_socket: 2,
            uncore_caches_per_numa_node: 1,
            cores_per_uncore_cache: 4,
            threads_per_core: 2,
        })
        .unwrap();
        let placement = |extra: &[&str]| {
            let args = [&["cpusetd", "--reserved-cpus", "0"][..], extra].concat();
            let flags = Flags::try_parse_from(args).unwrap();
            flags.policy.policy(&topology).unwrap().unwrap().placement()
        };
        assert_eq!(placement(&[]), Placement::Kubelet);
        assert_eq!(placement(&["--placement", "kubelet"]), Placement::Kubelet);
        assert_eq!(placement(&["--placement", "best-fit"]), Placement::BestFit);
        let flags = Flags::try_parse_from([
            "cpusetd",
            "--reserved-cpus",
            "0",
            "--placement",
            "best-fit",
            "--cpu-manager-policy-options",
            "distribute-cpus-across-numa=true",
        ])
        .unwrap();
        let err = flags.policy.policy(&topology).unwrap_err();
        assert_eq!(err.status, super::super::EXIT_USAGE);
        assert!(err.message.starts_with("--placement: "), "{}", err.message);
    }

    #[test]
    fn durations_like_kubelets() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in [
            "",
            "10",
            "10x",
            "0s",
            "-1s",
            "25h",
            "s",
            "18446744073709551616s",
            "1e400h",
            "9223372036854775807s9223372036854775807s",
            "NaNs",
            "infs",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
