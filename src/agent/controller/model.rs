//! The model: one record per cgroup — what its files said when last read and everything the
//! agent learnt of it (its classification, the cpus the last pass wanted there, where it is in
//! its life, its pin timing, a fight with another writer, what the log said of it) — kept up
//! to date from watcher events and full scans. Forgetting a cgroup drops its record.

use std::collections::btree_map::Entry;
use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};

use super::classes::SETTINGS_RETRY;
use super::drift::Fight;
use super::*;

/// Where a cgroup is in its life, as far as its CPU request goes (it matters for containers;
/// other cgroups stay `New`). A cgroup gone is no phase: its record is dropped
/// ([`Controller::forget`]).
///
/// ```text
///   New ──(CPU settings unreadable, a full pass)──► WaitingForSettings { tries } ──(read, or
///    │                                                 out of re-reads)──► New
///    └──(its cgroup holds its runtime config's CPU request, or it ran when the agent started)
///          ──► Settled ◄──► Resized (its cgroup differs from the config: classified from it)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Seen; its CPU request not (yet) checked against its runtime's config.
    New,
    /// A container whose CPU settings cannot be read yet: re-read after each of
    /// [`SETTINGS_RETRY`] (`tries` of them so far, from 1), and by its events.
    WaitingForSettings { tries: usize },
    /// Its cgroup has held its runtime config's CPU request, or it was running when the agent
    /// started: a difference from the config now is an in-place resize.
    Settled,
    /// Resized in place: classified from its cgroup's own settings (said once, on the way in).
    Resized,
}

impl Phase {
    /// Its cgroup has held its config's request (or ran at start): see [`Phase::Settled`].
    pub(super) fn settled(self) -> bool {
        matches!(self, Phase::Settled | Phase::Resized)
    }

    /// The re-reads it had while waiting for its CPU settings.
    pub(super) fn settings_tries(self) -> usize {
        match self {
            Phase::WaitingForSettings { tries } => tries,
            _ => 0,
        }
    }
}

/// Its cpuset's setup by its runtime (on v1 a new cgroup's cpuset is empty until the runtime
/// copies its parent's into it), as passes saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Setup {
    /// No pass has seen it yet.
    Unseen,
    /// Passes have seen it empty since then: left to its runtime for [`RUNTIME_SETUP_LIMIT`].
    EmptySince(Instant),
    /// Seen set up: empty later means a foreign write (drift), not a runtime still at work.
    Done,
}

/// What the agent knows of one cgroup.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) cgroup: ScannedCgroup,
    pub(super) updated: Instant,
    /// The classification of `cgroup`, kept while its path and CPU settings stay the same and
    /// the runtime's config was found (or is not needed). `None`: classify in the next pass.
    pub(super) class: Option<Class>,
    /// The cpus the last pass wanted here, for drift detection and pin latency.
    pub(super) desired: Option<CpuSet>,
    /// Where it is in its life (see [`Phase`]); change it with [`Model::set_phase`].
    phase: Phase,
    /// Its cpuset's setup by its runtime.
    pub(super) setup: Setup,
    /// New after the first pass: when it was seen, until its pin is timed (event → pin).
    pub(super) pin_seen: Option<Instant>,
    /// Someone else keeps rewriting its cpuset (see [`Controller::hold_off_drift`]).
    pub(super) fight: Option<Box<Fight>>,
    /// What classification noticed and the log said, so a re-classification (its CPU
    /// settings written after its config was read) does not say it again.
    pub(super) said: SaidOnce<Notice>,
}

impl Record {
    pub(super) fn phase(&self) -> Phase {
        self.phase
    }
}

/// The records by path (the model derefs to that map), and the few indexes kept beside them
/// so no question a pass asks walks every record: how many pins are still timed, how many
/// containers wait for their CPU settings, which containers ask for isolation.
#[derive(Debug)]
pub(super) struct Model {
    /// Boxed: B-tree nodes hold eleven slots, mostly half empty, and a record is large.
    records: BTreeMap<CgroupPath, Box<Record>>,
    /// Records whose pin is still timed (see [`Record::pin_seen`]).
    pub(super) pins_pending: usize,
    /// Records in [`Phase::WaitingForSettings`] (their timer re-reads them, and walks no other).
    waiting: BTreeSet<CgroupPath>,
    /// The isolation annotations of the containers that hold exclusive cpus or ask for them.
    /// (What they ask for, and the container's cgroup.)
    pub(super) isolated: HashMap<AssignmentKey, (Isolation, CgroupPath)>,
    /// Whether the last full scan saw the whole tree (false past its limit): the planner
    /// releases nothing it did not see.
    pub(super) complete: bool,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            records: BTreeMap::new(),
            pins_pending: 0,
            waiting: BTreeSet::new(),
            isolated: HashMap::new(),
            complete: true,
        }
    }
}

impl Deref for Model {
    type Target = BTreeMap<CgroupPath, Box<Record>>;

    fn deref(&self) -> &Self::Target {
        &self.records
    }
}

impl DerefMut for Model {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.records
    }
}

impl<'m> IntoIterator for &'m Model {
    type Item = (&'m CgroupPath, &'m Box<Record>);
    type IntoIter = std::collections::btree_map::Iter<'m, CgroupPath, Box<Record>>;

    fn into_iter(self) -> Self::IntoIter {
        self.records.iter()
    }
}

impl Model {
    /// Moves `path`'s record to `phase` (its index kept).
    pub(super) fn set_phase(&mut self, path: &CgroupPath, phase: Phase) {
        let Some(record) = self.records.get_mut(path) else {
            return;
        };
        record.phase = phase;
        if matches!(phase, Phase::WaitingForSettings { .. }) {
            self.waiting.insert(path.clone());
        } else {
            self.waiting.remove(path);
        }
    }

    /// After a full pass (`scan` is the whole model; `waiting`: per scanned cgroup, whether it
    /// is a container that waits for its CPU settings): each waiting one moves to
    /// [`Phase::WaitingForSettings`] with one more try, or back to [`Phase::New`] once out of
    /// them or no longer waiting (the next pass that finds it waiting starts again). A container
    /// already settled stays so (its runtime config gives its settings). Walks along the model;
    /// returns when the next re-read is due.
    pub(super) fn track_settings(
        &mut self,
        scan: &Scan,
        mut waiting: impl Iterator<Item = bool>,
        now: Instant,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut index = Vec::new();
        for_each_entry(&mut self.records, scan, |cgroup, record| {
            let wants = waiting.next().unwrap_or(false);
            let Some(record) = record else {
                return;
            };
            let tries = record.phase.settings_tries();
            record.phase = match record.phase {
                Phase::Settled | Phase::Resized => return,
                _ if wants && tries < SETTINGS_RETRY.len() => {
                    let at = now + SETTINGS_RETRY[tries];
                    next = Some(next.map_or(at, |t| t.min(at)));
                    index.push(cgroup.path.clone());
                    Phase::WaitingForSettings { tries: tries + 1 }
                }
                _ => Phase::New,
            };
        });
        self.waiting = index.into_iter().collect();
        next
    }

    /// Some container waits for its CPU settings.
    pub(super) fn any_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The containers waiting for their CPU settings.
    pub(super) fn waiting(&self) -> Vec<CgroupPath> {
        self.waiting.iter().cloned().collect()
    }

    /// Drops `path`'s record and its indexes' entries; the record, if there was one.
    fn remove_record(&mut self, path: &CgroupPath) -> Option<Box<Record>> {
        // A container whose cgroup is gone asks for no isolation.
        self.isolated.retain(|_, (_, p)| p != path);
        let record = self.records.remove(path)?;
        self.pins_pending -= usize::from(record.pin_seen.is_some());
        self.waiting.remove(path);
        Some(record)
    }
}

impl Controller {
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
        if scan.complete && !self.model.complete {
            log::info!("a scan saw the whole tree again: new exclusive cpus are given again");
        }
        self.model.complete = scan.complete;
        self.metrics.scan_incomplete = scan.truncated;
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

    /// Puts what was read of a cgroup into the model. A cgroup new to it after the first pass
    /// (by whichever way it was seen first: its event, in either v1 hierarchy, or a scan) is
    /// tracked for the event-to-pin latency from `now`.
    pub(super) fn upsert(&mut self, mut cgroup: ScannedCgroup, now: Instant) -> bool {
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
            self.since_pass.structural = true;
        }
        match self.model.get_mut(&path) {
            Some(entry) if entry.cgroup.same_settings(&cgroup) => {
                // Keep the kernel's latest derived values; nothing to plan.
                entry.cgroup.effective_cpus = cgroup.effective_cpus;
                return false;
            }
            Some(_) => {}
            None if self.last_pass.planned => self.deadlines.burst.arrived(now),
            None => {}
        }
        // New after the first pass: timed until its pin (whichever way it was seen first).
        let track_pin = self.last_pass.planned && !self.model.contains_key(&path);
        if self.drifts(&path, &cgroup) {
            self.since_pass.drifted.insert(path.clone());
        }
        if !self.model.contains_key(&path) {
            self.since_pass.new.insert(path.clone());
        } else if !self.since_pass.new.contains(&path) {
            // Re-read with other values (a runtime writing a container's CPU settings after
            // making its cgroup, a resize): its pod's chain is planned again (a cgroup outside
            // any pod makes the pass a full one; drift is repaired on its own).
            self.since_pass.touched.insert(path.clone());
        }
        if track_pin {
            self.model.pins_pending += 1;
        }
        let entry = self.set_entry(path, cgroup, now);
        if track_pin {
            entry.pin_seen = Some(now);
        }
        true
    }

    /// Stores what was read of a cgroup; its cached classification survives when its CPU
    /// settings did not change (a cpuset write does not change how it is classified).
    pub(super) fn set_entry(
        &mut self,
        path: CgroupPath,
        cgroup: ScannedCgroup,
        now: Instant,
    ) -> &mut Record {
        self.bump();
        match self.model.records.entry(path) {
            Entry::Occupied(slot) => {
                let entry = slot.into_mut();
                if entry.cgroup.cpu != cgroup.cpu || entry.cgroup.relative != cgroup.relative {
                    entry.class = None;
                }
                entry.cgroup = cgroup;
                entry.updated = now;
                entry
            }
            Entry::Vacant(slot) => slot.insert(Box::new(Record {
                cgroup,
                updated: now,
                class: None,
                desired: None,
                phase: Phase::New,
                setup: Setup::Unseen,
                pin_seen: None,
                fight: None,
                said: SaidOnce::default(),
            })),
        }
    }

    /// Whether `cgroup` as read now holds other cpus than the last pass wanted there: another
    /// set, or none once it was set up (someone emptied it: on v1 a truncation caught between
    /// its two writes, on v2 a write that makes it inherit its parent's).
    fn drifts(&self, path: &CgroupPath, cgroup: &ScannedCgroup) -> bool {
        let Some(entry) = self.model.get(path) else {
            return false;
        };
        match (&entry.desired, cgroup.cpus.configured()) {
            (Some(desired), Some(now)) => desired != now,
            (Some(_), None) => entry.setup == Setup::Done && cgroup.cpus.value().is_some(),
            (None, _) => false,
        }
    }

    /// The cpus the last pass wanted for `path`.
    pub(super) fn desired(&self, path: &CgroupPath) -> Option<&CpuSet> {
        self.model.get(path).and_then(|e| e.desired.as_ref())
    }

    /// A cgroup that could not be read leaves the model only when it is gone (ENOENT): an
    /// unreadable one (EACCES, EMFILE …) keeps its entry, and so its assignment, until it can
    /// be read again or is gone.
    pub(super) fn remove_if_gone(&mut self, root: &CgroupPath) -> bool {
        if self.parts.hierarchy.cpuset.is_gone(root) {
            return self.removed(root);
        }
        if self.said.unreadable.first(root.clone()) {
            log::warn!(
                "cg={root} cannot be read (not gone): what it holds stays its own; make it \
                 readable by root without capabilities (the unit has none)"
            );
        }
        false
    }

    /// Reads `path` again into the model (or drops it when it is gone); whether the model
    /// changed.
    pub(super) fn reread(&mut self, path: &CgroupPath, now: Instant) -> bool {
        match self.parts.scanner.read_cgroup(path) {
            Some(c) => self.upsert(c, now),
            None => self.remove_if_gone(path),
        }
    }

    /// Forgets `root` and its subtree; the next pass is a full one.
    pub(super) fn remove_subtree(&mut self, root: &CgroupPath) -> bool {
        let removed = self.forget_subtree(root);
        self.since_pass.other |= removed;
        removed
    }

    pub(super) fn forget_subtree(&mut self, root: &CgroupPath) -> bool {
        let doomed = self.subtree(root);
        for path in &doomed {
            self.forget(path);
        }
        !doomed.is_empty()
    }

    /// `root` and every model path below it, in model order.
    pub(super) fn subtree(&self, root: &CgroupPath) -> Vec<CgroupPath> {
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
    pub(super) fn initialised(&mut self, scan: &Scan, now: Instant) -> Vec<bool> {
        let mut initialised = Vec::with_capacity(scan.cgroups.len());
        for_each_entry(&mut self.model, scan, |c, entry| {
            let empty = c.cpus.value().is_some_and(|v| v.is_empty())
                || c.mems.value().is_some_and(|v| v.is_empty());
            initialised.push(match entry {
                Some(entry) if !empty => {
                    entry.setup = Setup::Done;
                    true
                }
                Some(entry) => match entry.setup {
                    Setup::Done => true,
                    Setup::EmptySince(since) => {
                        now.saturating_duration_since(since) >= RUNTIME_SETUP_LIMIT
                    }
                    Setup::Unseen => {
                        entry.setup = Setup::EmptySince(now);
                        RUNTIME_SETUP_LIMIT.is_zero()
                    }
                },
                None => !empty,
            });
        });
        initialised
    }

    /// Forgets `path`: drops its record (and its entries in the model's indexes), what changed
    /// of it since the last pass, its runtime config and what was said of it. The next pass
    /// plans without it.
    pub(super) fn forget(&mut self, path: &CgroupPath) {
        self.bump();
        self.since_pass.forget(path);
        self.said.unreadable.forget(path);
        self.parts.quota_lifted.remove(path);
        let Some(record) = self.model.remove_record(path) else {
            return;
        };
        let Some(class) = record.class else {
            return;
        };
        if class.kind == CgroupKind::Container {
            self.metrics.containers = self.metrics.containers.saturating_sub(1);
        }
        if let Some(id) = &class.container_id {
            self.parts.runtime.forget(id);
        }
    }

    /// Reads a subtree again into the model.
    pub(super) fn rescan_subtree(&mut self, root: &CgroupPath, now: Instant) {
        for cgroup in self.parts.scanner.scan_subtree(root).cgroups {
            self.upsert(cgroup, now);
        }
    }

    pub(super) fn model_scan(&self) -> Scan {
        Scan {
            version: self.parts.hierarchy.version,
            kubepods: self.parts.scanner.kubepods().clone(),
            inherits: self.parts.scanner.inherits(),
            cgroups: self.model.values().map(|e| e.cgroup.clone()).collect(),
            skipped: Vec::new(),
            complete: self.model.complete,
            truncated: !self.model.complete,
            gone_pods: Default::default(),
        }
    }
}

/// Calls `f` with each scanned cgroup and its model entry (`None`: not in the model), in scan
/// order. A scan of the whole model in its order (a full pass's) is walked along the model; a
/// part of it (a chain) is looked up.
pub(super) fn for_each_entry(
    model: &mut BTreeMap<CgroupPath, Box<Record>>,
    scan: &Scan,
    mut f: impl FnMut(&ScannedCgroup, Option<&mut Record>),
) {
    let whole = scan.cgroups.len() == model.len()
        && scan
            .cgroups
            .iter()
            .zip(model.keys())
            .all(|(c, p)| c.path == *p);
    if whole {
        for (cgroup, entry) in scan.cgroups.iter().zip(model.values_mut()) {
            f(cgroup, Some(entry));
        }
    } else {
        for cgroup in &scan.cgroups {
            f(cgroup, model.get_mut(&cgroup.path).map(|e| &mut **e));
        }
    }
}
