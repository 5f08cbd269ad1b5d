//! `cpusetd reset`: the way out. Puts back what every host effect changed (the CFS quotas the
//! agent lifted, the interrupt affinities, scheduler load balancing flags and host cpusets,
//! recorded in its checkpoint and, written ahead of each change, in `host.json`), recovers
//! lifted quotas no record speaks for from the runtime configs, widens every cgroup under the
//! kubepods root back to every online CPU and memory node (top-down, so the kernel accepts
//! every write), and removes both files. Refuses to
//! run while the agent holds the state lock, since the agent would pin everything again.

use clap::Args;

use super::node::AgentArgs;
use super::oneshot::apply;
use super::{CommandError, EXIT_FAILURE};
use crate::cgroupfs::{CgroupFs, CgroupPath, CgroupVersion, InterfaceFile};
use crate::checkpoint::{self, LoadOutcome, StateLock};
use crate::cpuset::CpuSet;
use crate::logging::error_chain;
use crate::planner::{order_writes, parent_indexes, SetNode, Step, WriteStep};

#[derive(Debug, Args)]
pub struct ResetArgs {
    /// The agent's flags (only the tree flags and --state-dir matter here).
    #[command(flatten)]
    agent: AgentArgs,
}

pub fn run(args: &ResetArgs) -> Result<(), CommandError> {
    let args = &args.agent;
    args.validate()?;
    let _lock = lock_state(args)?;
    remove_projections(args);
    // No kubepods cgroup (kubelet never ran pods here, or it is gone): no cgroup to reset,
    // but what the agent changed elsewhere is still put back and its checkpoint removed, so
    // uninstalling works on such a node too.
    if let Some((kubepods, _)) = args.tree.missing_kubepods() {
        return reset_without_kubepods(args, &kubepods);
    }
    let mut node = args.tree.open()?;
    // What the effects recorded first (the quotas among it), so the scan shows what is left.
    let effects_failed = restore_effects(
        args,
        Some((
            node.hierarchy.cpuset.clone(),
            node.hierarchy.cpu.clone(),
            node.layout.version,
        )),
    );
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

    let mut writes = widen_steps(&scan, &parents, &all_cpus, &all_mems);
    let restored = quotas_from_runtime_configs(&mut node, &scan, &parents, &mut writes);
    if node.layout.version == CgroupVersion::V1 {
        unset_clone_children(&node.hierarchy.cpuset, &scan);
    }
    let known = crate::planner::Known::new(&scan, &parents, &[]);
    let executed = apply(&node.hierarchy, writes.into(), &known);
    let report = executed.tally();
    println!(
        "reset {} cgroup(s) under {} to cpus {} mems {}; {restored} quota(s) recovered from the runtime configs; {} write(s) applied, {} gone, {} failed",
        scan.cgroups.len(),
        node.layout.kubepods,
        all_cpus,
        all_mems,
        report.written,
        report.gone,
        report.failed
    );
    for e in executed.refusals() {
        eprintln!("cpusetd: {}", error_chain(e));
    }
    if !report.is_clean() || effects_failed {
        return Err(CommandError {
            status: EXIT_FAILURE,
            message: "some writes failed; run reset again".into(),
            bare: false,
        });
    }
    remove_state(&args.state_dir, true);
    Ok(())
}

/// The state lock, which a running agent holds: reset refuses to run beside it.
fn lock_state(args: &AgentArgs) -> Result<StateLock, CommandError> {
    StateLock::acquire(&args.state_dir).map_err(|e| match e {
        // Not a state directory at all: the flag's fault, not a running agent's.
        checkpoint::LockError::CreateDir { .. } | checkpoint::LockError::Open { .. } => {
            CommandError::usage(format!(
                "--state-dir {}: {}; pass the state directory the agent runs with",
                args.state_dir.display(),
                error_chain(&e)
            ))
        }
        e => CommandError::usage(format!("{}: stop cpusetd before reset", error_chain(&e))),
    })
}

/// Reset on a node without the kubepods cgroup: what the agent changed elsewhere is put back
/// and its checkpoint removed.
fn reset_without_kubepods(args: &AgentArgs, kubepods: &str) -> Result<(), CommandError> {
    let (cpuset, open_failed) = match args.tree.cpuset_hierarchy() {
        // No kubepods: no quota of a pod to put back.
        Some((root, version)) => match CgroupFs::open(root) {
            Ok(fs) => (Some((fs.clone(), fs, version)), false),
            Err(e) => {
                eprintln!("cpusetd: {}", error_chain(&e));
                (None, true)
            }
        },
        None => (None, false),
    };
    let irq_failed = restore_effects(args, cpuset) | open_failed;
    println!("no kubepods cgroup {kubepods}: no cgroup to reset");
    remove_state(&args.state_dir, !irq_failed);
    if irq_failed {
        Err(CommandError {
            status: EXIT_FAILURE,
            message: "some interrupt affinities or cpusets were not restored; run reset again"
                .into(),
            bare: false,
        })
    } else {
        Ok(())
    }
}

/// The writes that widen every cpuset under kubepods to `all_cpus` and `all_mems`, in an
/// order the kernel accepts (a cgroup whose file is missing is left as it is).
fn widen_steps(
    scan: &crate::cgroupfs::Scan,
    parents: &[Option<usize>],
    all_cpus: &CpuSet,
    all_mems: &CpuSet,
) -> Vec<Step> {
    let mut writes = Vec::new();
    for (file, wanted) in [
        (InterfaceFile::CpusetCpus, all_cpus),
        (InterfaceFile::CpusetMems, all_mems),
    ] {
        let nodes: Vec<SetNode> = scan
            .cgroups
            .iter()
            .zip(parents)
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
        writes.extend(order_writes(&nodes).into_iter().map(|w| {
            let path = scan.cgroups[w.node].path.clone();
            Step::new(path, file, w.value.to_string(), WriteStep::Widen)
        }));
    }
    writes
}

/// The kernel's default back on v1: new cgroups start with empty cpusets again (the agent
/// sets `cgroup.clone_children`; runtimes copy the parent's cpuset themselves).
fn unset_clone_children(cpuset: &CgroupFs, scan: &crate::cgroupfs::Scan) {
    let cgroups = scan.cgroups.iter().map(|c| &c.path);
    let _ = cpuset.clone_children(&scan.kubepods, cgroups, false);
}

/// Removes the pod directories of `--projection-dir` (with the agent stopped every one is
/// stale); a failure is said, never fatal: the projection is no cgroup state.
fn remove_projections(args: &AgentArgs) {
    match crate::projection::remove_all(&args.projection_dir) {
        Ok(0) => {}
        Ok(n) => println!(
            "removed {n} pod projection director{} from {}",
            if n == 1 { "y" } else { "ies" },
            args.projection_dir.display()
        ),
        Err(e) => eprintln!(
            "cpusetd: cannot remove the projection files in {}: {e}",
            args.projection_dir.display()
        ),
    }
}

/// Puts back what every host effect recorded ([`crate::effects::LIST`]: CFS quotas in the
/// `cpu` hierarchy, interrupt affinities and irqbalance, scheduler load balancing and host
/// cpusets on `cpuset`, the cpuset hierarchy, per-cpu power settings). Returns whether some
/// could not be.
fn restore_effects(
    args: &AgentArgs,
    hierarchies: Option<(CgroupFs, CgroupFs, CgroupVersion)>,
) -> bool {
    let checkpoint = match checkpoint::load(&args.state_dir) {
        LoadOutcome::Loaded(cp) => Some(cp.effects),
        _ => None,
    };
    let host = match checkpoint::host::load_host_record(&args.state_dir) {
        Ok(record) => record.map(|r| r.effects),
        Err(why) => {
            eprintln!("cpusetd: {why}: the checkpoint's record of host changes is used");
            None
        }
    };
    let env = crate::effects::Env {
        proc_root: &args.tree.proc_root,
        sysfs_root: &args.tree.sysfs_root,
        // What kubepods is does not matter to a restore: only what was recorded is written.
        cpuset: hierarchies
            .as_ref()
            .map(|(fs, _, version)| (fs.clone(), *version, CgroupPath::root())),
        cpu: hierarchies.map(|(_, cpu, _)| cpu),
        isolate_host: None,
        journal: None,
        effect_done: None,
    };
    let recorded = crate::effects::Recorded {
        checkpoint: checkpoint.as_ref(),
        host: host.as_ref(),
    };
    let mut failed = false;
    for mut effect in crate::effects::build(&env, &recorded) {
        let restored = effect.restore();
        for line in &restored.said {
            println!("{line}");
        }
        for line in &restored.errors {
            eprintln!("cpusetd: {line}");
        }
        failed |= !restored.errors.is_empty();
    }
    failed
}

/// Removes the checkpoint, and the host record when everything in it was restored.
fn remove_state(state_dir: &std::path::Path, host_restored: bool) {
    remove_checkpoint(state_dir);
    if host_restored {
        if let Err(e) = checkpoint::host::remove_host_record_file(state_dir) {
            log::warn!("cannot remove the host record: {e}");
        }
    }
}

fn remove_checkpoint(state_dir: &std::path::Path) {
    match std::fs::remove_file(checkpoint::state_path(state_dir)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("cannot remove the checkpoint: {e}"),
    }
}

/// Quotas that are unlimited now, after the quota effect put back those it recorded (the
/// agent's checkpoint and host record were lost, or `plan --apply` lifted them), recovered from what the runtime set: a container's
/// from its OCI `config.json` (`linux.resources.cpu.quota`/`period`), its pod's as kubelet
/// computes it, the sum of its containers' limits (none when one container has no limit).
/// Containers are written before their pods, so a pod's quota is never below a child's.
/// Returns how many were planned.
fn quotas_from_runtime_configs(
    node: &mut super::node::NodeView,
    scan: &crate::cgroupfs::Scan,
    parents: &[Option<usize>],
    writes: &mut Vec<Step>,
) -> usize {
    use crate::classify::CgroupKind;
    let runtime = &mut node.runtime;
    let classes = crate::classify::classify_scan(&node.naming, scan, |id| runtime.lookup(id));
    let version = node.layout.version;
    // Each container's limit as cpu-microseconds per second (period-independent).
    let mut limit_per_second: Vec<Option<f64>> = vec![None; scan.cgroups.len()];
    let mut planned = 0;
    for (i, class) in classes.iter().enumerate() {
        if class.kind != CgroupKind::Container {
            continue;
        }
        let Some(id) = &class.container_id else {
            continue;
        };
        let Some(info) = node.runtime.lookup(id) else {
            continue;
        };
        let (Some(quota), period) = (info.cpu.quota.filter(|q| *q > 0), info.cpu.period) else {
            continue;
        };
        let config_period = period.filter(|p| *p > 0).unwrap_or(100_000);
        limit_per_second[i] = Some(quota as f64 * 1e6 / config_period as f64);
        if let Some(period) = unlimited_period(&scan.cgroups[i].cpu) {
            let scaled = (quota as u128 * u128::from(period) / u128::from(config_period)) as u64;
            let path = scan.cgroups[i].path.clone();
            writes.push(quota_step(version, path, scaled, period));
            planned += 1;
        }
    }
    let pod_writes = pod_quotas(scan, parents, &classes, &limit_per_second, version);
    planned += pod_writes.len();
    writes.extend(pod_writes);
    planned
}

/// The pods' quotas, where unlimited now: the sum of their
/// containers' limits (`limit_per_second`), none where one container has no limit.
fn pod_quotas(
    scan: &crate::cgroupfs::Scan,
    parents: &[Option<usize>],
    classes: &[crate::classify::Classification],
    limit_per_second: &[Option<f64>],
    version: CgroupVersion,
) -> Vec<Step> {
    use crate::classify::CgroupKind;
    let mut pod_writes = Vec::new();
    for (p, class) in classes.iter().enumerate() {
        if class.kind != CgroupKind::Pod {
            continue;
        }
        let Some(period) = unlimited_period(&scan.cgroups[p].cpu) else {
            continue;
        };
        let containers: Vec<usize> = (0..scan.cgroups.len())
            .filter(|&c| parents[c] == Some(p) && classes[c].kind == CgroupKind::Container)
            .collect();
        let limits: Option<Vec<f64>> = containers.iter().map(|&c| limit_per_second[c]).collect();
        let Some(limits) = limits.filter(|l| !l.is_empty()) else {
            continue;
        };
        let quota = (limits.iter().sum::<f64>() * period as f64 / 1e6).round() as u64;
        let path = scan.cgroups[p].path.clone();
        pod_writes.push(quota_step(version, path, quota, period));
    }
    pod_writes
}

/// A cgroup's CFS period when its quota is unlimited now; `None` when it has a quota (or it
/// cannot be read).
fn unlimited_period(cpu: &crate::cgroupfs::CpuSettings) -> Option<u64> {
    use crate::cgroupfs::{CpuSettings, FileValue, Quota};
    match cpu {
        CpuSettings::V1 {
            cfs_quota: FileValue::Value(Quota::Unlimited),
            cfs_period_us,
            ..
        } => Some(cfs_period_us.value().copied().unwrap_or(100_000)),
        CpuSettings::V2 {
            max: FileValue::Value(max),
            ..
        } if max.quota == Quota::Unlimited => Some(max.period_us),
        _ => None,
    }
}

/// The write that puts back a quota (at least 1000 us) in the hierarchy's own file and form.
fn quota_step(version: CgroupVersion, path: CgroupPath, quota: u64, period: u64) -> Step {
    let quota = quota.max(1000);
    let (file, value) = match version {
        CgroupVersion::V1 => (InterfaceFile::CpuCfsQuotaUs, quota.to_string()),
        CgroupVersion::V2 => (InterfaceFile::CpuMax, format!("{quota} {period}")),
    };
    Step::new(path, file, value, WriteStep::LiftQuota)
}
