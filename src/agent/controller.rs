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
//! the shared pool's rewrites following in a coalesced full pass. A reconcile's full scan is
//! merged by [`Controller::merge_scan`]'s rule; one that changes nothing runs no pass.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use crate::allocator::StaticPolicy;
use crate::cgroupfs::{
    CgroupError, CgroupPath, CgroupVersion, Hierarchy, Scan, ScannedCgroup, Scanner,
};
use crate::checkpoint::adopt::KubeletPins;
use crate::checkpoint::kubelet_state::KubeletState;
use crate::classify::{
    classify, classify_scan_one, config_matches_cgroup, CgroupKind, CgroupNaming, Classification,
};
use crate::cpuset::CpuSet;
use crate::logging::error_chain;
use crate::planner::{
    plan, undecided, AssignEvent, NodeLimits, Plan, PlanConfig, Pools, WriteStep,
};
use crate::runtime::{OciCpu, RuntimeInfo, RuntimeLookup};
use crate::state::Assignments;
use crate::topology::Topology;
use crate::watcher::{Arrivals, TreeEvent};
use crate::writer::NewChildren;

use super::deadlines::{Burst, Deadlines};
use super::hotplug::Hotplug;
use super::metrics::Metrics;
use super::model::{self, Model, SincePass};
use super::said::{say_limits, Said};
use incremental::Mode;

mod classes;
mod drift;
mod incremental;
mod isolation;
mod projection;
mod upkeep;
mod write;

/// A cgroup's classification, shared by its model entry (which caches it) and the passes that
/// read it (never copied per pass).
type Class = Arc<Classification>;

/// A full scan made by the reconcile thread, and when it started.
#[derive(Debug)]
pub struct ReconcileScan {
    pub started: Instant,
    pub scan: Scan,
}

/// What writing a plan showed of the model.
#[derive(Debug, Default)]
struct FollowUp {
    /// Cgroups with a child the model does not know: re-read them and plan again now.
    stale: Vec<CgroupPath>,
    /// Cgroups not narrowed while a child is set up: plan again after a [`Burst::SETTLE_DELAYS`].
    settling: Vec<CgroupPath>,
    /// A cgroup written to was gone (it left the model): plan again now.
    vanished: bool,
}

/// Plans per pass when writing shows the model out of date (see [`Controller::pass`]).
const MAX_REPLANS: usize = 4;

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
    /// `--respect-isolcpus` (the static policy carries it too; under `none` the planner keeps
    /// pods off the isolated cpus with it).
    pub respect_isolcpus: bool,
    /// Assignments from the checkpoint (names and intent; the live tree still wins).
    pub assignments: Assignments,
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

/// What the last pass left for the next to assume.
#[derive(Debug, Default)]
struct LastPass {
    /// Whether a pass has run (cgroups new to the model after it are tracked for their pin).
    planned: bool,
    /// It wrote all it planned and allocated all it was asked for.
    settled: bool,
    /// The pools it planned (`None` under the `none` policy).
    pools: Option<Pools>,
    /// The last full pass left every container's demand met: an incremental pass may plan
    /// new pods alone.
    steady: bool,
    /// Cgroups on the shared pool after the last full pass: what a change of the pool rewrites.
    shared_members: usize,
    /// The shared pool's members when few on a tree whose cgroups inherit: an incremental
    /// pass plans them itself (see [`incremental`]).
    pool_members: Option<std::collections::BTreeSet<CgroupPath>>,
    /// The node limits it planned within (said when they change).
    limits: Option<NodeLimits>,
    /// Its effects were not brought up to date: something arrived meanwhile, whose pin goes
    /// first ([`Controller::update_owed_effects`]).
    effects_owed: bool,
}

/// The agent's state and its one writer.
#[derive(Debug)]
pub struct Controller {
    parts: ControllerParts,
    /// One record per cgroup, and the indexes kept beside them.
    model: Model,
    /// What changed since the last pass, and whether an incremental pass may plan it (see
    /// [`incremental`]).
    since_pass: SincePass,
    last_pass: LastPass,
    /// Every timer: settings re-reads, settling narrowings, held-back writes, the owed full
    /// pass, fought-over repairs, the projection files; and the burst of arrivals.
    deadlines: Deadlines,
    /// What the log said (once), and the pods' names it says.
    said: Said,
    /// Told of watcher events that should go ahead of a long rewrite (see
    /// [`crate::watcher::Watcher::arrivals`]).
    arrivals: Option<Arrivals>,
    /// The model changed (read or written values, cgroups coming and going) since
    /// [`Controller::take_model_changed`]: the agent tells the reconcile thread, which does a
    /// full scan only then, or every few ticks.
    model_changed: bool,
    /// Where the online cpus are read from while the agent runs (see [`Controller::follow_hotplug`]).
    hotplug: Option<Hotplug>,
    /// The host effects ([`crate::effects`]), applied after the pins.
    effects: Vec<Box<dyn crate::effects::Effect>>,
    /// The projection files and `--project-all` (see [`Controller::manage_projection`]).
    projection: Option<(crate::projection::Projector, bool)>,
    pub metrics: Metrics,
}

impl Controller {
    pub fn new(parts: ControllerParts) -> Self {
        let mut metrics = Metrics::default();
        metrics.online_cpus = parts.topology.all_cpus().len() as u64;
        Controller {
            said: Said::knowing(&parts.assignments),
            parts,
            model: Model::default(),
            since_pass: SincePass::start(),
            last_pass: LastPass::default(),
            deadlines: Deadlines::default(),
            arrivals: None,
            model_changed: true,
            hotplug: None,
            effects: Vec::new(),
            projection: None,
            metrics,
        }
    }

    /// Lets passes put urgent writes first and hold back the others (the shared pool's
    /// rewrites) while new cgroups arrive, and stop a long rewrite when `arrivals` (the
    /// watcher's [`crate::watcher::Watcher::arrivals`]) says something arrived: new cgroups go
    /// first. Without it (the library's default), every pass makes all its writes in plan
    /// order.
    pub fn watch_arrivals(&mut self, arrivals: Arrivals) {
        self.arrivals = Some(arrivals);
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
        let parts = &mut self.parts;
        change.take(&mut parts.topology, &mut parts.policy, &mut self.metrics);
        self.since_pass.structural = true;
        self.bump();
        true
    }

    /// Whether the model changed since the last call (the agent tells the reconcile thread).
    pub fn take_model_changed(&mut self) -> bool {
        std::mem::take(&mut self.model_changed)
    }

    fn bump(&mut self) {
        self.model_changed = true;
    }

    pub fn assignments(&self) -> &Assignments {
        &self.parts.assignments
    }

    /// How many containers' runtime configs are cached (those in the tree).
    pub fn cached_runtime_configs(&self) -> usize {
        self.parts.runtime.cached()
    }

    /// The exclusive cpus refused, by container, with kubelet's reason as the log said it.
    pub fn refusals(&self) -> &crate::state::Refusals {
        &self.said.refused
    }

    pub fn policy(&self) -> Option<&StaticPolicy> {
        self.parts.policy.as_ref()
    }

    pub fn topology(&self) -> &Topology {
        &self.parts.topology
    }

    /// The shared pool after the last pass.
    pub fn shared_pool(&self) -> Option<&CpuSet> {
        self.last_pass.pools.as_ref().map(|p| &p.shared)
    }

    /// Every cpu pods may use after the last pass (the kubepods root's set).
    pub fn pod_cpus(&self) -> Option<&CpuSet> {
        self.last_pass.pools.as_ref().map(|p| &p.pod_cpus)
    }

    /// What the PodResources server answers from (see [`crate::podresources::snapshot`]): the
    /// model's containers, the assignments and the allocatable cpus (online minus reserved;
    /// none under the `none` policy, as kubelet).
    pub fn pod_resources(&self) -> crate::podresources::PodResourcesSnapshot {
        let (all, policy) = (self.parts.topology.all_cpus(), self.parts.policy.as_ref());
        let allocatable = policy.map(|p| all.difference(p.reserved()));
        let classes = self.model.values().filter_map(|e| e.class.as_deref());
        let (assignments, allocatable) = (&self.parts.assignments, allocatable.unwrap_or_default());
        crate::podresources::snapshot(classes, assignments, allocatable)
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
        if self.deadlines.full_pass.due().is_none() && self.deadlines.held_back.due().is_none() {
            return None;
        }
        self.since_pass.other = true;
        // Every write, in plan order: nothing held back for arrivals now.
        let arrivals = self.arrivals.take();
        let outcome = self.pass(now);
        self.arrivals = arrivals;
        Some(outcome)
    }

    /// When the controller wants to run again without an event (see [`Deadlines`]).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.next()
    }

    /// Does what is due: re-reads the containers still waiting for their CPU settings, the
    /// cgroups whose narrowing waited for new children and the fought-over cgroups whose
    /// backoff ended; owes a pass for the held-back writes or the owed full pass. Returns
    /// whether a pass is needed.
    pub fn on_deadlines(&mut self, now: Instant) -> bool {
        self.deadlines.settings = None;
        // Held-back writes, or the shared pool's members after incremental passes: a full pass
        // (after the pins of pods that arrived meanwhile, see `pass`), which pays them or owes
        // them again.
        let due = &self.deadlines;
        let mut changed = due.held_back.is_due(now) || due.full_pass.is_due(now);
        if let Some(roots) = self.deadlines.settling.take_due(now) {
            for root in roots {
                self.rescan_subtree(&root, now);
            }
            changed = true;
        }
        changed |= self.resume_fights(now);
        let waiting = self.model.waiting();
        waiting
            .iter()
            .fold(changed, |changed, p| self.reread(p, now) | changed)
    }

    /// Adopts the pins kubelet's checkpoint names where the live tree agrees and the
    /// container is entitled to exclusive cpus (see [`KubeletPins`]); every other entry is said,
    /// with why. Returns the pins adopted, each as `<label> cpus <set>` (the caller counts and
    /// names them).
    pub fn adopt_kubelet_pins(&mut self, kubelet: &KubeletState) -> Vec<String> {
        let scan = self.model_scan();
        let classes = self.classify_model(&scan);
        let cpus = scan.cgroups.iter().map(|c| c.cpus.value());
        let pins = KubeletPins::new(kubelet, classes.iter().map(|c| &**c).zip(cpus));
        self.said.learn_pod_names(pins.keys(), &classes);
        let said = &self.said;
        pins.adopt(&mut self.parts.assignments, |key| said.label(key))
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

    /// A reconcile: merges a full scan and runs a pass unless it would change nothing — the
    /// model is as the last pass left it, that pass wrote everything it planned, every
    /// container's runtime config was found (a missing one is looked for again) and no
    /// allocation failed (it is retried), and nothing waits: no narrowing for new children to
    /// settle, no empty cpuset left to its runtime, no container waiting for its settings.
    /// Returns the pass run, if any.
    pub fn reconcile(&mut self, reconcile: ReconcileScan, now: Instant) -> Option<PassOutcome> {
        let changed = self.merge_scan(reconcile) | self.limits_moved() | self.online_cpus_changed();
        let settled = !changed
            && self.since_pass.drifted.is_empty()
            && self.last_pass.settled
            && !self.deadlines.full_pass.is_owed()
            && self.deadlines.settling.is_empty()
            && self.model.at_rest();
        if settled {
            self.metrics.skipped_passes += 1;
            self.update_effects(true);
            return None;
        }
        let outcome = self.pass(now);
        self.update_effects(true);
        self.deadlines.projection.due = true;
        Some(outcome)
    }

    /// Applies one watcher event to the model. Returns whether the model changed.
    pub fn apply_event(&mut self, event: TreeEvent, now: Instant) -> Result<bool, CgroupError> {
        match event {
            TreeEvent::Created { cgroup } => Ok(self.rescan_subtree(&cgroup, now)),
            TreeEvent::Removed { cgroup } => Ok(self.removed(&cgroup)),
            // Only the named file's group is re-read (see `Scanner::refresh`).
            TreeEvent::Modified { cgroup, file } => {
                let Some(mut known) = self.model.get(&cgroup).map(|e| e.cgroup.clone()) else {
                    return Ok(self.reread(&cgroup, now));
                };
                match self.parts.scanner.refresh(&mut known, file) {
                    true => Ok(self.upsert(known, now)),
                    false => Ok(self.remove_if_gone(&cgroup)),
                }
            }
            TreeEvent::Rescan { reason } => {
                self.said.rescan(reason, now);
                self.metrics.rescans += 1;
                self.full_scan()?;
                Ok(true)
            }
        }
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
        self.deadlines.projection.due = true;
        if let Some(outcome) = self.repair_drift() {
            return outcome;
        }
        // New pods' pins first, also when the shared pool's rewrites are due now (owed by
        // incremental passes, or held back by a full pass during a burst).
        if let Some(outcome) = self.incremental_pass(now) {
            let due = &self.deadlines;
            if !due.full_pass.is_due(now) && !due.held_back.is_due(now) {
                return outcome;
            }
            return outcome.then(self.full_pass(now));
        }
        self.full_pass(now)
    }

    /// A pass over the whole model (see [`Controller::pass`]).
    fn full_pass(&mut self, now: Instant) -> PassOutcome {
        self.since_pass.planned_all();
        self.deadlines.full_pass.paid();
        let mut outcome = PassOutcome::default();
        for replan in 1..=MAX_REPLANS {
            let (this, follow_up) = self.pass_once(now);
            outcome = outcome.then(this);
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
            self.deadlines
                .settling
                .wait_for(settling, later, Instant::now());
            if !again || last {
                break;
            }
            for root in follow_up.stale {
                self.rescan_subtree(&root, now);
            }
        }
        // After the pins: interrupts are the second step of isolating a CPU.
        self.update_effects_unless_arrived();
        outcome
    }

    /// cgroup v1: sets `cgroup.clone_children` on kubepods, the QoS directories and the pod
    /// directories (new ones inherit it), so the kernel gives every new cgroup its parent's
    /// cpuset at `mkdir`, atomically with respect to the agent's writes. A runtime then finds
    /// the new cgroup set up and copies nothing: there is no window in which it copies a
    /// parent's set that the agent narrows before the copy lands (runc's `copyIfNeeded`, which
    /// then fails with EACCES). See [`crate::cgroupfs::CgroupFs::clone_children`].
    pub fn clone_cpusets_at_creation(&mut self) {
        if self.parts.hierarchy.version != CgroupVersion::V1 {
            return;
        }
        let kubepods = self.parts.scanner.kubepods();
        let cpuset = &self.parts.hierarchy.cpuset;
        let failed = cpuset.clone_children(kubepods, self.model.keys(), true);
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
        if !self.last_pass.planned {
            return false;
        }
        let (cpus, mems) = self.parts.scanner.kubepods_parent_limits();
        self.last_pass.limits.as_ref() != Some(&NodeLimits { cpus, mems })
    }

    /// What kubepods' parent lets pods have now (one read of its effective sets a pass): CPUs
    /// taken offline (the kernel drops them from every effective set) or held back by the
    /// parent are never planned nor written. Said when it changes.
    fn node_limits(&mut self) -> NodeLimits {
        let (cpus, mems) = self.parts.scanner.kubepods_parent_limits();
        let limits = NodeLimits { cpus, mems };
        let last = self.last_pass.limits.replace(limits.clone());
        if last.as_ref() != Some(&limits) {
            say_limits(last.as_ref(), &limits, self.parts.topology.all_cpus());
        }
        limits
    }

    /// One plan and its writes, and what they showed of the model.
    fn pass_once(&mut self, now: Instant) -> (PassOutcome, FollowUp) {
        let scan = self.model_scan();
        let classes = self.classify_model(&scan);
        let limits = self.node_limits();
        self.plan_and_write(now, scan, classes, limits, Mode::Full)
    }
}

#[cfg(test)]
mod tests;
