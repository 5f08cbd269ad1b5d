//! `cpusetd status`: every container, its class, the CPUs it should have and the CPUs it has,
//! from the agent's checkpoint and the live tree. Works while the agent runs; needs no IPC.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;
use serde::Serialize;

use super::node::{AgentArgs, NodeView};
use super::CommandError;
use crate::checkpoint::{self, LoadOutcome};
use crate::cpuset::CpuSet;
use crate::planner::{desired_tree, names_from_assignments, parent_indexes, Plan, Pools};
use crate::report::{render_table, rows, CgroupRow};
use crate::topology::{owner_key, render_map, MapStyle, Mark, Topology};

/// The legend line of the CPU states in `--map`.
pub const MAP_STATES: &str = "R reserved   · shared pool   I isolated (isolcpus)   X offline";

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The agent's flags (only the tree flags and --state-dir matter here).
    #[command(flatten)]
    agent: AgentArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Add the pod UID and the full container id to the table.
    #[arg(long)]
    wide: bool,
    /// Draw the node instead: sockets, NUMA nodes, L3 caches and cores, each CPU marked
    /// reserved, shared, isolated or with the key of the container holding it.
    #[arg(long, conflicts_with_all = ["json", "wide"])]
    map: bool,
}

#[derive(Debug, Serialize)]
struct StatusDoc {
    policy: String,
    reserved: String,
    shared_pool: String,
    shared_pool_size: usize,
    exclusive_cpus: String,
    exclusive_cpu_count: usize,
    last_reconcile_unix_ms: Option<u64>,
    containers: Vec<CgroupRow>,
    /// Rows whose current set is not the desired one.
    differing: usize,
    /// What irqbalance was told (or why not), while device interrupts are kept off cpus.
    #[serde(skip_serializing_if = "Option::is_none")]
    irqbalance: Option<String>,
}

/// What `status` shows: the checkpoint's pools and every container's desired and actual set.
#[derive(Debug)]
pub struct StatusView {
    doc: StatusDoc,
    topology: Topology,
    reserved: CpuSet,
    irq: crate::irq::IrqSaved,
}

impl StatusView {
    pub fn rows(&self) -> &[CgroupRow] {
        &self.doc.containers
    }

    /// Adds what irqbalance was told, or why it was not (looked up under `proc_root`).
    pub fn note_irqbalance(&mut self, proc_root: &Path) {
        self.doc.irqbalance = crate::irqbalance::status_note(
            proc_root,
            &self.irq.banned,
            self.irq.irqbalance.as_ref(),
        );
    }

    /// The node as a grid (`status --map`): each exclusive container gets a key (in the order
    /// of its first CPU) and a legend line.
    pub fn render_map(&self, style: MapStyle) -> String {
        let mut owners: Vec<(CpuSet, String)> = self
            .doc
            .containers
            .iter()
            .filter(|r| r.exclusive)
            .filter_map(|r| {
                let cpus = r.desired.as_ref().or(r.current.as_ref())?;
                let cpus = CpuSet::parse(cpus).ok()?;
                let name = format!("{}/{}", r.pod_label(), r.container_label());
                Some((cpus, crate::logging::printable(&name).into_owned()))
            })
            .collect();
        owners.sort_by_key(|(cpus, _)| cpus.iter().next());
        let owner_of = |cpu: u32| owners.iter().position(|(cpus, _)| cpus.contains(cpu));
        let isolated = self.topology.isolated();
        let mark = |cpu: u32| match owner_of(cpu) {
            Some(index) => Mark::Owner {
                key: owner_key(index),
                index,
            },
            None if self.reserved.contains(cpu) => Mark::Reserved,
            None if isolated.contains(cpu) => Mark::Isolated,
            None => Mark::Shared,
        };
        let mut legend = vec![String::new(), MAP_STATES.to_string()];
        for (index, (cpus, name)) in owners.iter().enumerate() {
            legend.push(format!("{:<2} {name}  cpus {cpus}", owner_key(index)));
        }
        render_map(&self.topology, mark, &legend, style)
    }

    /// The header line and the table, as `cpusetd status` prints them (`wide`: with UIDs and
    /// container ids).
    pub fn render(&self, wide: bool) -> String {
        let d = &self.doc;
        let age = d.last_reconcile_unix_ms.map(|ms| {
            let then = UNIX_EPOCH + Duration::from_millis(ms);
            then.elapsed()
                .map(|e| format!("{}s ago", e.as_secs()))
                .unwrap_or_else(|_| "just now".into())
        });
        let mut out = format!(
            "policy {}: reserved {}, shared pool {} ({} cpus), exclusive {} ({} cpus), last reconcile {}\n\n",
            d.policy,
            d.reserved,
            d.shared_pool,
            d.shared_pool_size,
            d.exclusive_cpus,
            d.exclusive_cpu_count,
            age.unwrap_or_else(|| "never".into())
        );
        out.push_str(&render_table(&d.containers, wide));
        if d.differing > 0 {
            out.push_str(&format!(
                "\n{} cgroup(s) marked * differ from what the agent wants (a write still to come, or drift the next pass repairs)\n",
                d.differing
            ));
        }
        if let Some(note) = &d.irqbalance {
            out.push_str(&format!("\n{note}\n"));
        }
        out
    }
}

/// Reads the agent's checkpoint and the live tree. With the agent's policy (the same flags),
/// a container that should hold exclusive cpus but does not says why (kubelet's error text:
/// SMT alignment, not enough cpus), as the agent decided it.
pub fn collect(
    node: &mut NodeView,
    state_dir: &Path,
    policy: Option<&crate::allocator::StaticPolicy>,
) -> Result<StatusView, CommandError> {
    let cp = match checkpoint::load(state_dir) {
        LoadOutcome::Loaded(cp) => cp,
        LoadOutcome::Missing => {
            return Err(CommandError::usage(format!(
                "no checkpoint in {}: is cpusetd running with --state-dir {}?",
                state_dir.display(),
                state_dir.display()
            )))
        }
        LoadOutcome::Unusable { path, reason } => {
            return Err(CommandError::failure(&std::io::Error::other(
                reason.describe(&path),
            )))
        }
    };
    let (scan, mut classes) = node.scan_and_classify()?;
    names_from_assignments(&mut classes, &cp.assignments);
    let exclusive = cp.assignments.exclusive_cpus();
    let pools = Pools {
        pod_cpus: cp.shared_pool.union(&exclusive),
        shared: cp.shared_pool.clone(),
        memory_nodes: node.topology.memory_nodes().clone(),
    };
    let parents = parent_indexes(&scan);
    let desired = desired_tree(
        &scan,
        &classes,
        &parents,
        &cp.assignments,
        &pools,
        &node.topology,
        false,
    );
    // Why a container entitled to exclusive cpus holds none: the allocation the agent would
    // make now, from what it holds, fails with kubelet's reason.
    let events = match policy {
        Some(policy) => {
            let limits = node.limits();
            let config = crate::planner::PlanConfig {
                topology: &node.topology,
                policy: Some(policy),
                align_memory: false,
                keep_cfs_quota: true,
                limits: Some(&limits),
            };
            crate::planner::plan(&scan, &classes, &cp.assignments, &config)
                .events
                .into_iter()
                .filter(|e| {
                    matches!(
                        e,
                        crate::planner::AssignEvent::Failed { .. }
                            | crate::planner::AssignEvent::Short { .. }
                    )
                })
                .collect()
        }
        None => Vec::new(),
    };
    let view = Plan {
        pools: (cp.policy == checkpoint::Policy::Static).then_some(pools),
        desired,
        parents,
        assignments: cp.assignments.clone(),
        events,
        writes: Vec::new(),
    };
    // cgroup v2 without remote partitions: said whatever the checkpoint holds (an agent that
    // never saw such a pod says nothing in it).
    let refusal = crate::sched_balance::Support::detect(
        &node.hierarchy.cpuset,
        node.layout.version,
        &node.layout.kubepods,
    )
    .refusal();
    let in_force = crate::report::InForce {
        irq: &cp.irq.in_force,
        sched: &cp.sched.isolated,
        sched_not_in_force: refusal.or(cp.sched.not_in_force.as_deref()),
    };
    let table = rows(&scan, &classes, &view, &in_force);
    let differing = table.iter().filter(|r| r.differs()).count();
    Ok(StatusView {
        topology: node.topology.clone(),
        reserved: cp.reserved.clone(),
        irq: (*cp.irq).clone(),
        doc: StatusDoc {
            policy: cp.policy.to_string(),
            reserved: cp.reserved.to_string(),
            shared_pool: cp.shared_pool.to_string(),
            shared_pool_size: cp.shared_pool.len(),
            exclusive_cpus: if exclusive.is_empty() {
                "none".to_string()
            } else {
                exclusive.to_string()
            },
            exclusive_cpu_count: exclusive.len(),
            last_reconcile_unix_ms: cp.last_reconcile_unix_ms,
            containers: table,
            differing,
            irqbalance: None,
        },
    })
}

pub fn run(args: &StatusArgs) -> Result<(), CommandError> {
    args.agent.validate()?;
    let mut node = args.agent.tree.open()?;
    // The policy only explains; flags that do not make one (no reserved cpus given) leave
    // the reasons out.
    let policy = args.agent.policy.policy(&node.topology).ok().flatten();
    let mut view = collect(&mut node, &args.agent.state_dir, policy.as_ref())?;
    view.note_irqbalance(&args.agent.tree.proc_root);
    if args.json {
        let text =
            serde_json::to_string_pretty(&view.doc).map_err(|e| CommandError::failure(&e))?;
        println!("{text}");
    } else if args.map {
        let style = MapStyle::for_output(std::io::stdout().is_terminal());
        print!("{}", view.render_map(style));
    } else {
        print!("{}", view.render(args.wide));
    }
    Ok(())
}
