//! `cpusetd reset`: the way out. Widens every cgroup under the kubepods root back to every
//! online CPU and memory node (top-down, so the kernel accepts every write), restores the CFS
//! quotas the agent lifted (recorded in its checkpoint), and removes the checkpoint. Refuses to
//! run while the agent holds the state lock, since the agent would pin everything again.

use clap::Args;

use super::node::AgentArgs;
use super::{CommandError, EXIT_FAILURE};
use crate::cgroupfs::{CgroupPath, InterfaceFile};
use crate::checkpoint::{self, LoadOutcome, StateLock};
use crate::cpuset::CpuSet;
use crate::logging::error_chain;
use crate::planner::{order_writes, parent_indexes, PlannedWrite, SetNode, WriteStep};
use crate::writer::{apply, NewChildren};

#[derive(Debug, Args)]
pub struct ResetArgs {
    /// The agent's flags (only the tree flags and --state-dir matter here).
    #[command(flatten)]
    agent: AgentArgs,
}

pub fn run(args: &ResetArgs) -> Result<(), CommandError> {
    let args = &args.agent;
    args.validate()?;
    let _lock = StateLock::acquire(&args.state_dir).map_err(|e| {
        CommandError::usage(format!("{}: stop cpusetd before reset", error_chain(&e)))
    })?;
    let node = args.tree.open()?;
    let scan = node
        .scanner()
        .scan()
        .map_err(|e| CommandError::failure(&e))?;
    let parents = parent_indexes(&scan);
    // "Every cpu" is every cpu kubepods' parent gives (it may hold fewer than the node, or
    // the kernel has taken some offline): wider is refused by the kernel.
    let limits = node.limits();
    let limited = |all: &CpuSet, limit: &Option<CpuSet>| match limit {
        Some(limit) if !all.intersection(limit).is_empty() => all.intersection(limit),
        _ => all.clone(),
    };
    let all_cpus = limited(node.topology.all_cpus(), &limits.cpus);
    let all_mems = limited(node.topology.memory_nodes(), &limits.mems);

    let mut writes = Vec::new();
    for (file, wanted) in [
        (InterfaceFile::CpusetCpus, &all_cpus),
        (InterfaceFile::CpusetMems, &all_mems),
    ] {
        let nodes: Vec<SetNode> = scan
            .cgroups
            .iter()
            .zip(&parents)
            .map(|(c, p)| {
                let current = match file {
                    InterfaceFile::CpusetCpus => &c.cpus,
                    _ => &c.mems,
                };
                SetNode {
                    parent: *p,
                    current: current.value().cloned().unwrap_or_default(),
                    desired: if current.is_missing() {
                        Default::default()
                    } else {
                        wanted.clone()
                    },
                }
            })
            .collect();
        writes.extend(order_writes(&nodes).into_iter().map(|w| PlannedWrite {
            cgroup: w.node,
            path: scan.cgroups[w.node].path.clone(),
            file,
            value: w.value.to_string(),
            step: WriteStep::Widen,
        }));
    }
    // Quotas the agent lifted, back to what they were.
    let mut restored = 0;
    if let LoadOutcome::Loaded(cp) = checkpoint::load(&args.state_dir) {
        for lifted in &cp.quota_lifted {
            let Ok(path) = CgroupPath::new(&lifted.cgroup) else {
                continue;
            };
            let Some(index) = scan.cgroups.iter().position(|c| c.path == path) else {
                continue;
            };
            let file = match node.layout.version {
                crate::cgroupfs::CgroupVersion::V1 => InterfaceFile::CpuCfsQuotaUs,
                crate::cgroupfs::CgroupVersion::V2 => InterfaceFile::CpuMax,
            };
            writes.push(PlannedWrite {
                cgroup: index,
                path,
                file,
                value: lifted.original.clone(),
                step: WriteStep::LiftQuota,
            });
            restored += 1;
        }
    }
    let report = apply(
        &node.hierarchy,
        &writes,
        &scan,
        &parents,
        NewChildren::NarrowNow,
    );
    println!(
        "reset {} cgroup(s) under {} to cpus {} mems {}; {restored} quota(s) restored; {} write(s) applied, {} gone, {} failed",
        scan.cgroups.len(),
        node.layout.kubepods,
        all_cpus,
        all_mems,
        report.applied,
        report.gone,
        report.failed.len()
    );
    for (_, e) in &report.failed {
        eprintln!("cpusetd: {}", error_chain(e));
    }
    if !report.is_clean() {
        return Err(CommandError {
            status: EXIT_FAILURE,
            message: "some writes failed; run reset again".into(),
            bare: false,
        });
    }
    match std::fs::remove_file(checkpoint::state_path(&args.state_dir)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("cannot remove the checkpoint: {e}"),
    }
    Ok(())
}
