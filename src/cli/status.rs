//! `cpusetd status`: every container, its class, the CPUs it should have and the CPUs it has,
//! from the agent's checkpoint and the live tree. Works while the agent runs; needs no IPC.
//! Whether an agent runs at all is said first (the state directory's lock tested, its holder a
//! cpusetd): without one, exit 3 after the rest.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;
use serde::Serialize;

use super::node::{AgentArgs, NodeView};
use super::CommandError;
use crate::cgroupfs::{CpuSettings, Quota, Scan};
use crate::checkpoint::{self, LoadOutcome, LockHolder};
use crate::classify::{classify, config_matches_cgroup, CgroupKind, Classification};
use crate::cpuset::CpuSet;
use crate::planner::{desired_tree, names_from_assignments, parent_indexes, Plan, Pools};
use crate::report::{held_rows, render_table, rows, sort_rows, CgroupRow};
use crate::runtime::OciCpu;
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

/// `status` exits with this when no agent runs on the state directory (LSB's "program is not
/// running", as `systemctl status` exits), after showing what the checkpoint and tree hold.
pub const EXIT_NOT_RUNNING: u8 = 3;

/// Whether an agent runs on the state directory.
#[derive(Debug, Serialize)]
struct AgentDoc {
    running: bool,
    /// Its pid, when it runs and recorded one.
    pid: Option<u32>,
    /// Why no agent runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    not_running: Option<String>,
}

#[derive(Debug, Serialize)]
struct StatusDoc {
    agent: AgentDoc,
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
    state_dir: std::path::PathBuf,
    topology: Topology,
    reserved: CpuSet,
    /// The host effects as the checkpoint records them (read, never applied).
    effects: Vec<Box<dyn crate::effects::Effect>>,
}

impl StatusView {
    pub fn rows(&self) -> &[CgroupRow] {
        &self.doc.containers
    }

    /// Notes, on each container row whose projection file exists under `dir`, that it is
    /// projected and at which generation (one small read per such row).
    pub fn note_projections(&mut self, dir: &Path) {
        for row in &mut self.doc.containers {
            let (Some(uid), Some(container)) = (&row.pod_uid, &row.container) else {
                continue;
            };
            if row.kind != "container" {
                continue;
            }
            let path = crate::projection::file_path(dir, uid, container);
            if let Some(generation) = crate::projection::generation_of(&path) {
                row.note = format!("{}; projected (generation {generation})", row.note);
            }
        }
    }

    /// Adds what irqbalance was told, or why it was not (looked up under `proc_root`).
    pub fn note_irqbalance(&mut self, proc_root: &Path) {
        self.doc.irqbalance = self
            .effects
            .iter()
            .find_map(|effect| effect.status_note(proc_root));
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
                let cpus = r.held.as_ref().or(r.desired.as_ref())?;
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
        self.not_running_line() + &render_map(&self.topology, mark, &legend, style)
    }

    /// Why no agent runs on the state directory (`None`: one does).
    pub fn not_running(&self) -> Option<&str> {
        self.doc.agent.not_running.as_deref()
    }

    /// The line said first when no agent runs, or nothing.
    fn not_running_line(&self) -> String {
        match self.not_running() {
            Some(why) => format!(
                "cpusetd is not running on {}: {why}. Below: its last checkpoint and the live \
                 tree, which nothing keeps in line\n\n",
                self.state_dir.display()
            ),
            None => String::new(),
        }
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
        let mut out = self.not_running_line();
        if d.policy == checkpoint::Policy::None.to_string() && d.shared_pool.is_empty() {
            out += &format!(
                "policy none: cpusetd manages no cpusets (each container keeps the cpus its \
                 runtime gave it), last reconcile {}\n\n",
                age.unwrap_or_else(|| "never".into())
            );
            out.push_str(&render_table(&d.containers, wide));
            return out;
        }
        out += &format!(
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

/// Whether the agent runs (it holds the state lock), and why not where it does not.
fn agent_doc(state_dir: &Path) -> AgentDoc {
    match checkpoint::lock_holder(state_dir) {
        LockHolder::Agent(pid) => AgentDoc {
            running: true,
            pid,
            not_running: None,
        },
        LockHolder::NotRunning(why) => AgentDoc {
            running: false,
            pid: None,
            not_running: Some(why),
        },
    }
}

/// The agent's checkpoint; without one, an error that says whether the agent runs.
fn load_checkpoint(
    state_dir: &Path,
    agent: &AgentDoc,
) -> Result<checkpoint::Checkpoint, CommandError> {
    match checkpoint::load(state_dir) {
        LoadOutcome::Loaded(cp) => Ok(cp),
        LoadOutcome::Missing => Err(match &agent.not_running {
            Some(why) => CommandError {
                status: EXIT_NOT_RUNNING,
                message: format!(
                    "cpusetd is not running on {}: {why}; no checkpoint there either",
                    state_dir.display()
                ),
                bare: false,
            },
            None => CommandError::failure(&std::io::Error::other(format!(
                "the agent on {} has not written its first checkpoint yet (starting, or \
                     waiting for the kubepods cgroup)",
                state_dir.display()
            ))),
        }),
        LoadOutcome::Unusable { path, reason } => Err(CommandError::failure(
            &std::io::Error::other(reason.describe(&path)),
        )),
    }
}

/// The plan as the checkpoint has it: its pools and assignments over the live tree (nothing
/// desired where the agent manages no cgroup), without writes.
fn checkpoint_view(
    node: &NodeView,
    scan: &Scan,
    classes: &[Classification],
    cp: &checkpoint::Checkpoint,
) -> Plan {
    let exclusive = cp.assignments.exclusive_cpus();
    let pools = Pools {
        pod_cpus: cp.shared_pool.union(&exclusive),
        shared: cp.shared_pool.clone(),
        memory_nodes: node.topology.memory_nodes().clone(),
    };
    let parents = parent_indexes(scan);
    // Under `none` the agent leaves every cgroup alone (nothing is desired) unless
    // `--respect-isolcpus` keeps them off the isolated cpus: then its pool is in the checkpoint.
    let managed = cp.policy == checkpoint::Policy::Static || !cp.shared_pool.is_empty();
    let desired = if managed {
        desired_tree(
            scan,
            classes,
            &parents,
            &cp.assignments,
            &pools,
            &node.topology,
            false,
        )
    } else {
        vec![Default::default(); scan.cgroups.len()]
    };
    Plan {
        pools: managed.then_some(pools),
        desired,
        parents,
        assignments: cp.assignments.clone(),
        events: Vec::new(),
        writes: Default::default(),
    }
}

/// Reads the agent's checkpoint and the live tree. A container that should hold exclusive cpus
/// but does not says why as the agent decided it (kubelet's text, kept in the checkpoint), not
/// as a recomputation here would.
pub fn collect(node: &mut NodeView, state_dir: &Path) -> Result<StatusView, CommandError> {
    let agent = agent_doc(state_dir);
    let cp = load_checkpoint(state_dir, &agent)?;
    let (scan, mut classes) = node.scan_and_classify()?;
    with_live_requests(node, &scan, &mut classes);
    names_from_assignments(&mut classes, &cp.assignments);
    let exclusive = cp.assignments.exclusive_cpus();
    let view = checkpoint_view(node, &scan, &classes, &cp);
    let effects = recorded_effects(node, &cp.effects);
    let effects_in_force = crate::effects::in_force(&effects);
    let in_force = crate::report::InForce {
        irq: &effects_in_force.irq,
        sched: &effects_in_force.sched,
        sched_not_in_force: effects_in_force.sched_not_in_force.as_deref(),
        refused: &cp.refused,
        power: &effects_in_force.power,
        topology: Some(&node.topology),
    };
    let mut table = rows(&scan, &classes, &view, &in_force);
    table.extend(held_rows(&scan, &classes, &cp.assignments));
    sort_rows(&mut table);
    let differing = table.iter().filter(|r| r.differs()).count();
    let last_reconcile_unix_ms = cp
        .last_reconcile_unix_ms
        .max(checkpoint::read_last_reconcile(state_dir));
    Ok(StatusView {
        state_dir: state_dir.to_path_buf(),
        topology: node.topology.clone(),
        reserved: cp.reserved.clone(),
        effects,
        doc: StatusDoc {
            agent,
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
            last_reconcile_unix_ms,
            containers: table,
            differing,
            irqbalance: None,
        },
    })
}

/// Containers resized in place: the runtime's config still has the request they were created
/// with, their cgroup the one they have now. As a starting agent does, the cgroup wins where
/// the two disagree, unless it still holds the kernel's defaults (a container being created,
/// whose runtime has not written its settings yet).
/// The host effects as the checkpoint records them, to read what each has in force (cgroup v2
/// without remote partitions says why load balancing is not off whatever the checkpoint
/// holds: an agent that never saw such a pod says nothing in it). Nothing is applied, so the
/// effects' own roots are the defaults; what `status` reads under `--proc-root` is passed to
/// [`StatusView::note_irqbalance`].
fn recorded_effects(
    node: &NodeView,
    recorded: &checkpoint::EffectState,
) -> Vec<Box<dyn crate::effects::Effect>> {
    let env = crate::effects::Env {
        proc_root: Path::new("/proc"),
        sysfs_root: Path::new("/sys"),
        cpuset: Some((
            node.hierarchy.cpuset.clone(),
            node.layout.version,
            node.layout.kubepods.clone(),
        )),
        cpu: Some(node.hierarchy.cpu.clone()),
        isolate_host: None,
        journal: None,
        effect_done: None,
    };
    let recorded = crate::effects::Recorded {
        checkpoint: Some(recorded),
        host: None,
    };
    crate::effects::build(&env, &recorded)
}

fn with_live_requests(node: &mut NodeView, scan: &Scan, classes: &mut [Classification]) {
    for (cgroup, class) in scan.cgroups.iter().zip(classes.iter_mut()) {
        let Some(id) = class.container_id.as_deref() else {
            continue;
        };
        if class.kind != CgroupKind::Container || at_kernel_defaults(&cgroup.cpu) {
            continue;
        }
        let Some(mut info) = node.runtime.lookup(id) else {
            continue;
        };
        if config_matches_cgroup(&cgroup.cpu, &info.cpu) != Some(false) {
            continue;
        }
        info.cpu = OciCpu::default();
        *class = classify(&node.naming, &cgroup.relative, &cgroup.cpu, Some(&info));
    }
}

/// A cgroup's CPU settings are still what the kernel made it with (v1 `cpu.shares` 1024 and
/// no quota, v2 `cpu.weight` 100 and `cpu.max` `max`).
fn at_kernel_defaults(settings: &CpuSettings) -> bool {
    match settings {
        CpuSettings::V1 {
            shares, cfs_quota, ..
        } => shares.value() == Some(&1024) && cfs_quota.value() == Some(&Quota::Unlimited),
        CpuSettings::V2 { max, weight } => {
            weight.value() == Some(&100) && max.value().map(|m| m.quota) == Some(Quota::Unlimited)
        }
    }
}

pub fn run(args: &StatusArgs) -> Result<(), CommandError> {
    // A one-shot read: what the agent says at start (the layout found) is not said here.
    if std::env::var_os("RUST_LOG").is_none() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    args.agent.validate()?;
    let mut node = args.agent.tree.open()?;
    let mut view = collect(&mut node, &args.agent.state_dir)?;
    view.note_irqbalance(&args.agent.tree.proc_root);
    view.note_projections(&args.agent.projection_dir);
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
    match view.not_running() {
        Some(why) => Err(CommandError {
            status: EXIT_NOT_RUNNING,
            message: format!("not running on {}: {why}", args.agent.state_dir.display()),
            bare: false,
        }),
        None => Ok(()),
    }
}
