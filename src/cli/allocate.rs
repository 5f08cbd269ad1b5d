//! `cpusetd allocate`: what the static policy would hand a container, without touching any
//! cgroup. For operators checking a placement, and for tests of the allocator through the CLI.

use std::path::PathBuf;

use clap::{ArgGroup, Args};

use super::node::{check_placement, CoreTypeName, PlacementName};
use super::{cpuset_arg, CommandError};
use crate::allocator::{PolicyOptions, ReservedCpus, StaticPolicy};
use crate::cpuset::CpuSet;
use crate::topology::Topology;

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["topology", "sysfs_root"])))]
pub struct AllocateArgs {
    /// A topology document, as printed by `cpusetd topology --json`.
    #[arg(long, value_name = "FILE.json")]
    topology: Option<PathBuf>,
    /// Read the topology from this sysfs root instead.
    #[arg(long, value_name = "DIR")]
    sysfs_root: Option<PathBuf>,
    /// With --sysfs-root: where procfs is mounted (for isolcpus= on the kernel command line).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/proc",
        requires = "sysfs_root"
    )]
    proc_root: PathBuf,
    /// How many exclusive CPUs the container requests.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8192))]
    count: u32,
    /// The current shared pool (default: every online CPU).
    #[arg(long, value_name = "LIST", value_parser = cpuset_arg)]
    available: Option<CpuSet>,
    /// CPUs reserved for the system; never handed out exclusively.
    #[arg(long, value_name = "LIST", value_parser = cpuset_arg, conflicts_with = "reserved_cpu_count")]
    reserved_cpus: Option<CpuSet>,
    /// Reserve this many CPUs, chosen the way kubelet chooses them.
    #[arg(long, value_name = "N")]
    reserved_cpu_count: Option<usize>,
    /// kubelet's static policy options, e.g. full-pcpus-only=true.
    #[arg(long, value_name = "k=v,k=v", default_value = "")]
    cpu_manager_policy_options: String,
    /// How exclusive CPUs are placed: `kubelet` (kubelet's static policy, exactly) or `best-fit`
    /// (cpusetd's own: the tightest cache, NUMA node or socket that holds the request).
    #[arg(long, value_enum, default_value = "kubelet")]
    placement: PlacementName,
    /// NUMA nodes of a topology hint: CPUs are taken from them first.
    #[arg(long, value_name = "LIST", value_parser = cpuset_arg)]
    numa_hint: Option<CpuSet>,
    /// On a hybrid part under `--placement best-fit`: the core type to place on first (the
    /// `cpusetd.io/core-type` pod annotation). kubelet's placement does not look at it.
    #[arg(long, value_enum, default_value = "performance")]
    core_type: CoreTypeName,
    /// Never hand out CPUs the kernel isolates from its scheduler domains (isolcpus=, sysfs
    /// isolated); nohz_full= CPUs stay allocatable.
    #[arg(long)]
    respect_isolcpus: bool,
}

/// The largest `--topology` document read: `cpusetd topology --json` prints about 100 bytes a
/// cpu, so 16 MiB is far past any machine's.
const TOPOLOGY_LIMIT: u64 = 16 << 20;

fn load_topology(args: &AllocateArgs) -> Result<Topology, CommandError> {
    if let Some(file) = &args.topology {
        let text = crate::bounded::read_file(file, TOPOLOGY_LIMIT).map_err(|e| {
            CommandError::usage(if e.kind() == std::io::ErrorKind::FileTooLarge {
                format!("--topology {}: {e}", file.display())
            } else {
                format!("--topology {}: cannot read: {e}", file.display())
            })
        })?;
        return Topology::from_json(&text)
            .map_err(|e| CommandError::usage(format!("--topology {}: {e}", file.display())));
    }
    let sysfs = args.sysfs_root.as_deref().unwrap_or("/sys".as_ref());
    if !sysfs.is_dir() {
        return Err(CommandError::usage(format!(
            "--sysfs-root {}: not a directory",
            sysfs.display()
        )));
    }
    super::node::discover_topology(sysfs, &args.proc_root)
}

/// `--available`, `--reserved-cpus` and `--numa-hint` name only CPUs and NUMA nodes the
/// topology has.
fn check_cpus_known(args: &AllocateArgs, topo: &Topology) -> Result<(), CommandError> {
    for (flag, set) in [
        ("--available", &args.available),
        ("--reserved-cpus", &args.reserved_cpus),
    ] {
        if let Some(set) = set {
            let unknown = set.difference(topo.all_cpus());
            if !unknown.is_empty() {
                return Err(CommandError::usage(format!(
                    "{flag}: cpus {unknown} are not online cpus of the topology ({})",
                    topo.all_cpus()
                )));
            }
        }
    }
    if let Some(nodes) = &args.numa_hint {
        let known: CpuSet = topo.cpus().iter().map(|c| c.numa).collect();
        let unknown = nodes.difference(&known);
        if !unknown.is_empty() {
            return Err(CommandError::usage(format!(
                "--numa-hint: NUMA nodes {unknown} are not in the topology (it has {known})"
            )));
        }
    }
    Ok(())
}

pub fn run(args: &AllocateArgs) -> Result<(), CommandError> {
    let topo = load_topology(args)?;
    let options = PolicyOptions::parse(&args.cpu_manager_policy_options)
        .map_err(|e| CommandError::usage(format!("--cpu-manager-policy-options: {e}")))?;
    check_placement(args.placement, &options)?;
    check_cpus_known(args, &topo)?;
    let reserved = match (&args.reserved_cpus, args.reserved_cpu_count) {
        (Some(cpus), _) => ReservedCpus::List(cpus.clone()),
        (None, Some(count)) => ReservedCpus::Count(count),
        (None, None) => ReservedCpus::List(CpuSet::new()),
    };
    let policy = StaticPolicy::new(&topo, options, reserved, args.respect_isolcpus)
        .map_err(|e| {
            let flag = match e {
                crate::allocator::PolicyError::Options(_) => "--cpu-manager-policy-options",
                _ => "--reserved-cpus/--reserved-cpu-count",
            };
            CommandError::usage(format!("{flag}: {e}"))
        })?
        .with_placement(args.placement.into())
        .map_err(|e| CommandError::usage(format!("--placement: {e}")))?;
    let shared_pool = match &args.available {
        Some(set) => set.clone(),
        None => policy.initial_shared_pool(),
    };
    match policy.allocate_preferring(
        args.count as usize,
        &shared_pool,
        args.numa_hint.as_ref(),
        &CpuSet::new(),
        args.core_type.into(),
    ) {
        Ok(cpus) => {
            println!("{cpus}");
            Ok(())
        }
        // kubelet's own text, alone, so scripts can match it.
        Err(e) => Err(CommandError {
            status: super::EXIT_FAILURE,
            message: e.to_string(),
            bare: true,
        }),
    }
}
