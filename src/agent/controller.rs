//! The controller: the one thread that owns the agent's state and writes cgroupfs.
//!
//! It keeps a model of the kubepods tree (what the files said when last read), updates it from
//! watcher events (re-reading only the group of files an event names: the cpuset files or the
//! CPU settings) and from the reconcile thread's full scans, and after every change runs one
//! pass: classify → assign → plan → write. Classifications are cached per cgroup while its
//! CPU settings stay the same and its runtime config was found. The model takes the values the
//! pass wrote; each write comes back as an `IN_MODIFY` event whose re-read shows the value the
//! model already holds, so it causes no further pass (no repair loops), or a value someone else
//! wrote after the agent, which is drift and is repaired by the next pass.
//!
//! A pass plans the whole model, or — when only pods came, went or changed their containers
//! and nothing else waits — just those pods' chains (see [`incremental`]), with the rest of
//! the shared pool's rewrites following in a coalesced full pass.
//!
//! Reconcile merge rule: a full scan started at time T replaces every model entry last updated
//! before T; entries updated after T (by events that raced the scan) are newer and kept. A
//! reconcile that changes nothing runs no pass (see [`Controller::reconcile`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::allocator::StaticPolicy;
use crate::cgroupfs::{
    CgroupError, CgroupPath, CgroupVersion, Hierarchy, InterfaceFile, Scan, ScannedCgroup, Scanner,
    SkipReason,
};
use crate::checkpoint::kubelet_state::KubeletState;
use crate::classify::{
    classify, classify_scan_one, config_matches_cgroup, CgroupKind, CgroupNaming, Classification,
    Isolation, Notice,
};
use crate::cpuset::CpuSet;
use crate::irq::{IrqAffinity, IrqSaved};
use crate::logging::error_chain;
use crate::planner::{
    entitlement, plan, AssignEvent, Entitlement, NodeLimits, Plan, PlanConfig, Pools,
    ReleaseReason, WriteStep,
};
use crate::runtime::{OciCpu, RuntimeInfo, RuntimeLookup};
use crate::sched_balance::{SchedBalance, SchedSaved};
use crate::state::{Adoption, AssignmentKey, Assignments, ExclusiveAssignment};
use crate::topology::Topology;
use crate::watcher::TreeEvent;
use crate::writer::{apply_scheduled, NewChildren, Schedule};

use super::hotplug::Hotplug;
use super::metrics::Metrics;
use incremental::{Mode, SincePass};

mod incremental;

/// A full scan made by the reconcile thread, and when it started.
#[derive(Debug)]
pub struct ReconcileScan {
    pub started: Instant,
    pub scan: Scan,
}

/// How long a new container may wait for its CPU settings before the controller stops
/// re-reading it on its own (events still wake it).
const SETTINGS_RETRY: [Duration; 4] = [
    Duration::from_millis(5),
    Duration::from_millis(25),
    Duration::from_millis(100),
    Duration::from_millis(500),
];

/// How long a cgroup's narrowing waits, again and again, for runtimes to set up its new
/// children (to copy its cpuset into them: a read and a write, microseconds apart unless the
/// runtime is descheduled). After the last, the next event or reconcile tick tries again.
const SETTLE_DELAYS: [Duration; 6] = [
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_millis(1000),
];

/// What writing a plan showed of the model.
#[derive(Debug, Default)]
struct FollowUp {
    /// Cgroups with a child the model does not know: re-read them and plan again now.
    stale: Vec<CgroupPath>,
    /// Cgroups not narrowed while a child is set up: plan again after a [`SETTLE_DELAYS`].
    settling: Vec<CgroupPath>,
    /// A cgroup written to was gone (it left the model): plan again now.
    vanished: bool,
}

/// Plans per pass when writing shows the model out of date (see [`Controller::pass`]).
const MAX_REPLANS: usize = 4;

/// How long a cgroup with an empty cpuset is left to its runtime (runc copies the parent's set
/// within milliseconds) before the agent writes it itself.
const RUNTIME_SETUP_LIMIT: Duration = Duration::from_secs(1);

/// While new cgroups keep arriving (less than this apart), a pass makes only its urgent writes
/// (exclusive pins, drift repairs) and holds back the rest (the shared pool's rewrites), so a
/// burst of pods does not rewrite every shared cgroup once per pod.
const COALESCE_QUIET: Duration = Duration::from_millis(20);

/// Writes are held back for at most this long; after it, a pass makes at least
/// [`MIN_PROGRESS`] of them before it lets a new arrival go first. (kubelet leaves other
/// containers' cpusets to its reconcile loop, 10 s by default.)
const COALESCE_LIMIT: Duration = Duration::from_millis(200);

/// Held-back writes a pass makes before it may be preempted, once they are overdue.
const MIN_PROGRESS: usize = 32;

/// How long a new container is tracked for the event → pin latency figure.
const PIN_TRACKING_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct ModelEntry {
    cgroup: ScannedCgroup,
    updated: Instant,
    /// The classification of `cgroup`, kept while its path and CPU settings stay the same and
    /// the runtime's config was found (or is not needed). `None`: classify in the next pass.
    class: Option<Classification>,
    /// The cpus the last pass wanted here, for drift detection and pin latency.
    desired: Option<CpuSet>,
    /// Its cpuset has been seen set up: empty later means a foreign write (drift), not a
    /// runtime still at work.
    initialised: bool,
    /// What classification noticed and the log said, so a re-classification (its CPU
    /// settings written after its config was read) does not say it again.
    said: Vec<Notice>,
}

/// What the controller needs to run, besides its channels.
#[derive(Debug)]
pub struct ControllerParts {
    pub hierarchy: Hierarchy,
    pub scanner: Scanner,
    pub naming: CgroupNaming,
    pub runtime: RuntimeLookup,
    pub topology: Topology,
    pub policy: Option<StaticPolicy>,
    pub align_memory: bool,
    pub keep_cfs_quota: bool,
    /// Assignments from the checkpoint (names and intent; the live tree still wins).
    pub assignments: Assignments,
    /// CFS quotas this agent lifted, with their original values (from the checkpoint).
    pub quota_lifted: BTreeMap<CgroupPath, String>,
}

/// The outcome of one pass, for the caller's bookkeeping (checkpoint, notify).
#[derive(Debug, Default)]
pub struct PassOutcome {
    pub assignments_changed: bool,
    pub writes: usize,
    pub failed_writes: usize,
}

impl PassOutcome {
    /// This pass followed by `later` (which planned again: its failures are the ones left).
    fn then(self, later: PassOutcome) -> PassOutcome {
        PassOutcome {
            assignments_changed: self.assignments_changed | later.assignments_changed,
            writes: self.writes + later.writes,
            failed_writes: later.failed_writes,
        }
    }
}

/// More foreign changes of one cgroup's cpuset than this within [`FIGHT_WINDOW`] is a fight.
const FIGHT_DRIFTS: u32 = 10;
const FIGHT_WINDOW: Duration = Duration::from_secs(1);
/// The first wait before repairing a fought-over cgroup, doubling while the fight goes on.
const FIGHT_BACKOFF_MIN: Duration = Duration::from_millis(100);
const FIGHT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// This long without a foreign change ends a fight.
const FIGHT_QUIET: Duration = Duration::from_secs(30);

/// A cgroup whose `cpuset.cpus` someone else keeps changing.
#[derive(Debug, Clone)]
struct Fight {
    window_start: Instant,
    drifts: u32,
    last_drift: Instant,
    /// The current wait between repairs, once it is a fight.
    backoff: Option<Duration>,
    /// No repair before this.
    until: Option<Instant>,
    /// A foreign value waits for its repair.
    pending: bool,
}

impl Fight {
    /// No fight yet: a first foreign change at `now`.
    fn new(now: Instant) -> Fight {
        Fight {
            window_start: now,
            drifts: 0,
            last_drift: now,
            backoff: None,
            until: None,
            pending: false,
        }
    }
}

/// The agent's state and its one writer.
#[derive(Debug)]
pub struct Controller {
    parts: ControllerParts,
    /// Boxed: B-tree nodes hold eleven slots, mostly half empty, and an entry is large.
    model: BTreeMap<CgroupPath, Box<ModelEntry>>,
    /// Cgroups with a foreign change seen since the last pass.
    drifted: HashSet<CgroupPath>,
    /// New cgroups and when they were seen, until their cpuset is final.
    pending_pins: HashMap<CgroupPath, Instant>,
    /// Containers waiting for their CPU settings, and how many re-reads they had.
    settings_wait: HashMap<CgroupPath, usize>,
    next_retry: Option<Instant>,
    /// Cgroups whose narrowing waits for new children, and when to plan them again.
    settling: Vec<CgroupPath>,
    settle_at: Option<Instant>,
    settle_tries: usize,
    /// Containers (by id) whose cgroup has held their runtime config's CPU request, or that
    /// were running when the agent started: a difference now is an in-place resize.
    settled: HashSet<String>,
    /// Containers (by id) classified from their cgroup because they were resized.
    resized: HashSet<String>,
    /// Cgroups first seen with an empty cpuset, and when: left to their runtime for
    /// [`RUNTIME_SETUP_LIMIT`] at most.
    empty_since: HashMap<CgroupPath, Instant>,
    /// The last pass wrote all it planned and allocated all it was asked for.
    last_pass_settled: bool,
    /// Counts watcher events that should go ahead of a long rewrite (see
    /// [`crate::watcher::Watcher::arrivals`]).
    arrivals: Option<Arc<AtomicU64>>,
    /// When the last cgroup new to the model was seen.
    last_new_cgroup: Option<Instant>,
    /// The model changed since the last pass in more than drifted `cpuset.cpus` values of
    /// cgroups that pass planned (which [`Controller::pass`] writes back without planning).
    structural: bool,
    /// Since when planned writes are held back, and when to make them.
    held_since: Option<Instant>,
    flush_at: Option<Instant>,
    /// Whether a pass has run (cgroups new to the model after it are tracked for their pin).
    planned: bool,
    /// The pools of the last pass (`None` under the `none` policy).
    pools: Option<Pools>,
    /// The isolation annotations of the containers that hold exclusive cpus or ask for them.
    /// (What they ask for, and the container's cgroup.)
    isolated: HashMap<AssignmentKey, (Isolation, CgroupPath)>,
    /// What changed since the last pass, and whether an incremental pass may plan it (see
    /// [`incremental`]).
    since_pass: SincePass,
    /// The last full pass left every container's demand met: an incremental pass may plan
    /// new pods alone.
    steady: bool,
    /// After incremental passes that changed the shared pool: when its members' rewrites
    /// (a full pass) are due, and since when they are owed.
    full_due: Option<Instant>,
    full_owed_since: Option<Instant>,
    /// Cgroups on the shared pool after the last full pass: what a change of the pool rewrites.
    shared_members: usize,
    /// Bumped whenever the model changes (read or written values, cgroups coming and going):
    /// the reconcile thread does a full scan only when it moved, or every few ticks.
    generation: Arc<AtomicU64>,
    /// Whether the last full scan saw the whole tree (false past its limit): the planner
    /// releases nothing it did not see.
    complete: bool,
    /// Cgroups said to be unreadable (said once each).
    unreadable_said: HashSet<CgroupPath>,
    /// IRQ affinity failures said (once each).
    unreadable_said_irq: HashSet<String>,
    /// The node limits of the last pass (said when they change).
    last_limits: Option<NodeLimits>,
    /// Cgroups whose cpuset someone else keeps rewriting (see [`Controller::hold_off_drift`]).
    fights: HashMap<CgroupPath, Fight>,
    /// When a rescan was last said in the log, and how many were not said since.
    rescan_said: Option<Instant>,
    rescans_unsaid: u64,
    /// `namespace/pod` of pods holding exclusive CPUs, so the log can name a pod that is gone
    /// when its CPUs are released.
    pod_names: HashMap<String, String>,
    /// Interrupt affinities, kept off the CPUs of `irq-load-balancing.crio.io` pods.
    irq: Option<IrqAffinity>,
    /// Scheduler load balancing, kept off the CPUs of `cpu-load-balancing.crio.io` pods.
    sched: Option<SchedBalance>,
    /// Where the online cpus are read from while the agent runs (see [`Controller::follow_hotplug`]).
    hotplug: Option<Hotplug>,
    pub metrics: Metrics,
}

impl Controller {
    pub fn new(parts: ControllerParts) -> Self {
        let mut metrics = Metrics::default();
        metrics.online_cpus = parts.topology.all_cpus().len() as u64;
        Controller {
            parts,
            model: BTreeMap::new(),
            complete: true,
            unreadable_said: HashSet::new(),
            unreadable_said_irq: HashSet::new(),
            rescan_said: None,
            rescans_unsaid: 0,
            pod_names: HashMap::new(),
            irq: None,
            sched: None,
            hotplug: None,
            fights: HashMap::new(),
            last_limits: None,
            drifted: HashSet::new(),
            pending_pins: HashMap::new(),
            settings_wait: HashMap::new(),
            next_retry: None,
            settling: Vec::new(),
            settle_at: None,
            settle_tries: 0,
            settled: HashSet::new(),
            resized: HashSet::new(),
            empty_since: HashMap::new(),
            last_pass_settled: false,
            arrivals: None,
            last_new_cgroup: None,
            structural: true,
            held_since: None,
            flush_at: None,
            planned: false,
            pools: None,
            isolated: HashMap::new(),
            since_pass: SincePass::default(),
            steady: false,
            full_due: None,
            full_owed_since: None,
            shared_members: 0,
            generation: Arc::new(AtomicU64::new(0)),
            metrics,
        }
    }

    /// Lets passes put urgent writes first and hold back the others (the shared pool's
    /// rewrites) while new cgroups arrive, and stop a long rewrite when `counter` (the
    /// watcher's [`crate::watcher::Watcher::arrivals`]) moves: new cgroups go first. Without
    /// it (the library's default), every pass makes all its writes in plan order.
    pub fn watch_arrivals(&mut self, counter: Arc<AtomicU64>) {
        self.arrivals = Some(counter);
    }

    /// Lets [`Controller::online_cpus_changed`] follow CPU hotplug (`run` does; the library's
    /// default keeps the topology it was built with).
    pub fn follow_hotplug(&mut self, hotplug: Hotplug) {
        self.hotplug = Some(hotplug);
    }

    /// CPU hotplug, once per reconcile tick (one read of the online cpu list): when the kernel's
    /// online cpus differ from the topology's, the topology is read again and the policy
    /// rebuilt on it, said once per change and counted. The next pass plans on them: cpus gone
    /// offline leave the pools and their pins get replacements; cpus back online join the
    /// shared pool. Whether they changed (a pass is due).
    pub fn online_cpus_changed(&mut self) -> bool {
        let Some(hotplug) = self.hotplug.as_mut() else {
            return false;
        };
        let Some(change) = hotplug.check(&self.parts.topology, self.parts.policy.as_ref()) else {
            return false;
        };
        let online = change.topology.all_cpus();
        if !change.offline.is_empty() {
            log::info!(
                "cpus {} went offline (online now: {online}): topology read again; pins on them \
                 get replacements, the shared pool goes without them",
                change.offline
            );
        }
        if !change.online.is_empty() {
            log::info!(
                "cpus {} came online (online now: {online}): topology read again; they join the \
                 shared pool",
                change.online
            );
        }
        if let (Some(before), Some(after)) = (&self.parts.policy, &change.policy) {
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
        self.metrics.cpus_offlined += change.offline.len() as u64;
        self.metrics.cpus_onlined += change.online.len() as u64;
        self.metrics.online_cpus = online.len() as u64;
        self.parts.topology = change.topology;
        if change.policy.is_some() {
            self.parts.policy = change.policy;
        }
        self.structural = true;
        self.bump();
        true
    }

    /// The model's change counter, shared with the reconcile thread.
    pub fn generation(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.generation)
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn assignments(&self) -> &Assignments {
        &self.parts.assignments
    }

    /// CFS quotas lifted by this agent and their original values, for `reset`.
    pub fn quota_lifted(&self) -> &BTreeMap<CgroupPath, String> {
        &self.parts.quota_lifted
    }

    /// How many containers' runtime configs are cached (those in the tree).
    pub fn cached_runtime_configs(&self) -> usize {
        self.parts.runtime.cached()
    }

    pub fn policy(&self) -> Option<&StaticPolicy> {
        self.parts.policy.as_ref()
    }

    pub fn topology(&self) -> &Topology {
        &self.parts.topology
    }

    /// The shared pool after the last pass.
    pub fn shared_pool(&self) -> Option<&CpuSet> {
        self.pools.as_ref().map(|p| &p.shared)
    }

    /// (containers, exclusive containers) after the last pass.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.metrics.containers as usize,
            self.parts.assignments.len(),
        )
    }

    /// Makes the writes a later pass owes (the shared pool's rewrites after incremental passes,
    /// writes held back during a burst) now: before the agent stops, so the tree it leaves is
    /// the tree its checkpoint describes.
    pub fn finish_owed(&mut self, now: Instant) -> Option<PassOutcome> {
        if self.full_due.is_none() && self.flush_at.is_none() {
            return None;
        }
        self.flush_at = None;
        self.since_pass.other = true;
        // Every write, in plan order: nothing held back for arrivals now.
        let arrivals = self.arrivals.take();
        let outcome = self.pass(now);
        self.arrivals = arrivals;
        Some(outcome)
    }

    /// When the controller wants to re-read containers still waiting for CPU settings, or
    /// cgroups whose narrowing waits for new children to be set up.
    pub fn next_retry(&self) -> Option<Instant> {
        let fight = self
            .fights
            .values()
            .filter(|f| f.pending)
            .filter_map(|f| f.until)
            .min();
        [
            self.next_retry,
            self.settle_at,
            self.flush_at,
            self.full_due,
            fight,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Migration from kubelet's static policy (before the first pass): each pin kubelet's
    /// checkpoint names is adopted when its container runs on exactly those CPUs; a pin the
    /// live tree contradicts is said and left to the live tree (which wins), one whose
    /// container is not running is said and skipped. Returns how many were adopted.
    pub fn adopt_kubelet_pins(&mut self, kubelet: &KubeletState) -> usize {
        let scan = self.model_scan();
        let classes = self.classify_model(&scan);
        // The running containers: by assignment key, and the key by container id (kubelet's
        // legacy v1 format names containers by id).
        let mut live: HashMap<AssignmentKey, (Option<String>, Option<CpuSet>)> = HashMap::new();
        let mut by_id: HashMap<String, AssignmentKey> = HashMap::new();
        for (cgroup, class) in scan.cgroups.iter().zip(&classes) {
            if class.kind != CgroupKind::Container {
                continue;
            }
            let Some(key) = class.assignment_key() else {
                continue;
            };
            if let Some(id) = &class.container_id {
                by_id.insert(id.clone(), key.clone());
            }
            live.insert(
                key,
                (class.container_id.clone(), cgroup.cpus.value().cloned()),
            );
        }
        let mut wanted: Vec<(AssignmentKey, &CpuSet)> = kubelet
            .entries
            .iter()
            .map(|(k, c)| (k.clone(), c))
            .collect();
        for (id, cpus) in &kubelet.legacy_entries {
            match by_id.get(id) {
                Some(key) => wanted.push((key.clone(), cpus)),
                None => log::info!(
                    "kubelet's cpu_manager_state: container {id} (cpus {cpus}) is not running: nothing to adopt"
                ),
            }
        }
        self.learn_pod_names(wanted.iter().map(|(k, _)| k), &classes);
        let mut adopted = 0;
        for (key, cpus) in wanted {
            let label = self.label(&key);
            match live.get(&key) {
                None => log::info!(
                    "kubelet's cpu_manager_state: {label} (cpus {cpus}) is not running: nothing to adopt"
                ),
                Some((id, Some(current))) if current == cpus => {
                    let assignment = ExclusiveAssignment {
                        cpus: cpus.clone(),
                        container_id: id.clone(),
                        adopted: Some(Adoption::Kubelet),
                        wanted: None,
                    };
                    match self.parts.assignments.insert(key, assignment) {
                        Ok(()) => adopted += 1,
                        Err(e) => log::warn!("kubelet's cpu_manager_state: {label}: {e}; not adopted"),
                    }
                }
                Some((_, current)) => log::warn!(
                    "kubelet's cpu_manager_state gives {label} cpus {cpus}, but it runs on {}: the live tree wins",
                    current.as_ref().map_or_else(|| "an unreadable set".to_string(), |c| c.to_string())
                ),
            }
        }
        adopted
    }

    /// Manages interrupt affinities from now on (`saved`: what an earlier run changed).
    pub fn manage_irqs(&mut self, irq: IrqAffinity) {
        self.metrics.irq_isolated_cpus = irq.saved().banned.len() as u64;
        self.metrics.irqbalance_banned_cpus = irq
            .saved()
            .irqbalance
            .as_ref()
            .map_or(0, |told| told.banned.len() as u64);
        self.irq = Some(irq);
    }

    /// What the IRQ affinities need to be restored (for the checkpoint).
    pub fn irq_saved(&self) -> IrqSaved {
        self.irq
            .as_ref()
            .map(|i| i.saved().clone())
            .unwrap_or_default()
    }

    /// The CPUs of exclusive containers whose pod asks for no interrupts.
    fn irq_isolated_cpus(&self) -> CpuSet {
        let mut cpus = CpuSet::new();
        for (key, _) in self.isolated.iter().filter(|(_, (i, _))| i.no_irqs) {
            if let Some(held) = self.parts.assignments.get(key) {
                cpus.extend_from(&held.cpus);
            }
        }
        cpus
    }

    /// Re-applies the interrupt settings on a reconcile tick that found the tree unchanged
    /// (IRQs registered since, moved back by someone else, a restarted irqbalance). Nothing to
    /// do, and nothing read, while no pod asks for it. Returns whether what is to be restored
    /// changed (the checkpoint must say so).
    pub fn refresh_irqs(&mut self) -> bool {
        let before = self.irq.as_ref().map(|i| i.saved().clone());
        self.update_irqs(true);
        self.irq.as_ref().map(|i| i.saved().clone()) != before
    }

    /// Keeps interrupts off the CPUs that ask for it: after a pass when that set changed,
    /// and on every full reconcile (`always`: IRQs registered since, or moved back by
    /// someone else).
    fn update_irqs(&mut self, always: bool) {
        let banned = self.irq_isolated_cpus();
        let Some(irq) = self.irq.as_mut() else {
            return;
        };
        let changed = irq.saved().banned != banned;
        if !always && !changed {
            return;
        }
        let outcome = irq.apply(&banned);
        if changed {
            log::info!(
                "device interrupts kept off cpus {}: {} affinity file(s) written, {} IRQ(s) the kernel would not move, {} with no other cpu",
                if banned.is_empty() { "none".to_string() } else { banned.to_string() },
                outcome.written,
                outcome.unchangeable,
                outcome.no_other_cpu
            );
        }
        match &outcome.irqbalance_news {
            Some((true, line)) => log::warn!("{line}"),
            Some((false, line)) => log::info!("{line}"),
            None => {}
        }
        for error in &outcome.errors {
            if self.unreadable_said_irq.insert(error.clone()) {
                log::warn!("cannot change an interrupt's affinity: {error} (with the systemd unit, install its irq drop-in)");
            }
        }
        self.metrics.irq_isolated_cpus = banned.len() as u64;
        self.metrics.irq_affinity_writes += outcome.written as u64;
        self.metrics.irq_unchangeable = outcome.unchangeable as u64;
        self.metrics.irqbalance_banned_cpus = irq
            .saved()
            .irqbalance
            .as_ref()
            .map_or(0, |told| told.banned.len() as u64);
    }

    /// Manages scheduler load balancing from now on (`sched`: with what an earlier run changed).
    pub fn manage_sched_balance(&mut self, sched: SchedBalance) {
        self.metrics.sched_isolated_cpus = sched.saved().isolated.len() as u64;
        self.sched = Some(sched);
    }

    /// What the scheduler load balancing changes need to be restored (for the checkpoint).
    pub fn sched_saved(&self) -> SchedSaved {
        self.sched
            .as_ref()
            .map(|s| s.saved().clone())
            .unwrap_or_default()
    }

    /// Keeps load balancing off the CPUs of exclusive containers whose pod asks for it (see
    /// [`SchedBalance::update`]): after a pass when they changed, and on every full reconcile.
    fn update_sched_balance(&mut self, always: bool) {
        if self.sched.is_none() {
            return;
        }
        let mut wanted = Vec::new();
        for (key, (_, path)) in self
            .isolated
            .iter()
            .filter(|(_, (i, _))| i.no_load_balancing)
        {
            if let Some(held) = self.parts.assignments.get(key) {
                wanted.push((path.clone(), held.cpus.clone()));
            }
        }
        wanted.sort();
        let Some(sched) = self.sched.as_mut() else {
            return;
        };
        if let Some(outcome) = sched.update(&wanted, always) {
            self.metrics.sched_balance_writes += outcome.written as u64;
        }
        self.metrics.sched_isolated_cpus = sched.saved().isolated.len() as u64;
    }

    /// Reads the whole tree into the model (at start, and after a watcher overflow).
    pub fn full_scan(&mut self) -> Result<(), CgroupError> {
        let started = Instant::now();
        let scan = self.parts.scanner.scan()?;
        self.merge_scan(ReconcileScan { started, scan });
        Ok(())
    }

    /// A full scan now, then [`Self::reconcile`] (SIGHUP).
    pub fn rescan(&mut self) -> Result<Option<PassOutcome>, CgroupError> {
        let started = Instant::now();
        let scan = self.parts.scanner.scan()?;
        Ok(self.reconcile(ReconcileScan { started, scan }, Instant::now()))
    }

    /// Merges a full scan: entries last updated before the scan started are replaced or, when
    /// the scan did not see them, dropped; entries updated since (by events that raced the
    /// scan) are newer and kept.
    /// Returns whether the model changed.
    pub fn merge_scan(&mut self, reconcile: ReconcileScan) -> bool {
        let ReconcileScan { started, scan } = reconcile;
        let seen: HashSet<&CgroupPath> = scan.cgroups.iter().map(|c| &c.path).collect();
        // What the scan could not open or list is not gone: its entries (and what they hold)
        // stay as last read. A scan stopped at its limit says nothing of what it did not see.
        let unreadable: Vec<&CgroupPath> = scan
            .skipped
            .iter()
            .filter(|s| s.reason == SkipReason::Unlistable)
            .map(|s| &s.path)
            .collect();
        self.complete = scan.complete;
        let gone: Vec<CgroupPath> = self
            .model
            .iter()
            .filter(|(p, e)| {
                scan.complete
                    && !seen.contains(p)
                    && e.updated <= started
                    && !unreadable.iter().any(|u| p.strip_prefix(u).is_some())
            })
            .map(|(p, _)| p.clone())
            .collect();
        let mut changed = !gone.is_empty();
        self.since_pass.other |= changed;
        for path in &gone {
            self.forget(path);
        }
        for cgroup in scan.cgroups {
            if self
                .model
                .get(&cgroup.path)
                .is_some_and(|e| e.updated > started)
            {
                continue;
            }
            changed |= self.upsert(cgroup, started);
        }
        changed
    }

    /// A reconcile: merges a full scan and runs a pass unless it would change nothing — the
    /// model is as the last pass left it, that pass wrote everything it planned, every
    /// container's runtime config was found (a missing one is looked for again) and no
    /// allocation failed (it is retried), and nothing waits: no narrowing for new children to
    /// settle, no empty cpuset left to its runtime, no container waiting for its settings.
    /// Returns the pass run, if any.
    pub fn reconcile(&mut self, reconcile: ReconcileScan, now: Instant) -> Option<PassOutcome> {
        let changed = self.merge_scan(reconcile) | self.limits_moved() | self.online_cpus_changed();
        let settled = !changed
            && self.drifted.is_empty()
            && self.last_pass_settled
            && self.full_due.is_none()
            && self.settling.is_empty()
            && self.empty_since.is_empty()
            && self.settings_wait.is_empty()
            && self.model.values().all(|e| e.class.is_some());
        if settled {
            self.metrics.skipped_passes += 1;
            self.update_irqs(true);
            self.update_sched_balance(true);
            return None;
        }
        let outcome = self.pass(now);
        self.update_irqs(true);
        self.update_sched_balance(true);
        Some(outcome)
    }

    /// Applies one watcher event to the model. Returns whether the model changed.
    pub fn apply_event(&mut self, event: TreeEvent, now: Instant) -> Result<bool, CgroupError> {
        match event {
            TreeEvent::Created { cgroup } => {
                let scan = self.parts.scanner.scan_subtree(&cgroup);
                let mut changed = false;
                for c in scan.cgroups {
                    changed |= self.upsert(c, now);
                }
                Ok(changed)
            }
            TreeEvent::Removed { cgroup } => Ok(self.removed(&cgroup)),
            // Only the named file's group is re-read (see `Scanner::refresh`).
            TreeEvent::Modified { cgroup, file } => {
                let known = self.model.get(&cgroup).map(|e| e.cgroup.clone());
                let read = match known {
                    Some(mut c) => self.parts.scanner.refresh(&mut c, file).then_some(c),
                    None => self.parts.scanner.read_cgroup(&cgroup),
                };
                match read {
                    Some(c) => Ok(self.upsert(c, now)),
                    None => Ok(self.remove_if_gone(&cgroup)),
                }
            }
            TreeEvent::Rescan { reason } => {
                // Said at most once a minute, with how many were not said.
                let due = self
                    .rescan_said
                    .is_none_or(|at| now.saturating_duration_since(at) >= Duration::from_secs(60));
                if due {
                    let more = std::mem::take(&mut self.rescans_unsaid);
                    let since = if more > 0 {
                        format!(" ({more} more rescans since the last time this was said)")
                    } else {
                        String::new()
                    };
                    log::warn!("watcher lost track ({reason}): rescanning the whole tree{since}");
                    self.rescan_said = Some(now);
                } else {
                    self.rescans_unsaid += 1;
                    log::debug!("watcher lost track ({reason}): rescanning the whole tree");
                }
                self.metrics.rescans += 1;
                self.full_scan()?;
                Ok(true)
            }
        }
    }

    /// Re-reads containers still waiting for their CPU settings, and, once due, the cgroups
    /// whose narrowing waited for new children. Returns whether a pass is needed.
    pub fn retry_settings(&mut self, now: Instant) -> bool {
        self.next_retry = None;
        let mut changed = false;
        if self.flush_at.is_some_and(|t| t <= now) {
            // Held-back writes are due.
            self.flush_at = None;
            changed = true;
        }
        if self.full_due.is_some_and(|t| t <= now) {
            // The shared pool's members, after incremental passes: a full pass (after the
            // pins of pods that arrived meanwhile, see `pass`).
            changed = true;
        }
        if self.settle_at.is_some_and(|t| t <= now) {
            // Only retries that find the tree still unsettled wait longer next time.
            self.settle_at = None;
            self.settle_tries += 1;
            for root in std::mem::take(&mut self.settling) {
                self.rescan_subtree(&root, now);
            }
            changed = true;
        }
        changed |= self.resume_fights(now);
        let waiting: Vec<CgroupPath> = self.settings_wait.keys().cloned().collect();
        for path in waiting {
            match self.parts.scanner.read_cgroup(&path) {
                Some(c) => changed |= self.upsert(c, now),
                None => changed |= self.remove_if_gone(&path),
            }
        }
        changed
    }

    /// Puts what was read of a cgroup into the model. A cgroup new to it after the first pass
    /// (by whichever way it was seen first: its event, in either v1 hierarchy, or a scan) is
    /// tracked for the event-to-pin latency from `now`.
    fn upsert(&mut self, mut cgroup: ScannedCgroup, now: Instant) -> bool {
        let path = cgroup.path.clone();
        // A cgroup someone keeps rewriting is repaired at a backed-off pace: meanwhile its
        // foreign value is not taken into the model (so no pass rewrites it either).
        if let (Some(desired), Some(now_cpus)) = (self.desired(&path), cgroup.cpus.configured()) {
            if desired != now_cpus && !now_cpus.is_empty() && self.hold_off_drift(&path, now) {
                if let Some(entry) = self.model.get(&path) {
                    cgroup.cpus = entry.cgroup.cpus.clone();
                }
            }
        }
        let pure_drift = self.model.get(&path).is_some_and(|e| {
            e.cgroup.relative == cgroup.relative
                && e.cgroup.cpu == cgroup.cpu
                && e.cgroup.mems == cgroup.mems
        }) && self.desired(&path).is_some_and(|desired| {
            cgroup
                .cpus
                .configured()
                .is_some_and(|now| now != desired && !now.is_empty())
        });
        if !pure_drift
            && !self
                .model
                .get(&path)
                .is_some_and(|e| e.cgroup.same_settings(&cgroup))
        {
            self.structural = true;
        }
        match self.model.get_mut(&path) {
            Some(entry) if entry.cgroup.same_settings(&cgroup) => {
                // Keep the kernel's latest derived values; nothing to plan.
                entry.cgroup.effective_cpus = cgroup.effective_cpus;
                return false;
            }
            Some(_) => {}
            None if self.planned => {
                self.pending_pins.entry(path.clone()).or_insert(now);
                self.last_new_cgroup = Some(now);
            }
            None => {}
        }
        if let (Some(desired), Some(now_cpus)) = (self.desired(&path), cgroup.cpus.configured()) {
            if desired != now_cpus {
                self.drifted.insert(path.clone());
            }
        }
        if !self.model.contains_key(&path) {
            self.since_pass.new.insert(path.clone());
        } else if !self.since_pass.new.contains(&path) {
            // Re-read with other values (a runtime writing a container's CPU settings after
            // making its cgroup, a resize): its pod's chain is planned again (a cgroup outside
            // any pod makes the pass a full one; drift is repaired on its own).
            self.since_pass.touched.insert(path.clone());
        }
        self.set_entry(path, cgroup, now);
        true
    }

    /// Stores what was read of a cgroup; its cached classification survives when its CPU
    /// settings did not change (a cpuset write does not change how it is classified).
    fn set_entry(&mut self, path: CgroupPath, cgroup: ScannedCgroup, now: Instant) {
        self.bump();
        match self.model.get_mut(&path) {
            Some(entry) => {
                if entry.cgroup.cpu != cgroup.cpu || entry.cgroup.relative != cgroup.relative {
                    entry.class = None;
                }
                entry.cgroup = cgroup;
                entry.updated = now;
            }
            None => {
                self.model.insert(
                    path,
                    Box::new(ModelEntry {
                        cgroup,
                        updated: now,
                        class: None,
                        desired: None,
                        initialised: false,
                        said: Vec::new(),
                    }),
                );
            }
        }
    }

    /// The cpus the last pass wanted for `path`.
    fn desired(&self, path: &CgroupPath) -> Option<&CpuSet> {
        self.model.get(path).and_then(|e| e.desired.as_ref())
    }

    /// A cgroup that could not be read leaves the model only when it is gone (ENOENT): an
    /// unreadable one (EACCES, EMFILE …) keeps its entry, and so its assignment, until it can
    /// be read again or is gone.
    fn remove_if_gone(&mut self, root: &CgroupPath) -> bool {
        if self.parts.hierarchy.cpuset.is_gone(root) {
            return self.removed(root);
        }
        if self.unreadable_said.insert(root.clone()) {
            log::warn!(
                "cg={root} cannot be read (not gone): what it holds stays its own; make it \
                 readable by root without capabilities (the unit has none)"
            );
        }
        false
    }

    /// Forgets `root` and its subtree; the next pass is a full one.
    fn remove_subtree(&mut self, root: &CgroupPath) -> bool {
        let removed = self.forget_subtree(root);
        self.since_pass.other |= removed;
        removed
    }

    fn forget_subtree(&mut self, root: &CgroupPath) -> bool {
        let doomed = self.subtree(root);
        for path in &doomed {
            self.forget(path);
        }
        !doomed.is_empty()
    }

    /// `root` and every model path below it, in model order.
    fn subtree(&self, root: &CgroupPath) -> Vec<CgroupPath> {
        // Paths order bytewise, so a sibling such as `…/sub-2` sorts between `…/sub` and
        // `…/sub/x`: walk every path that starts with the root's bytes, keep the descendants.
        self.model
            .range(root.clone()..)
            .take_while(|(p, _)| p.as_bytes().starts_with(root.as_bytes()))
            .filter(|(p, _)| p.strip_prefix(root).is_some())
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Per scanned cgroup: whether an empty cpuset there is drift rather than a runtime still
    /// setting it up (it was seen set up before, or has been empty for too long).
    fn initialised(&mut self, scan: &Scan, now: Instant) -> Vec<bool> {
        let model = &mut self.model;
        scan.cgroups
            .iter()
            .map(|c| {
                let empty = c.cpus.value().is_some_and(|v| v.is_empty())
                    || c.mems.value().is_some_and(|v| v.is_empty());
                let entry = model.get_mut(&c.path);
                if !empty {
                    if let Some(entry) = entry {
                        entry.initialised = true;
                    }
                    if !self.empty_since.is_empty() {
                        self.empty_since.remove(&c.path);
                    }
                    return true;
                }
                if entry.is_some_and(|e| e.initialised) {
                    return true;
                }
                let since = *self.empty_since.entry(c.path.clone()).or_insert(now);
                now.saturating_duration_since(since) >= RUNTIME_SETUP_LIMIT
            })
            .collect()
    }

    fn forget(&mut self, path: &CgroupPath) {
        self.bump();
        self.structural = true;
        self.since_pass.new.remove(path);
        self.since_pass.touched.remove(path);
        // A container whose cgroup is gone asks for no isolation.
        self.isolated.retain(|_, (_, p)| p != path);
        let class = self.model.remove(path).and_then(|e| e.class);
        if class
            .as_ref()
            .is_some_and(|c| c.kind == CgroupKind::Container)
        {
            self.metrics.containers = self.metrics.containers.saturating_sub(1);
        }
        if let Some(id) = class.and_then(|c| c.container_id) {
            self.parts.runtime.forget(&id);
            self.settled.remove(&id);
            self.resized.remove(&id);
        }
        self.empty_since.remove(path);
        self.unreadable_said.remove(path);
        self.fights.remove(path);
        self.parts.quota_lifted.remove(path);
        self.pending_pins.remove(path);
        self.settings_wait.remove(path);
        self.drifted.remove(path);
    }

    /// One pass over the model: classify, assign, plan, write (the model takes what was
    /// written). The pass is planned again (a few times at most) when writing showed the model out of date:
    /// a cgroup it was to narrow has a child the model does not know yet (that subtree is
    /// re-read first), or a cgroup written to is gone (it left the model, and what it held,
    /// an exclusive set perhaps, must be released now: its own removal event finds nothing
    /// left to do).
    ///
    /// On cgroup v1 a cgroup whose children are being set up by their runtime is narrowed by a
    /// pass a moment later (see [`NewChildren::LetThemSettle`]).
    pub fn pass(&mut self, now: Instant) -> PassOutcome {
        if let Some(outcome) = self.repair_drift() {
            return outcome;
        }
        // New pods' pins first, also when the shared pool's rewrites are due now.
        if let Some(outcome) = self.incremental_pass(now) {
            if self.full_due.is_none_or(|t| t > now) {
                return outcome;
            }
            return outcome.then(self.full_pass(now));
        }
        self.full_pass(now)
    }

    /// A pass over the whole model (see [`Controller::pass`]).
    fn full_pass(&mut self, now: Instant) -> PassOutcome {
        self.structural = false;
        self.since_pass = SincePass::default();
        self.full_due = None;
        self.full_owed_since = None;
        let mut outcome = PassOutcome::default();
        for replan in 1..=MAX_REPLANS {
            let (this, follow_up) = self.pass_once(now);
            outcome.assignments_changed |= this.assignments_changed;
            outcome.writes += this.writes;
            outcome.failed_writes = this.failed_writes;
            let mut settling = follow_up.settling;
            let again = !follow_up.stale.is_empty() || follow_up.vanished;
            let last = replan == MAX_REPLANS;
            if again && last {
                // The tree keeps changing under this pass (runtimes setting up cgroups one
                // after the other): plan again a moment later, as for new children.
                log::debug!("the tree still changes after {MAX_REPLANS} plans: again later");
                settling.extend(follow_up.stale.iter().cloned());
            }
            let later = !settling.is_empty() || (again && last);
            self.settling = settling;
            self.settle_at = None;
            if !later {
                self.settle_tries = 0;
            } else if let Some(delay) = SETTLE_DELAYS.get(self.settle_tries) {
                self.settle_at = Some(Instant::now() + *delay);
            }
            if !again || last {
                break;
            }
            for root in follow_up.stale {
                self.rescan_subtree(&root, now);
            }
        }
        // After the pins: interrupts are the second step of isolating a CPU.
        self.update_irqs(false);
        self.update_sched_balance(false);
        outcome
    }

    /// Drift repair without planning: when the only change since a pass that wrote all it
    /// planned is foreign `cpuset.cpus` values in cgroups it planned, the plan is unchanged
    /// (it does not depend on those values), and they get its values back: parents first (a
    /// foreign narrowing of a parent took its children along). `None`: plan instead (also
    /// when a write fails: the pass sorts it out).
    fn repair_drift(&mut self) -> Option<PassOutcome> {
        if self.structural
            || self.drifted.is_empty()
            || !self.last_pass_settled
            || self.held_since.is_some()
            || self.full_due.is_some()
            || !self.settling.is_empty()
        {
            return None;
        }
        let mut paths: Vec<CgroupPath> = self.drifted.iter().cloned().collect();
        paths.sort_by_key(|p| p.components().count());
        let mut outcome = PassOutcome::default();
        for path in paths {
            let desired = self.desired(&path)?.to_string();
            let written =
                self.parts
                    .hierarchy
                    .cpuset
                    .write(&path, InterfaceFile::CpusetCpus, &desired);
            self.metrics.writes_issued += 1;
            if written.is_err() {
                return None;
            }
            outcome.writes += 1;
            self.metrics.drift_repairs += 1;
            self.drifted.remove(&path);
            if let Some(entry) = self.model.get_mut(&path) {
                entry
                    .cgroup
                    .assume_written(InterfaceFile::CpusetCpus, &desired);
            }
            self.bump();
        }
        Some(outcome)
    }

    /// cgroup v1: sets `cgroup.clone_children` on kubepods, the QoS directories and the pod
    /// directories (new ones inherit it), so the kernel gives every new cgroup its parent's
    /// cpuset at `mkdir`, atomically with respect to the agent's writes. A runtime then finds
    /// the new cgroup set up and copies nothing: there is no window in which it copies a
    /// parent's set that the agent narrows before the copy lands (runc's `copyIfNeeded`, which
    /// then fails with EACCES). Files that are not there (fake trees) are skipped.
    pub fn clone_cpusets_at_creation(&mut self) {
        if self.parts.hierarchy.version != CgroupVersion::V1 {
            return;
        }
        let kubepods = self.parts.scanner.kubepods().clone();
        let cpuset = &self.parts.hierarchy.cpuset;
        let mut failed = None;
        for path in self.model.keys() {
            if path
                .strip_prefix(&kubepods)
                .is_none_or(|rel| rel.depth() > 2)
            {
                continue;
            }
            let file = InterfaceFile::CgroupCloneChildren;
            if cpuset.read(path, file).is_ok_and(|v| v == "1") {
                continue;
            }
            match cpuset.write(path, file, "1") {
                Ok(()) => {}
                Err(e) if e.is_gone() => {}
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            log::warn!(
                "{}: new cgroups start empty and their runtime copies the parent's cpuset, which \
                 can race a narrowing",
                error_chain(&e)
            );
        }
    }

    /// Whether what kubepods' parent gives pods changed since the last pass (the parent is
    /// not watched: every reconcile tick looks).
    pub fn limits_moved(&self) -> bool {
        if !self.planned {
            return false;
        }
        let (cpus, mems) = self.parts.scanner.kubepods_parent_limits();
        self.last_limits.as_ref() != Some(&NodeLimits { cpus, mems })
    }

    /// What kubepods' parent lets pods have now (one read of its effective sets a pass): CPUs
    /// taken offline (the kernel drops them from every effective set) or held back by the
    /// parent are never planned nor written. Said when it changes.
    fn node_limits(&mut self) -> NodeLimits {
        let (cpus, mems) = self.parts.scanner.kubepods_parent_limits();
        let limits = NodeLimits { cpus, mems };
        if self.last_limits.as_ref() != Some(&limits) {
            if let Some(cpus) = &limits.cpus {
                let all = self.parts.topology.all_cpus();
                let missing = all.difference(cpus);
                // Against today's topology: cpus the parent lost by going offline were not
                // given back when the topology lost them too.
                let missed = self
                    .last_limits
                    .as_ref()
                    .and_then(|l| l.cpus.as_ref())
                    .is_some_and(|last| !all.is_subset(last));
                if !missing.is_empty() {
                    log::warn!(
                        "the parent of the kubepods cgroup gives pods only cpus {cpus} now: cpus \
                         {missing} (offline, or held back by the parent) are not planned"
                    );
                } else if missed {
                    log::info!("the parent of the kubepods cgroup gives pods every cpu again");
                }
            }
            self.last_limits = Some(limits.clone());
        }
        limits
    }

    /// Records a foreign change of `path`'s `cpuset.cpus`; whether its repair must wait. More
    /// than [`FIGHT_DRIFTS`] within [`FIGHT_WINDOW`] is a fight with another writer (a second
    /// CPU manager, a tuning daemon): it is said once, counted, and from then on each repair
    /// waits a backoff that doubles (from [`FIGHT_BACKOFF_MIN`] to [`FIGHT_BACKOFF_MAX`]) while
    /// the writer goes on; [`FIGHT_QUIET`] without a foreign change ends the fight.
    fn hold_off_drift(&mut self, path: &CgroupPath, now: Instant) -> bool {
        let fight = self
            .fights
            .entry(path.clone())
            .or_insert_with(|| Fight::new(now));
        if now.saturating_duration_since(fight.last_drift) > FIGHT_QUIET {
            *fight = Fight::new(now);
        }
        fight.last_drift = now;
        if fight.until.is_some_and(|until| now < until) {
            fight.pending = true;
            return true;
        }
        fight.until = None;
        fight.pending = false;
        if let Some(backoff) = fight.backoff {
            // Still fighting: repair now, and wait longer before the next repair.
            let next = (backoff * 2).min(FIGHT_BACKOFF_MAX);
            fight.backoff = Some(next);
            fight.until = Some(now + next);
            return false;
        }
        if now.saturating_duration_since(fight.window_start) > FIGHT_WINDOW {
            fight.window_start = now;
            fight.drifts = 0;
        }
        fight.drifts += 1;
        if fight.drifts > FIGHT_DRIFTS {
            fight.backoff = Some(FIGHT_BACKOFF_MIN);
            fight.until = Some(now + FIGHT_BACKOFF_MIN);
            self.metrics.drift_fights += 1;
            log::warn!(
                "cg={path}: its cpuset.cpus was changed by someone else more than \
                 {FIGHT_DRIFTS} times within {FIGHT_WINDOW:?} (another cpu manager or tuning \
                 daemon?): repaired at most every {FIGHT_BACKOFF_MIN:?} to {FIGHT_BACKOFF_MAX:?} \
                 while this goes on; find the other writer and stop it"
            );
        }
        false
    }

    /// Fights whose backoff has ended with a foreign value not yet repaired: the cgroup is read
    /// again (and so repaired); fights long quiet are forgotten. Whether the model changed.
    fn resume_fights(&mut self, now: Instant) -> bool {
        self.fights
            .retain(|_, f| f.pending || now.saturating_duration_since(f.last_drift) <= FIGHT_QUIET);
        let due: Vec<CgroupPath> = self
            .fights
            .iter()
            .filter(|(_, f)| f.pending && f.until.is_some_and(|u| u <= now))
            .map(|(p, _)| p.clone())
            .collect();
        let mut changed = false;
        for path in due {
            if let Some(fight) = self.fights.get_mut(&path) {
                fight.pending = false;
            }
            match self.parts.scanner.read_cgroup(&path) {
                Some(c) => changed |= self.upsert(c, now),
                None => changed |= self.remove_if_gone(&path),
            }
        }
        changed
    }

    /// Reads a subtree again into the model.
    fn rescan_subtree(&mut self, root: &CgroupPath, now: Instant) {
        for cgroup in self.parts.scanner.scan_subtree(root).cgroups {
            self.upsert(cgroup, now);
        }
    }

    /// One plan and its writes, and what they showed of the model.
    fn pass_once(&mut self, now: Instant) -> (PassOutcome, FollowUp) {
        let scan = self.model_scan();
        let classes = self.classify_model(&scan);
        let limits = self.node_limits();
        self.plan_and_write(now, scan, classes, limits, Mode::Full)
    }

    /// What the planner is given besides the tree.
    fn plan_config<'a>(&'a self, limits: &'a NodeLimits) -> PlanConfig<'a> {
        PlanConfig {
            topology: &self.parts.topology,
            policy: self.parts.policy.as_ref(),
            align_memory: self.parts.align_memory,
            keep_cfs_quota: self.parts.keep_cfs_quota,
            limits: Some(limits),
        }
    }

    /// Plans `scan` (the whole model, or an incremental pass's chain) and makes its writes.
    fn plan_and_write(
        &mut self,
        now: Instant,
        scan: Scan,
        classes: Vec<Classification>,
        limits: NodeLimits,
        mode: Mode,
    ) -> (PassOutcome, FollowUp) {
        #[cfg(debug_assertions)]
        let before = self.parts.assignments.clone();
        let mut planned = plan(
            &scan,
            &classes,
            &self.parts.assignments,
            &self.plan_config(&limits),
        );
        // An incremental pass writes in its pods, and widens their ancestors (top-down, before
        // the pods: a pool that grew reaches a new pod through them); the ancestors'
        // narrowings (the shared pool's) wait for the full pass, with the rest of the pool's
        // members, whose sets hold them up.
        if !mode.is_full() {
            let all = planned.writes.len();
            planned
                .writes
                .retain(|w| w.step == WriteStep::Widen || mode.owns(&w.path));
            self.metrics.writes_held_back += (all - planned.writes.len()) as u64;
            #[cfg(debug_assertions)]
            self.assert_chain_is_full_plan(&before, &scan, &planned, &limits, &mode);
        }
        self.log_events(&planned.events, &classes);
        // Containers entitled to exclusive cpus, and short ones (which may not know their
        // entitlement but remember it).
        let asking: HashSet<AssignmentKey> = classes
            .iter()
            .filter(|c| c.exclusive_cpus() > 0)
            .filter_map(Classification::assignment_key)
            .chain(
                planned
                    .assignments
                    .iter()
                    .filter(|(_, a)| a.wanted.is_some())
                    .map(|(k, _)| k.clone()),
            )
            .collect();
        if mode.is_full() {
            self.metrics.retain_pin_failures(|k| asking.contains(k));
        }

        // Urgent writes: a cgroup's that gets exclusive cpus (a pin), and drift repairs; the
        // others (the shared pool's rewrites) may be held back while new cgroups arrive.
        let shared = planned.pools.as_ref().map(|p| &p.shared);
        let urgent_cgroup: Vec<bool> = scan
            .cgroups
            .iter()
            .zip(&planned.desired)
            .map(|(cgroup, desired)| {
                let pinned = match (&desired.cpus, shared) {
                    (Some(cpus), Some(shared)) => !cpus.is_empty() && cpus.is_disjoint(shared),
                    _ => false,
                };
                pinned || self.drifted.contains(&cgroup.path)
            })
            .collect();
        let urgent: Vec<bool> = planned
            .writes
            .iter()
            .map(|w| urgent_cgroup.get(w.cgroup).copied().unwrap_or(false))
            .collect();
        let bursting = self
            .last_new_cgroup
            .is_some_and(|t| now.saturating_duration_since(t) < COALESCE_QUIET);
        let overdue = self
            .held_since
            .is_some_and(|t| now.saturating_duration_since(t) >= COALESCE_LIMIT);
        let arrivals = self.arrivals.clone();
        let seen = arrivals.as_ref().map(|a| a.load(Ordering::Acquire));
        let preempt = move || {
            arrivals
                .as_ref()
                .is_some_and(|a| Some(a.load(Ordering::Acquire)) != seen)
        };
        let schedule = if self.arrivals.is_some() && mode.is_full() {
            Schedule {
                urgent: Some(&urgent),
                urgent_only: bursting && !overdue,
                preempt: Some(&preempt),
                preempt_after: if overdue { MIN_PROGRESS } else { 0 },
            }
        } else {
            Schedule::default()
        };

        // Drift: a cgroup whose value changed behind our back and that this plan rewrites
        // (counted below once the write is made: a refused one repairs nothing).
        let drifted = std::mem::take(&mut self.drifted);
        let repairs: Vec<usize> = planned
            .writes
            .iter()
            .enumerate()
            .filter(|(_, w)| w.step != WriteStep::LiftQuota && drifted.contains(&w.path))
            .map(|(i, _)| i)
            .collect();

        self.remember_quotas(&scan, &planned);
        let initialised = self.initialised(&scan, now);
        let report = apply_scheduled(
            &self.parts.hierarchy,
            &planned.writes,
            &scan,
            &planned.parents,
            match self.parts.hierarchy.version {
                CgroupVersion::V1 => NewChildren::LetThemSettle {
                    initialised: &initialised,
                },
                CgroupVersion::V2 => NewChildren::NarrowNow,
            },
            schedule,
        );
        let written_at = Instant::now();
        let repaired: HashSet<&CgroupPath> = repairs
            .iter()
            .filter(|i| report.applied_writes.contains(i))
            .map(|&i| &planned.writes[i].path)
            .collect();
        self.metrics.drift_repairs += repaired.len() as u64;
        if report.held_back > 0 {
            let since = *self.held_since.get_or_insert(now);
            let quiet = self.last_new_cgroup.map_or(now, |t| t + COALESCE_QUIET);
            self.flush_at = Some(quiet.min(since + COALESCE_LIMIT));
            self.metrics.writes_held_back += report.held_back as u64;
        } else if mode.is_full() {
            // (An incremental pass holds nothing back, and leaves what a full one held back
            // to that one's flush.)
            self.held_since = None;
            self.flush_at = None;
        }
        for (write, error) in &report.failed {
            let errno = error.errno().unwrap_or(0);
            *self.metrics.write_errors.entry(errno).or_default() += 1;
            if self.metrics.first_failure(&write.path, write.file, errno) {
                log::warn!("{}", error_chain(error));
                if let Some((parent, _)) = report.blocked.iter().find(|(_, w)| w == write) {
                    log::warn!(
                        "cg={} cannot be narrowed while its child {} holds more and cannot be \
                         written: make {} writable by root without capabilities (chown it to \
                         root) or remove it if it is empty; retried at each reconcile",
                        scan.cgroups[*parent].path,
                        write.path,
                        write.path
                    );
                }
            }
        }
        self.metrics.narrowings_blocked += report.blocked.len() as u64;
        // A narrowing the kernel refused because a child holds more is a race with a runtime,
        // re-planned at once: counted as a retry and reported once, not an error.
        for (write, error) in &report.refused_stale {
            let errno = error.errno().unwrap_or(0);
            *self.metrics.write_retries.entry(errno).or_default() += 1;
            if self.metrics.first_failure(&write.path, write.file, errno) {
                log::info!("{} (a child holds more: re-planning)", error_chain(error));
            }
        }
        // A cgroup a write found gone leaves the model now: what it held (an exclusive set
        // perhaps) is released by the next plan; its own removal event finds nothing to do.
        let mut vanished = false;
        for &index in &report.gone_cgroups {
            let path = scan.cgroups[index].path.clone();
            vanished |= self.remove_subtree(&path);
        }

        // Desired sets, for drift detection and pin latency.
        for (cgroup, desired) in scan.cgroups.iter().zip(&planned.desired) {
            if let Some(entry) = self.model.get_mut(&cgroup.path) {
                if entry.desired != desired.cpus {
                    entry.desired.clone_from(&desired.cpus);
                }
            }
        }
        // The model takes what was written. Each write comes back from the watcher as an
        // `IN_MODIFY` whose re-read shows the written value (no further pass) or, when someone
        // wrote after the agent, theirs: drift, repaired by the next pass.
        if !report.applied_writes.is_empty() {
            self.bump();
        }
        for &index in &report.applied_writes {
            let write = &planned.writes[index];
            if let Some(entry) = self.model.get_mut(&write.path) {
                entry.cgroup.assume_written(write.file, &write.value);
                entry.updated = now;
            }
        }
        // A chain's ancestors' narrowings wait for the full pass: until then what they hold
        // is what is wanted there, not drift.
        for cgroup in scan.cgroups.iter().filter(|c| !mode.owns(&c.path)) {
            if let Some(entry) = self.model.get_mut(&cgroup.path) {
                entry.desired = entry.cgroup.cpus.configured().cloned();
            }
        }
        let urgent_done = report.urgent_done.unwrap_or(written_at);
        self.track_pins(&scan, &classes, |i| {
            if urgent_cgroup[i] {
                urgent_done
            } else {
                written_at
            }
        });
        if mode.is_full() {
            self.track_settings_wait(&scan, &classes, now);
        }

        let changed = planned.assignments != self.parts.assignments
            || planned
                .writes
                .iter()
                .any(|w| w.step == WriteStep::LiftQuota);
        self.parts.assignments = planned.assignments.clone();
        self.metrics.record_pass(&planned, &report);
        let containers = classes
            .iter()
            .zip(&scan.cgroups)
            .filter(|(c, g)| {
                c.kind == CgroupKind::Container
                    && (mode.is_full() || self.since_pass.new.contains(&g.path))
            })
            .count() as u64;
        if mode.is_full() {
            self.metrics.containers = containers;
            self.isolated.clear();
        } else {
            self.metrics.containers += containers;
        }
        for (class, cgroup) in classes.iter().zip(&scan.cgroups) {
            if class.kind != CgroupKind::Container || !class.isolation.any() {
                continue;
            }
            if let Some(key) = class.assignment_key() {
                self.isolated
                    .insert(key, (class.isolation, cgroup.path.clone()));
            }
        }
        let settled = report.is_clean()
            && report.held_back == 0
            && report.skipped == 0
            && report.gone == 0
            && !planned
                .events
                .iter()
                .any(|e| matches!(e, AssignEvent::Failed { .. } | AssignEvent::Short { .. }));
        // Only a full pass says the whole tree is settled; an incremental one can only say it
        // is not (a write a full pass could not make is retried by the next reconcile).
        self.last_pass_settled = settled && (mode.is_full() || self.last_pass_settled);
        let outcome = PassOutcome {
            assignments_changed: changed,
            writes: report.applied,
            failed_writes: report.failed.len(),
        };
        let paths = |indexes: &[usize]| -> Vec<CgroupPath> {
            indexes
                .iter()
                .map(|&i| scan.cgroups[i].path.clone())
                .collect()
        };
        let follow_up = FollowUp {
            stale: paths(&report.stale),
            settling: paths(&report.settling),
            vanished,
        };
        let unmet = planned
            .events
            .iter()
            .any(|e| matches!(e, AssignEvent::Failed { .. } | AssignEvent::Short { .. }));
        if unmet {
            // Someone waits for CPUs: only a full pass plans for them.
            self.steady = false;
        }
        if mode.is_full() {
            let shared = planned.pools.as_ref().map(|p| &p.shared);
            self.shared_members = planned
                .desired
                .iter()
                .filter(|d| d.cpus.is_some() && d.cpus.as_ref() == shared)
                .count();
            self.steady = self.complete
                && !unmet
                && classes.iter().all(|c| {
                    c.kind != CgroupKind::Container
                        || !matches!(entitlement(c), Entitlement::Unknown { .. })
                });
        }
        self.pools = planned.pools;
        self.planned = true;
        (outcome, follow_up)
    }

    /// Classifies the model, reusing each cgroup's cached classification (kept while its path
    /// and CPU settings stay the same, see [`Controller::set_entry`]).
    ///
    /// The runtime's config gives a container's CPU request while its cgroup still holds the
    /// kernel's defaults; once the cgroup has held the config's request (or was there when the
    /// agent started), a cgroup that differs from the config was resized in place, and its own
    /// settings are the truth (the config still names the container).
    fn classify_model(&mut self, scan: &Scan) -> Vec<Classification> {
        scan.cgroups.iter().map(|c| self.class_of(c)).collect()
    }

    /// The classification of `cgroup`: the cached one of its model entry, or a new one
    /// (cached unless it waits for its runtime config).
    fn class_of(&mut self, cgroup: &ScannedCgroup) -> Classification {
        use crate::classify::{Exclusivity, SharedReason};
        let naming = &self.parts.naming;
        let runtime = &mut self.parts.runtime;
        let starting = !self.planned;
        let Some(entry) = self.model.get_mut(&cgroup.path) else {
            return classify_scan_one(naming, cgroup, |id| runtime.lookup(id));
        };
        {
            if let Some(class) = &entry.class {
                return class.clone();
            }
            let mut found: Option<RuntimeInfo> = None;
            let mut class = classify_scan_one(naming, cgroup, |id| {
                found = runtime.lookup(id);
                found.clone()
            });
            let waiting = matches!(
                class.exclusivity,
                Exclusivity::Shared {
                    reason: SharedReason::CpuSettingsUnavailable
                }
            );
            if let (Some(mut info), Some(id)) = (found.take(), class.container_id.clone()) {
                match config_matches_cgroup(&cgroup.cpu, &info.cpu) {
                    Some(true) => {
                        self.resized.remove(&id);
                        self.settled.insert(id);
                    }
                    Some(false) if starting || self.settled.contains(&id) => {
                        info.cpu = OciCpu::default();
                        class = classify(naming, &cgroup.relative, &cgroup.cpu, Some(&info));
                        if self.resized.insert(id.clone()) {
                            log::info!(
                                "cg={} cpu settings differ from the runtime config (resized in place): request {} from the cgroup",
                                cgroup.path,
                                class.resources.map_or_else(
                                    || "unknown".to_string(),
                                    |r| r.request.to_string()
                                )
                            );
                        }
                        self.settled.insert(id);
                    }
                    _ => {}
                }
                entry.class = Some(class.clone());
                say_notices(&cgroup.path, &class, &mut entry.said);
            } else if class.kind != CgroupKind::Container || !waiting {
                // Without a runtime config a container waiting for its CPU settings is looked
                // up again next pass; one classified from its cgroup is not.
                entry.class = Some(class.clone());
                say_notices(&cgroup.path, &class, &mut entry.said);
            }
            class
        }
    }

    /// Records the value each quota lift overwrites, so `reset` can put it back.
    /// A quota someone set again after the lift (an in-place resize) is theirs: the value from
    /// before the lift is forgotten, and a new lift records the new one.
    fn remember_quotas(&mut self, scan: &Scan, planned: &Plan) {
        use crate::cgroupfs::{CpuSettings, FileValue, Quota};
        let model = &self.model;
        self.parts.quota_lifted.retain(|path, _| {
            let quota_set = match model.get(path).map(|e| &e.cgroup.cpu) {
                Some(CpuSettings::V1 { cfs_quota, .. }) => {
                    matches!(cfs_quota, FileValue::Value(Quota::Micros(_)))
                }
                Some(CpuSettings::V2 { max, .. }) => {
                    matches!(max, FileValue::Value(m) if m.quota != Quota::Unlimited)
                }
                None => false,
            };
            !quota_set
        });
        for w in planned
            .writes
            .iter()
            .filter(|w| w.step == WriteStep::LiftQuota)
        {
            let original = match &scan.cgroups[w.cgroup].cpu {
                CpuSettings::V1 {
                    cfs_quota: FileValue::Value(Quota::Micros(us)),
                    ..
                } => us.to_string(),
                CpuSettings::V2 {
                    max: FileValue::Value(max),
                    ..
                } if max.quota != Quota::Unlimited => max.to_string(),
                _ => continue,
            };
            self.parts.quota_lifted.insert(w.path.clone(), original);
        }
    }

    fn model_scan(&self) -> Scan {
        Scan {
            version: self.parts.hierarchy.version,
            kubepods: self.parts.scanner.kubepods().clone(),
            cgroups: self.model.values().map(|e| e.cgroup.clone()).collect(),
            skipped: Vec::new(),
            complete: self.complete,
            gone_pods: Default::default(),
        }
    }

    /// How the log names a container: `namespace/pod/container (pod<uid>/…)` once the runtime
    /// has named its pod, else the key alone.
    fn label(&self, key: &AssignmentKey) -> String {
        let uid = key.pod_uid();
        let Some(pod) = self.pod_names.get(uid) else {
            return key.to_string();
        };
        let text = match key {
            AssignmentKey::Named { container, .. } => format!("{pod}/{container} ({key})"),
            AssignmentKey::Id { .. } => format!("{pod} ({key})"),
        };
        crate::logging::printable(&text).into_owned()
    }

    /// ` devices=…` with the devices of the container holding `key` and their NUMA nodes (the
    /// hint its cpus were allocated with), or nothing when it has none.
    fn devices_of(key: &AssignmentKey, classes: &[Classification]) -> String {
        let devices = classes
            .iter()
            .find(|c| !c.devices.is_empty() && c.assignment_key().as_ref() == Some(key))
            .map(|c| crate::devices::describe_all(&c.devices));
        match devices {
            Some(text) => format!(" devices=[{text}]"),
            None => String::new(),
        }
    }

    /// `namespace/pod` of the pods of `keys`, from `classes`, for the log (kept until their
    /// CPUs are released, when the pod may be gone).
    fn learn_pod_names<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k AssignmentKey>,
        classes: &[Classification],
    ) {
        for key in keys {
            let uid = key.pod_uid();
            if self.pod_names.contains_key(uid) {
                continue;
            }
            let named = classes
                .iter()
                .find(|c| c.pod_uid.as_deref() == Some(uid) && c.pod_name.is_some());
            if let Some(class) = named {
                let namespace = class.pod_namespace.as_deref().unwrap_or("-");
                let name = class.pod_name.as_deref().unwrap_or("-");
                self.pod_names
                    .insert(uid.to_string(), format!("{namespace}/{name}"));
            }
        }
    }

    fn log_events(&mut self, events: &[AssignEvent], classes: &[Classification]) {
        self.learn_pod_names(events.iter().map(AssignEvent::key), classes);
        for event in events {
            match event {
                AssignEvent::Allocated { key, cpus } => {
                    self.metrics.pinning_requests += 1;
                    self.metrics.pin_succeeded(key);
                    let devices = Self::devices_of(key, classes);
                    log::info!("{}: allocated cpus={cpus}{devices}", self.label(key));
                }
                AssignEvent::Adopted { key, cpus } => {
                    log::info!("{}: adopted cpus={cpus}", self.label(key))
                }
                AssignEvent::Shrunk { key, from, cpus } => {
                    log::info!(
                        "{}: resized in place from cpus={from} to cpus={cpus}",
                        self.label(key)
                    )
                }
                AssignEvent::Reused { key, from, cpus } => {
                    log::info!("{}: took over cpus={cpus} from {from}", self.label(key))
                }
                AssignEvent::Released { key, cpus, why } => {
                    let pod_gone = matches!(why, ReleaseReason::PodGone);
                    let why = match why {
                        ReleaseReason::PodGone => "pod gone",
                        ReleaseReason::NowShared => "now shared",
                        ReleaseReason::Resized => "resized",
                        ReleaseReason::Reused => "reused by its pod",
                        ReleaseReason::OutOfReach => "offline or out of reach: allocated afresh",
                        ReleaseReason::SharedPoolEmpty => {
                            "the shared pool would be empty: its reserved cpus are offline"
                        }
                    };
                    self.metrics.pin_succeeded(key);
                    log::info!("{}: released cpus={cpus} ({why})", self.label(key));
                    if pod_gone {
                        self.pod_names.remove(key.pod_uid());
                    }
                }
                AssignEvent::Replaced {
                    key,
                    lost,
                    added,
                    cpus,
                } => {
                    self.metrics.pin_succeeded(key);
                    let lost = if lost.is_empty() {
                        String::new()
                    } else {
                        format!("lost cpus {lost} (offline or out of reach), ")
                    };
                    log::info!(
                        "{}: {lost}replacement cpus {added}: cpus={cpus}",
                        self.label(key)
                    );
                }
                AssignEvent::Short {
                    key,
                    lost,
                    cpus,
                    wanted,
                    error,
                } => {
                    // Once until it has its count again or goes (every pass asks again).
                    if self.metrics.first_pin_failure(key) {
                        let lost = if lost.is_empty() {
                            String::new()
                        } else {
                            format!("lost cpus {lost} (offline or out of reach) and ")
                        };
                        log::warn!(
                            "{}: {lost}no replacement can be given: keeps cpus={cpus} ({} of \
                             {wanted}) and asks again every pass: {error}",
                            self.label(key),
                            cpus.len()
                        );
                    }
                }
                AssignEvent::Failed {
                    key,
                    requested,
                    error,
                } => {
                    // Once per container (key) until it is pinned or goes, not once per
                    // pass: a pass runs for every batch of events.
                    if self.metrics.first_pin_failure(key) {
                        self.metrics.pinning_requests += 1;
                        self.metrics.pinning_errors += 1;
                        log::warn!(
                            "{}: {requested} exclusive cpus cannot be given, stays shared: {error}",
                            self.label(key)
                        );
                    }
                }
            }
        }
    }

    /// Event → pin latency: a new container counts once, when its cpuset reads back as desired
    /// and its CPU settings were known (before, it waits in the shared pool for them).
    /// `pinned_at(i)`: when scanned cgroup `i`'s writes were made.
    fn track_pins(
        &mut self,
        scan: &Scan,
        classes: &[Classification],
        pinned_at: impl Fn(usize) -> Instant,
    ) {
        use crate::classify::{Exclusivity, SharedReason};
        if self.pending_pins.is_empty() {
            return;
        }
        let now = Instant::now();
        for (index, (cgroup, class)) in scan.cgroups.iter().zip(classes).enumerate() {
            let Some(seen) = self.pending_pins.get(&cgroup.path).copied() else {
                continue;
            };
            if class.kind != CgroupKind::Container {
                self.pending_pins.remove(&cgroup.path);
                continue;
            }
            if let Exclusivity::Shared {
                reason: SharedReason::CpuSettingsUnavailable,
            } = class.exclusivity
            {
                continue;
            }
            let current = self
                .model
                .get(&cgroup.path)
                .and_then(|e| e.cgroup.cpus.configured());
            if current.is_some() && current == self.desired(&cgroup.path) {
                self.metrics
                    .event_to_pin
                    .record(pinned_at(index).saturating_duration_since(seen));
                self.pending_pins.remove(&cgroup.path);
            }
        }
        self.pending_pins
            .retain(|_, seen| now.saturating_duration_since(*seen) < PIN_TRACKING_LIMIT);
    }

    /// Containers whose CPU settings are not readable yet get a few bounded re-reads.
    fn track_settings_wait(&mut self, scan: &Scan, classes: &[Classification], now: Instant) {
        use crate::classify::{Exclusivity, SharedReason};
        let mut still = HashMap::new();
        for (cgroup, class) in scan.cgroups.iter().zip(classes) {
            let waiting = class.kind == CgroupKind::Container
                && matches!(
                    class.exclusivity,
                    Exclusivity::Shared {
                        reason: SharedReason::CpuSettingsUnavailable
                    }
                );
            if waiting {
                let tries = self.settings_wait.get(&cgroup.path).copied().unwrap_or(0);
                if tries < SETTINGS_RETRY.len() {
                    still.insert(cgroup.path.clone(), tries + 1);
                }
            }
        }
        self.next_retry = still
            .values()
            .map(|&tries| now + SETTINGS_RETRY[tries - 1])
            .min();
        self.settings_wait = still;
    }
}

/// What classification noticed about a cgroup (an ignored annotation value, a pod uid in the
/// runtime config that differs from the path, a limit that differs from the request …), said
/// once: when its classification is cached, which is again only when its CPU settings change.
/// Logs what classification noticed about a cgroup, each notice once while it lasts.
fn say_notices(path: &CgroupPath, class: &Classification, said: &mut Vec<Notice>) {
    for notice in &class.notices {
        if !said.contains(notice) {
            log::warn!("cg={path}: {notice}");
        }
    }
    said.clone_from(&class.notices);
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;
    use crate::allocator::{PolicyOptions, ReservedCpus};
    use crate::cgroupfs::{detect_layout, CgroupVersion, InterfaceFile, LayoutConfig};
    use crate::kubesim::{new_pod_uid, ContainerSpec, FakeNode, PodSpec, Qos};
    use crate::runtime::ConfigTemplate;

    /// A fake v1 node with the 8 cpus of `1s-4c-ht`, one Guaranteed 1-cpu pod, and a
    /// controller (cpu 0 reserved) that has run its first pass.
    fn converged() -> (tempfile::TempDir, FakeNode, CgroupPath, Controller) {
        let dir = tempfile::tempdir().unwrap();
        let node = FakeNode::create(
            &dir.path().join("cg"),
            CgroupVersion::V1,
            CpuSet::parse("0-7").unwrap(),
            CpuSet::parse("0").unwrap(),
            &dir.path().join("runtime"),
        )
        .unwrap();
        let pod = PodSpec {
            uid: new_pod_uid(),
            name: "db".into(),
            qos: Qos::Guaranteed,
            containers: vec![ContainerSpec::guaranteed("app", 1000)],
        };
        let ids = node.start_pod(&pod).unwrap();
        let container = CgroupPath::new(&format!("kubepods/pod{}/{}", pod.uid, ids[0])).unwrap();

        let layout = detect_layout(&LayoutConfig {
            proc_root: "/nonexistent-proc".into(),
            cgroup_root: Some(node.cgroup_root().to_path_buf()),
            driver: None,
            kubepods: None,
        })
        .unwrap();
        let hierarchy = Hierarchy::open(&layout).unwrap();
        let sysfs = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/sysfs/1s-4c-ht");
        let topology = crate::topology::discover(&sysfs, &sysfs.join("proc")).unwrap();
        let policy = StaticPolicy::new(
            &topology,
            PolicyOptions::default(),
            ReservedCpus::List(CpuSet::parse("0").unwrap()),
            false,
        )
        .unwrap();
        let mut controller = Controller::new(ControllerParts {
            scanner: Scanner::new(hierarchy.clone(), layout.kubepods.clone()),
            hierarchy,
            naming: CgroupNaming::new(layout.driver, &layout.kubepods),
            runtime: RuntimeLookup::new(vec![
                ConfigTemplate::new(&node.runtime_template()).unwrap()
            ]),
            topology,
            policy: Some(policy),
            align_memory: false,
            keep_cfs_quota: false,
            assignments: Assignments::new(),
            quota_lifted: BTreeMap::new(),
        });
        controller.full_scan().unwrap();
        controller.pass(Instant::now());
        (dir, node, container, controller)
    }

    fn cpus(node: &FakeNode, cgroup: &CgroupPath) -> String {
        let text = fs::read_to_string(node.file(&cgroup.to_string(), "cpuset.cpus")).unwrap();
        text.trim().to_string()
    }

    fn modified(cgroup: &CgroupPath, file: InterfaceFile) -> TreeEvent {
        TreeEvent::Modified {
            cgroup: cgroup.clone(),
            file,
        }
    }

    /// Issue 17, item 2: past the scan limit nothing unseen is released.
    #[test]
    fn a_scan_stopped_at_its_limit_releases_nothing_it_did_not_see() {
        let (_dir, node, container, mut controller) = converged();
        let pinned = cpus(&node, &container);
        let held = controller.parts.assignments.exclusive_cpus();
        assert_eq!(held.to_string(), pinned);
        // kubepods, besteffort and burstable sort before pod…: the pod is past a limit of 3.
        let hierarchy = controller.parts.hierarchy.clone();
        controller.parts.scanner =
            Scanner::new(hierarchy, controller.parts.scanner.kubepods().clone())
                .with_max_cgroups(3);
        controller.rescan().unwrap();
        controller.pass(Instant::now());
        assert_eq!(controller.parts.assignments.exclusive_cpus(), held);
        assert_eq!(cpus(&node, &container), pinned);
    }

    /// Issue 17, item 1: a pod directory a scan cannot open (EACCES, EMFILE …) is not gone:
    /// its containers keep their entries and their cpus.
    #[test]
    fn an_unreadable_pod_keeps_its_cpus() {
        let (_dir, _node, container, mut controller) = converged();
        let held = controller.parts.assignments.exclusive_cpus();
        assert!(!held.is_empty());
        let pod = container.parent().unwrap();
        let started = Instant::now();
        let mut scan = controller.parts.scanner.scan().unwrap();
        scan.cgroups.retain(|c| c.path.strip_prefix(&pod).is_none());
        scan.skipped.push(crate::cgroupfs::SkippedEntry {
            path: pod.clone(),
            reason: SkipReason::Unlistable,
        });
        controller.reconcile(ReconcileScan { started, scan }, Instant::now());
        assert!(controller.model.contains_key(&container));
        assert_eq!(controller.parts.assignments.exclusive_cpus(), held);
        // And a failed re-read of a cgroup that is still there does not drop it either.
        assert!(!controller.remove_if_gone(&container));
        assert!(controller.model.contains_key(&container));
    }

    #[test]
    fn a_removed_cgroup_takes_its_whole_subtree_even_past_a_sibling_that_sorts_inside_it() {
        let (_dir, node, container, mut controller) = converged();
        // `sub-2` sorts between `sub` and `sub/x` bytewise ('-' < '/').
        let set = cpus(&node, &container);
        for rel in ["sub", "sub-2", "sub/x"] {
            let dir = node.file(&format!("{container}/{rel}"), "cpuset.cpus");
            fs::create_dir_all(dir.parent().unwrap()).unwrap();
            for file in ["cpuset.cpus", "cpuset.mems", "cgroup.procs"] {
                let value = if file == "cpuset.cpus" {
                    set.as_str()
                } else {
                    "0"
                };
                fs::write(dir.with_file_name(file), format!("{value}\n")).unwrap();
            }
        }
        controller.full_scan().unwrap();
        let path = |rel: &str| CgroupPath::new(&format!("{container}/{rel}")).unwrap();
        assert!(controller.model.contains_key(&path("sub/x")));

        let removed = TreeEvent::Removed {
            cgroup: path("sub"),
        };
        assert!(controller.apply_event(removed, Instant::now()).unwrap());
        assert!(!controller.model.contains_key(&path("sub")));
        assert!(
            !controller.model.contains_key(&path("sub/x")),
            "a descendant stayed"
        );
        assert!(
            controller.model.contains_key(&path("sub-2")),
            "a sibling went"
        );
    }

    #[test]
    fn own_writes_come_back_without_a_pass_and_foreign_writes_are_repaired() {
        let (_dir, node, container, mut controller) = converged();
        let pinned = cpus(&node, &container);
        assert_eq!(CpuSet::parse(&pinned).unwrap().len(), 1);

        // The echo of the agent's own write changes nothing.
        let now = Instant::now();
        let echo = controller.apply_event(modified(&container, InterfaceFile::CpusetCpus), now);
        assert!(!echo.unwrap());

        // Someone else writes the whole pool: drift, repaired by the next pass.
        fs::write(node.file(&container.to_string(), "cpuset.cpus"), "0-7\n").unwrap();
        let foreign = controller.apply_event(modified(&container, InterfaceFile::CpusetCpus), now);
        assert!(foreign.unwrap());
        let passes = controller.metrics.passes;
        let outcome = controller.pass(Instant::now());
        assert_eq!(outcome.writes, 1);
        assert_eq!(cpus(&node, &container), pinned);
        assert_eq!(controller.metrics.drift_repairs, 1);
        // Nothing but the drift changed: written back without planning.
        assert_eq!(controller.metrics.passes, passes);
        // And its echo changes nothing again.
        let echo = controller.apply_event(modified(&container, InterfaceFile::CpusetCpus), now);
        assert!(!echo.unwrap());
    }

    #[test]
    fn while_cgroups_arrive_pins_go_first_and_the_shared_rewrites_follow() {
        let (_dir, node, container, mut controller) = converged();
        let shared_pod = PodSpec {
            uid: new_pod_uid(),
            name: "web".into(),
            qos: Qos::Burstable,
            containers: vec![ContainerSpec::burstable("web", 250, Some(1000))],
        };
        let web = node.start_pod(&shared_pod).unwrap().remove(0);
        let pod_dir = |p: &PodSpec| CgroupPath::new(&node.pod_dir(p)).unwrap();
        let created = TreeEvent::Created {
            cgroup: pod_dir(&shared_pod),
        };
        controller.apply_event(created, Instant::now()).unwrap();
        controller.pass(Instant::now());
        let pinned = cpus(&node, &container);
        let pinned = CpuSet::parse(&pinned).unwrap();
        let shared_before = CpuSet::parse("0-7").unwrap().difference(&pinned);
        assert_eq!(
            node.container_cpus(&shared_pod, &web).unwrap(),
            shared_before.to_string()
        );

        // From now on passes schedule their writes. A Guaranteed pod arrives just after
        // another cgroup did: its pin is written, the shared pool's rewrite held back.
        let arrivals = Arc::new(AtomicU64::new(0));
        controller.watch_arrivals(Arc::clone(&arrivals));
        let db = PodSpec {
            uid: new_pod_uid(),
            name: "db2".into(),
            qos: Qos::Guaranteed,
            containers: vec![ContainerSpec::guaranteed("db", 2000)],
        };
        let db_id = node.start_pod(&db).unwrap().remove(0);
        let now = Instant::now();
        let created = TreeEvent::Created {
            cgroup: pod_dir(&db),
        };
        assert!(controller.apply_event(created, now).unwrap());
        let before = node.container_cpus(&shared_pod, &web).unwrap();
        controller.pass(now);
        let exclusive = CpuSet::parse(&node.container_cpus(&db, &db_id).unwrap()).unwrap();
        assert_eq!(exclusive.len(), 2);
        assert_eq!(node.container_cpus(&shared_pod, &web).unwrap(), before);
        assert!(controller.metrics.writes_held_back > 0);

        // Once no cgroup has arrived for a moment, the held-back writes are made.
        let due = controller.next_retry().expect("a flush is scheduled");
        assert!(due <= now + COALESCE_QUIET);
        assert!(controller.retry_settings(due));
        controller.pass(due);
        let shared = CpuSet::parse(&node.container_cpus(&shared_pod, &web).unwrap()).unwrap();
        assert!(
            shared.is_disjoint(&exclusive),
            "{shared} overlaps {exclusive}"
        );
        assert!(shared.is_disjoint(&pinned));
        assert_eq!(shared, shared_before.difference(&exclusive));
        assert!(controller.next_retry().is_none());
    }

    #[test]
    fn a_reconcile_that_changes_nothing_runs_no_pass() {
        let (_dir, node, container, mut controller) = converged();
        let passes = controller.metrics.passes;
        assert!(controller.rescan().unwrap().is_none());
        assert_eq!(controller.metrics.passes, passes);
        assert_eq!(controller.metrics.skipped_passes, 1);

        // A change no event reported (here: written behind the watcher's back) is found by
        // the scan and repaired by the pass it triggers.
        let pinned = cpus(&node, &container);
        fs::write(node.file(&container.to_string(), "cpuset.cpus"), "1-7\n").unwrap();
        let outcome = controller.rescan().unwrap().expect("a pass");
        assert!(outcome.writes >= 1);
        assert_eq!(cpus(&node, &container), pinned);
    }

    #[test]
    fn a_cpu_settings_event_rereads_the_settings_and_reclassifies() {
        let (_dir, node, container, mut controller) = converged();
        assert_eq!(controller.assignments().len(), 1);
        // The runtime config goes, and the cgroup's settings now say 0.5 cpu: the cached
        // classification is dropped and the container is classified from its cgroup again.
        let id = container.name().unwrap().to_string_lossy().into_owned();
        let runtime = node.runtime_template().replace("{id}", &id);
        fs::remove_file(runtime).unwrap();
        controller.parts.runtime.forget(&id);
        fs::write(node.file(&container.to_string(), "cpu.shares"), "512\n").unwrap();
        fs::write(
            node.file(&container.to_string(), "cpu.cfs_quota_us"),
            "50000\n",
        )
        .unwrap();
        let now = Instant::now();
        let changed = controller.apply_event(modified(&container, InterfaceFile::CpuShares), now);
        assert!(changed.unwrap());
        controller.pass(Instant::now());
        let class = controller
            .model
            .values()
            .filter_map(|e| e.class.as_ref())
            .find(|c| c.container_id.as_deref() == Some(id.as_str()))
            .unwrap();
        assert!(
            matches!(
                class.exclusivity,
                crate::classify::Exclusivity::Shared {
                    reason: crate::classify::SharedReason::NotWholeCpus { .. }
                }
            ),
            "{class:?}"
        );
    }
}
