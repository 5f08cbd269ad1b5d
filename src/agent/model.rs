//! The model: one record per cgroup — what its files said when last read and everything the
//! agent learnt of it (its classification, the cpus the last pass wanted there, where it is in
//! its life, its pin timing, a fight with another writer, what the log said of it) — and the
//! few indexes kept beside the records. The controller keeps it up to date from watcher events
//! and full scans; forgetting a cgroup drops its record. Nothing here reads the tree.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cgroupfs::{CgroupPath, CpuSettings, Scan, ScannedCgroup, SkipReason};
use crate::classify::{CgroupKind, Classification, Exclusivity, Isolation, Notice, SharedReason};
use crate::cpuset::CpuSet;
use crate::effects::Cgroups;
use crate::logging::SaidOnce;
use crate::planner::chain::Mode;
use crate::planner::{entitlement, DesiredCgroup, Entitlement, Step};
use crate::state::{AssignmentKey, Assignments};

pub(crate) mod fight;
pub(crate) mod since_pass;

pub(crate) use fight::Fight;
pub(crate) use since_pass::SincePass;

/// How long a new container may wait for its CPU settings before the controller stops
/// re-reading it on its own (events still wake it).
pub(crate) const SETTINGS_RETRY: [Duration; 4] = [
    Duration::from_millis(5),
    Duration::from_millis(25),
    Duration::from_millis(100),
    Duration::from_millis(500),
];

/// How long a new container is tracked for the event → pin latency figure.
pub(crate) const PIN_TRACKING_LIMIT: Duration = Duration::from_secs(60);

/// How long a cgroup with an empty cpuset is left to its runtime (runc copies the parent's set
/// within milliseconds) before the agent writes it itself.
pub(crate) const RUNTIME_SETUP_LIMIT: Duration = Duration::from_secs(1);

/// Where a cgroup is in its life, as far as its CPU request goes (it matters for containers;
/// other cgroups stay `New`). A cgroup gone is no phase: its record is dropped
/// (the controller's `forget`).
///
/// ```text
///   New ──(CPU settings unreadable, a full pass)──► WaitingForSettings { tries } ──(read, or
///    │                                                 out of re-reads)──► New
///    └──(its cgroup holds its runtime config's CPU request, or it ran when the agent started)
///          ──► Settled ◄──► Resized (its cgroup differs from the config: classified from it)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
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
    pub(crate) fn settled(self) -> bool {
        matches!(self, Phase::Settled | Phase::Resized)
    }

    /// The re-reads it had while waiting for its CPU settings.
    pub(crate) fn settings_tries(self) -> usize {
        match self {
            Phase::WaitingForSettings { tries } => tries,
            _ => 0,
        }
    }
}

/// Its cpuset's setup by its runtime (on v1 a new cgroup's cpuset is empty until the runtime
/// copies its parent's into it), as passes saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setup {
    /// No pass has seen it yet.
    Unseen,
    /// Passes have seen it empty since then: left to its runtime for [`RUNTIME_SETUP_LIMIT`].
    EmptySince(Instant),
    /// Seen set up: empty later means a foreign write (drift), not a runtime still at work.
    Done,
}

/// What the agent knows of one cgroup.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) cgroup: ScannedCgroup,
    pub(crate) updated: Instant,
    /// The classification of `cgroup`, kept while its path and CPU settings stay the same and
    /// the runtime's config was found (or is not needed). `None`: classify in the next pass.
    pub(crate) class: Option<Arc<Classification>>,
    /// The cpus the last pass wanted here, for drift detection and pin latency.
    pub(crate) desired: Option<CpuSet>,
    /// Where it is in its life (see [`Phase`]); change it with [`Model::set_phase`].
    phase: Phase,
    /// Its cpuset's setup by its runtime.
    pub(crate) setup: Setup,
    /// New after the first pass: when it was seen, until its pin is timed (event → pin).
    pub(crate) pin_seen: Option<Instant>,
    /// Someone else keeps rewriting its cpuset (see [`Fight`]).
    pub(crate) fight: Option<Box<Fight>>,
    /// What classification noticed and the log said, so a re-classification (its CPU
    /// settings written after its config was read) does not say it again.
    pub(crate) said: SaidOnce<Notice>,
}

impl Record {
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }
}

/// The records by path (the model derefs to that map), and the few indexes kept beside them
/// so no question a pass asks walks every record: how many pins are still timed, how many
/// containers wait for their CPU settings, which containers ask for isolation.
#[derive(Debug)]
pub(crate) struct Model {
    /// Boxed: B-tree nodes hold eleven slots, mostly half empty, and a record is large.
    records: BTreeMap<CgroupPath, Box<Record>>,
    /// Records whose pin is still timed (see [`Record::pin_seen`]).
    pub(crate) pins_pending: usize,
    /// Records in [`Phase::WaitingForSettings`] (their timer re-reads them, and walks no other).
    waiting: BTreeSet<CgroupPath>,
    /// The isolation annotations of the containers that hold exclusive cpus or ask for them.
    /// (What they ask for, and the container's cgroup.)
    pub(crate) isolated: HashMap<AssignmentKey, (Isolation, CgroupPath)>,
    /// Whether the last full scan saw the whole tree (false past its limit): the planner
    /// releases nothing it did not see.
    pub(crate) complete: bool,
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
    pub(crate) fn set_phase(&mut self, path: &CgroupPath, phase: Phase) {
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
    pub(crate) fn track_settings(
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
    pub(crate) fn any_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The containers waiting for their CPU settings.
    pub(crate) fn waiting(&self) -> Vec<CgroupPath> {
        self.waiting.iter().cloned().collect()
    }

    /// Drops `path`'s record and its indexes' entries; the record, if there was one.
    pub(crate) fn remove_record(&mut self, path: &CgroupPath) -> Option<Box<Record>> {
        // A container whose cgroup is gone asks for no isolation.
        self.isolated.retain(|_, (_, p)| p != path);
        let record = self.records.remove(path)?;
        self.pins_pending -= usize::from(record.pin_seen.is_some());
        self.waiting.remove(path);
        Some(record)
    }
}
impl Model {
    /// The cpus the last pass wanted for `path`.
    pub(crate) fn desired(&self, path: &CgroupPath) -> Option<&CpuSet> {
        self.records.get(path).and_then(|e| e.desired.as_ref())
    }

    /// Stores what was read of a cgroup at `now`; its cached classification survives when its
    /// CPU settings did not change (a cpuset write does not change how it is classified).
    /// The record keeps its key's path bytes (and its relative path, when equal) instead of the
    /// read's equal copies: else every event's re-read and every full reconcile would leave the
    /// model holding a second copy of each path beside its key.
    pub(crate) fn store(&mut self, mut cgroup: ScannedCgroup, now: Instant) -> &mut Record {
        match self.records.entry(cgroup.path.clone()) {
            Entry::Occupied(slot) => {
                cgroup.path = slot.key().clone();
                let entry = slot.into_mut();
                if entry.cgroup.relative == cgroup.relative {
                    cgroup.relative = entry.cgroup.relative.clone();
                } else {
                    entry.class = None;
                }
                if entry.cgroup.cpu != cgroup.cpu {
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

    /// The records a full scan that started at `started` finds gone: not seen, last updated
    /// before it started, and not below a directory it could not list (what it could not open
    /// or list is not gone). None when the scan stopped at its limit (it says nothing of what
    /// it did not see).
    pub(crate) fn gone_after(&self, scan: &Scan, started: Instant) -> Vec<CgroupPath> {
        if !scan.complete {
            return Vec::new();
        }
        let seen: HashSet<&CgroupPath> = scan.cgroups.iter().map(|c| &c.path).collect();
        let unreadable: Vec<&CgroupPath> = scan
            .skipped
            .iter()
            .filter(|s| s.reason == SkipReason::Unlistable)
            .map(|s| &s.path)
            .collect();
        self.records
            .iter()
            .filter(|(p, e)| {
                !seen.contains(p)
                    && e.updated <= started
                    && !unreadable.iter().any(|u| p.strip_prefix(u).is_some())
            })
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Whether `cgroup` as read now holds other cpus than the last pass wanted there: another
    /// set, or none once it was set up (someone emptied it: on v1 a truncation caught between
    /// its two writes, on v2 a write that makes it inherit its parent's).
    pub(crate) fn drifts(&self, cgroup: &ScannedCgroup) -> bool {
        let Some(entry) = self.records.get(&cgroup.path) else {
            return false;
        };
        match (&entry.desired, cgroup.cpus.configured()) {
            (Some(desired), Some(now)) => desired != now,
            (Some(_), None) => entry.setup == Setup::Done && cgroup.cpus.value().is_some(),
            (None, _) => false,
        }
    }

    /// `root` and every path below it, in model order.
    pub(crate) fn subtree(&self, root: &CgroupPath) -> Vec<CgroupPath> {
        // Paths order bytewise, so a sibling such as `…/sub-2` sorts between `…/sub` and
        // `…/sub/x`: walk every path that starts with the root's bytes, keep the descendants.
        self.records
            .range(root.clone()..)
            .take_while(|(p, _)| p.as_bytes().starts_with(root.as_bytes()))
            .filter(|(p, _)| p.strip_prefix(root).is_some())
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Per scanned cgroup: whether an empty cpuset there is drift rather than a runtime still
    /// setting it up (it was seen set up before, or has been empty for [`RUNTIME_SETUP_LIMIT`]).
    /// Each record's [`Setup`] moves on with what `scan` shows at `now`.
    pub(crate) fn initialised(&mut self, scan: &Scan, now: Instant) -> Vec<bool> {
        let mut initialised = Vec::with_capacity(scan.cgroups.len());
        for_each_entry(&mut self.records, scan, |c, entry| {
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

    /// The fought-over cgroups to read again (and so repair) at `now`: their backoff ended with
    /// a foreign value not yet repaired. Fights long quiet are forgotten. Also when the next of
    /// the others falls due.
    pub(crate) fn due_fights(&mut self, now: Instant) -> (Vec<CgroupPath>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (path, entry) in self.records.iter_mut() {
            let Some(fight) = &mut entry.fight else {
                continue;
            };
            match fight.resume(now) {
                fight::Resume::Forget => entry.fight = None,
                fight::Resume::Now => due.push(path.clone()),
                fight::Resume::At(until) => next = Some(next.map_or(until, |t| t.min(until))),
                fight::Resume::Nothing => {}
            }
        }
        (due, next)
    }

    /// Event → pin latency: a new container counts once (`record` is given its latency), when
    /// its cpuset reads back as desired and its CPU settings were known (before, it waits in
    /// the shared pool for them); it is no longer timed then, nor after [`PIN_TRACKING_LIMIT`].
    /// `classes` are `scan`'s; `pinned_at(i)`: when scanned cgroup `i`'s writes were made.
    pub(crate) fn time_pins(
        &mut self,
        scan: &Scan,
        classes: &[Arc<Classification>],
        pinned_at: impl Fn(usize) -> Instant,
        mut record: impl FnMut(Duration),
    ) {
        if self.pins_pending == 0 {
            return;
        }
        let now = Instant::now();
        let (mut index, mut timed) = (0, 0);
        for_each_entry(&mut self.records, scan, |_, entry| {
            let (i, class) = (index, &classes[index]);
            index += 1;
            let Some((entry, seen)) = entry.and_then(|e| e.pin_seen.map(|seen| (e, seen))) else {
                return;
            };
            let current = entry.cgroup.cpus.configured();
            let pinned = class.kind == CgroupKind::Container
                && !waits_for_settings(class)
                && current.is_some()
                && current == entry.desired.as_ref();
            if pinned {
                record(pinned_at(i).saturating_duration_since(seen));
            }
            let done = class.kind != CgroupKind::Container || pinned;
            if done || now.saturating_duration_since(seen) >= PIN_TRACKING_LIMIT {
                entry.pin_seen = None;
                timed += 1;
            }
        });
        self.pins_pending -= timed;
    }
}

impl Model {
    /// `step`, written at `at`: its record holds the written value, and is as new as the
    /// write (a full scan that started before it may have read the old value, and does not
    /// replace it).
    pub(crate) fn written(&mut self, step: &Step, at: Instant) {
        if let Some(record) = self.records.get_mut(&step.path) {
            record.cgroup.assume_written(step.file, &step.value);
            record.updated = at;
        }
    }

    /// Each record of `scan` keeps the cpus a plan wants there (`desired`, in scan order);
    /// those whose values the pass does not plan (`owns` says no: a chain's ancestors, whose
    /// narrowings wait for the full pass) keep what they hold: until then that is what is
    /// wanted there, not drift.
    ///
    /// A pool member a chain planned alone (cgroup v2: its children, not in the chain, follow
    /// it) takes the cgroups below it that wanted what it wanted along to its new set, as a
    /// full pass would: a drift repair of one of them writes the pool as it is now, never the
    /// one before a pin took some of it.
    pub(crate) fn take_desired(&mut self, scan: &Scan, desired: &[DesiredCgroup], mode: &Mode) {
        let alone = mode.alone();
        let before: Vec<Option<CpuSet>> = alone.iter().map(|p| self.desired(p).cloned()).collect();
        let mut desired = desired.iter();
        for_each_entry(&mut self.records, scan, |_, entry| {
            let wanted = &desired.next().expect("one desired set per cgroup").cpus;
            if let Some(entry) = entry.filter(|e| e.desired != *wanted) {
                entry.desired.clone_from(wanted);
            }
        });
        for cgroup in scan.cgroups.iter().filter(|c| !mode.owns(&c.path)) {
            if let Some(entry) = self.records.get_mut(&cgroup.path) {
                entry.desired = entry.cgroup.cpus.configured().cloned();
            }
        }
        for (member, old) in alone.iter().zip(before) {
            match (old, self.desired(member).cloned()) {
                (Some(old), Some(new)) if old != new => self.follow(member, &old, &new),
                _ => {}
            }
        }
    }

    /// The cgroups below `member` whose desired set was `old` (they followed it) want `new`.
    fn follow(&mut self, member: &CgroupPath, old: &CpuSet, new: &CpuSet) {
        let below = self.records.range_mut(member.clone()..);
        let below = below.take_while(|(p, _)| p.as_bytes().starts_with(member.as_bytes()));
        for (path, record) in below {
            let under = path != member && path.strip_prefix(member).is_some();
            if under && record.desired.as_ref() == Some(old) {
                record.desired = Some(new.clone());
            }
        }
    }

    /// Whether `cgroup` as read now changes more than the cpus of its record: it is new, or
    /// other settings changed, or its `cpuset.cpus` changed to something the last pass did not
    /// want there that is not a foreign value (drift), which is written back without planning.
    pub(crate) fn changes_structure(&self, cgroup: &ScannedCgroup) -> bool {
        let Some(record) = self.records.get(&cgroup.path) else {
            return true;
        };
        let known = &record.cgroup;
        let others_same = known.relative == cgroup.relative
            && known.cpu == cgroup.cpu
            && known.mems == cgroup.mems;
        let drift = record.desired.as_ref().is_some_and(|desired| {
            let now = cgroup.cpus.configured();
            now.is_some_and(|now| now != desired && !now.is_empty())
        });
        !(known.same_settings(cgroup) || (others_same && drift))
    }

    /// Nothing waits for a pass: every cgroup is classified, none is left to its runtime with
    /// an empty cpuset, no container waits for its CPU settings.
    pub(crate) fn at_rest(&self) -> bool {
        !self.any_waiting()
            && self
                .values()
                .all(|e| e.class.is_some() && !matches!(e.setup, Setup::EmptySince(_)))
    }

    /// The pods (by uid) of the classified cgroups.
    pub(crate) fn pod_uids(&self) -> HashSet<String> {
        let classes = self.values().filter_map(|e| e.class.as_deref());
        classes.filter_map(|c| c.pod_uid.clone()).collect()
    }

    /// Indexes the containers of `scan` that ask for isolation or hold exclusive cpus in
    /// `assignments` (`classes` are `scan`'s): what the host effects are asked for. A key is
    /// built only for a container that may hold cpus, so the index stays bounded by them.
    /// `all`: the scan is the whole model (the index is built again).
    pub(crate) fn index_isolated(
        &mut self,
        scan: &Scan,
        classes: &[Arc<Classification>],
        assignments: &Assignments,
        all: bool,
    ) {
        if all {
            self.isolated.clear();
        }
        for (class, cgroup) in classes.iter().zip(&scan.cgroups) {
            let asks = class.isolation.any();
            let may_hold = asks || !matches!(entitlement(class), Entitlement::Shared);
            if class.kind != CgroupKind::Container || !may_hold {
                continue;
            }
            let Some(key) = class.assignment_key() else {
                continue;
            };
            if asks || assignments.get(&key).is_some() {
                let isolated = (class.isolation, cgroup.path.clone());
                self.isolated.insert(key, isolated);
            }
        }
    }

    /// How many containers `cpu-shared.crio.io` is in force for (see
    /// [`crate::projection::cpu_shared`]). Only a container holding exclusive cpus can be one,
    /// and every such container is in the isolation index: it is walked, not every record (at
    /// 2,500 pods a walk of 10,000 records on every pin's pass).
    pub(crate) fn cpu_shared(&self, assignments: &Assignments) -> usize {
        let known = self.isolated.values().filter_map(|(_, path)| {
            let entry = self.get(path)?;
            let class = entry.class.as_deref().filter(|c| c.cpu_shared)?;
            Some((class, entry.cgroup.cpus.configured()))
        });
        crate::projection::cpu_shared(known, assignments)
    }

    /// The chains of `roots`: each root's subtree and its ancestors in the model; and each of
    /// `alone` (without its subtree) with its ancestors.
    pub(crate) fn chains(
        &self,
        roots: &[CgroupPath],
        alone: &[CgroupPath],
    ) -> BTreeSet<CgroupPath> {
        let mut paths = BTreeSet::new();
        for root in roots.iter().chain(alone) {
            let mut up = root.parent();
            while let Some(parent) = up.filter(|p| self.contains_key(p)) {
                up = parent.parent();
                paths.insert(parent);
            }
        }
        for root in roots {
            paths.extend(self.subtree(root));
        }
        paths.extend(alone.iter().filter(|p| self.contains_key(p)).cloned());
        paths
    }

    /// The names of `path`'s children in the model.
    pub(crate) fn child_names(&self, path: &CgroupPath) -> HashSet<std::ffi::OsString> {
        let below = self.records.range(path.clone()..).skip(1);
        let below = below.take_while(|(p, _)| p.as_bytes().starts_with(path.as_bytes()));
        below
            .filter(|(p, _)| p.parent_bytes() == Some(path.as_bytes()))
            .filter_map(|(p, _)| p.name().map(ToOwned::to_owned))
            .collect()
    }
}

/// A container whose CPU settings cannot be read yet (it waits in the shared pool for them).
pub(crate) fn waits_for_settings(class: &Classification) -> bool {
    matches!(
        class.exclusivity,
        Exclusivity::Shared {
            reason: SharedReason::CpuSettingsUnavailable
        }
    )
}

/// The effects plan from the model (the quota lift from its CPU settings).
impl Cgroups for Model {
    fn cpu(&self, path: &CgroupPath) -> Option<&CpuSettings> {
        self.get(path).map(|record| &record.cgroup.cpu)
    }

    fn pod_of(&self, container: &CgroupPath) -> Option<CgroupPath> {
        let parent = container.parent()?;
        let class = self.get(&parent)?.class.as_ref()?;
        (class.kind == CgroupKind::Pod).then_some(parent)
    }
}

/// Calls `f` with each scanned cgroup and its model entry (`None`: not in the model), in scan
/// order. A scan of the whole model in its order (a full pass's) is walked along the model; a
/// part of it (a chain) is looked up.
pub(crate) fn for_each_entry(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroupfs::{CgroupDriver, CgroupVersion, CpuSettings, FileValue, SkippedEntry};
    use crate::classify::{classify, CgroupNaming};

    fn path(text: &str) -> CgroupPath {
        CgroupPath::new(text).unwrap()
    }

    fn cgroup(text: &str, cpus: &str) -> ScannedCgroup {
        let cpus: CpuSet = cpus.parse().unwrap();
        ScannedCgroup {
            path: path(text),
            relative: path(text),
            cpus: FileValue::Value(cpus.clone()),
            mems: FileValue::Value("0".parse().unwrap()),
            effective_cpus: FileValue::Value(cpus),
            cpu: CpuSettings::V2 {
                max: FileValue::Missing,
                weight: FileValue::Missing,
            },
        }
    }

    fn scan(cgroups: Vec<ScannedCgroup>) -> Scan {
        Scan {
            version: CgroupVersion::V2,
            kubepods: path("kubepods"),
            inherits: true,
            cgroups,
            skipped: Vec::new(),
            complete: true,
            truncated: false,
            gone_pods: Default::default(),
        }
    }

    #[test]
    fn a_chain_is_its_roots_subtrees_and_their_ancestors_in_the_model() {
        let mut model = Model::default();
        let now = Instant::now();
        for p in [
            "k",
            "k/q",
            "k/q/pod",
            "k/q/pod/c",
            "k/q/other",
            "k/q/other/c",
        ] {
            model.store(cgroup(p, "0-3"), now);
        }
        let chains = model.chains(&[path("k/q/pod")], &[]);
        let want = ["k", "k/q", "k/q/pod", "k/q/pod/c"].map(path);
        assert_eq!(chains, want.into_iter().collect());
        // A cgroup planned alone comes with its ancestors, not its subtree.
        let chains = model.chains(&[path("k/q/pod")], &[path("k/q/other")]);
        let want = ["k", "k/q", "k/q/other", "k/q/pod", "k/q/pod/c"].map(path);
        assert_eq!(chains, want.into_iter().collect());
        let names = model.child_names(&path("k/q"));
        assert_eq!(names, ["pod", "other"].map(std::ffi::OsString::from).into());
    }

    #[test]
    fn a_plans_desired_sets_are_taken_where_the_pass_owns_the_cgroup() {
        let mut model = Model::default();
        let now = Instant::now();
        let (parent, pod) = (cgroup("k", "0-3"), cgroup("k/pod", "0-3"));
        let scan = scan(vec![parent.clone(), pod.clone()]);
        model.store(parent, now);
        model.store(pod, now);
        let wanted = |cpus: &str| DesiredCgroup {
            cpus: Some(cpus.parse().unwrap()),
            mems: None,
            cpus_inherited: false,
            mems_inherited: false,
        };
        let desired = [wanted("1-3"), wanted("2")];
        let chain = Mode::Chain {
            roots: vec![path("k/pod")],
            pool: None,
        };
        model.take_desired(&scan, &desired, &chain);
        assert_eq!(model.desired(&path("k/pod")), Some(&"2".parse().unwrap()));
        // Not owned: what it holds is what is wanted there until a full pass.
        assert_eq!(model.desired(&path("k")), Some(&"0-3".parse().unwrap()));
        // A write taken in: the record holds it, as new as the write.
        let later = now + Duration::from_millis(1);
        let step = Step::new(
            path("k/pod"),
            crate::cgroupfs::InterfaceFile::CpusetCpus,
            "2".into(),
            crate::planner::WriteStep::Narrow,
        );
        model.written(&step, later);
        let record = &model[&path("k/pod")];
        assert_eq!(record.cgroup.cpus.configured(), Some(&"2".parse().unwrap()));
        assert_eq!(record.updated, later);
        // A foreign value is drift, not a change of structure; other settings are.
        assert!(!model.changes_structure(&cgroup("k/pod", "0-1")));
        assert!(!model.changes_structure(&cgroup("k/pod", "2")));
        let mut moved = cgroup("k/pod", "2");
        moved.mems = FileValue::Value("1".parse().unwrap());
        assert!(model.changes_structure(&moved));
        assert!(model.changes_structure(&cgroup("k/new", "2")));
        // Neither classified yet: a pass is owed.
        assert!(!model.at_rest());
    }

    #[test]
    fn a_subtree_is_its_descendants_not_a_sibling_that_sorts_among_them() {
        let mut model = Model::default();
        let now = Instant::now();
        for p in [
            "k/sub",
            "k/sub-2",
            "k/sub-2/y",
            "k/sub/x",
            "k/sub/x/z",
            "k/subway",
        ] {
            model.store(cgroup(p, "0-3"), now);
        }
        assert_eq!(
            model.subtree(&path("k/sub")),
            [path("k/sub"), path("k/sub/x"), path("k/sub/x/z")]
        );
    }

    #[test]
    fn the_waiting_index_follows_the_phases_and_the_records() {
        let mut model = Model::default();
        let now = Instant::now();
        let (a, b) = (path("k/a"), path("k/b"));
        model.store(cgroup("k/a", "0"), now);
        model.store(cgroup("k/b", "0"), now);
        let all = scan(vec![cgroup("k/a", "0"), cgroup("k/b", "0")]);
        let next = model.track_settings(&all, [true, false].into_iter(), now);
        assert_eq!(next, Some(now + SETTINGS_RETRY[0]));
        assert_eq!(model[&a].phase(), Phase::WaitingForSettings { tries: 1 });
        assert_eq!(model.waiting(), std::slice::from_ref(&a));
        // Out of re-reads: back to New; a settled one stays settled.
        model.set_phase(&b, Phase::Settled);
        for _ in 1..SETTINGS_RETRY.len() {
            model.track_settings(&all, [true, true].into_iter(), now);
        }
        assert_eq!(model[&a].phase().settings_tries(), SETTINGS_RETRY.len());
        assert_eq!(
            model.track_settings(&all, [true, true].into_iter(), now),
            None
        );
        assert_eq!(
            (model[&a].phase(), model[&b].phase()),
            (Phase::New, Phase::Settled)
        );
        model.set_phase(&a, Phase::WaitingForSettings { tries: 2 });
        assert!(model.any_waiting());
        assert!(model.remove_record(&a).is_some());
        assert!(!model.any_waiting() && model.remove_record(&a).is_none());
    }

    #[test]
    fn an_empty_cpuset_is_left_to_its_runtime_for_a_while_unless_it_was_set_up() {
        let mut model = Model::default();
        let t0 = Instant::now();
        model.store(cgroup("k/new", ""), t0);
        model.store(cgroup("k/old", ""), t0);
        model.get_mut(&path("k/old")).unwrap().setup = Setup::Done;
        let both = scan(vec![cgroup("k/new", ""), cgroup("k/old", "")]);
        assert_eq!(model.initialised(&both, t0), [false, true]);
        assert_eq!(model[&path("k/new")].setup, Setup::EmptySince(t0));
        let later = t0 + RUNTIME_SETUP_LIMIT;
        assert_eq!(model.initialised(&both, later), [true, true]);
        let set_up = scan(vec![cgroup("k/new", "1"), cgroup("k/unknown", "")]);
        assert_eq!(model.initialised(&set_up, t0), [true, false]);
        assert_eq!(model[&path("k/new")].setup, Setup::Done);
    }

    #[test]
    fn drift_is_another_set_than_desired_or_none_once_set_up() {
        let mut model = Model::default();
        let now = Instant::now();
        let record = model.store(cgroup("k/a", "2-3"), now);
        let kubepods = path("kubepods");
        let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, &kubepods);
        let class = classify(&naming, &path("besteffort"), &record.cgroup.cpu, None);
        record.class = Some(Arc::new(class));
        assert!(!model.drifts(&cgroup("k/a", "0")), "nothing desired yet");
        let record = model.get_mut(&path("k/a")).unwrap();
        record.desired = Some("2-3".parse().unwrap());
        assert!(model.drifts(&cgroup("k/a", "0-3")));
        assert!(!model.drifts(&cgroup("k/a", "2-3")));
        assert!(
            !model.drifts(&cgroup("k/a", "")),
            "not set up yet: a runtime at work"
        );
        model.get_mut(&path("k/a")).unwrap().setup = Setup::Done;
        assert!(model.drifts(&cgroup("k/a", "")));
        // A cpuset write keeps the cached classification.
        model.store(cgroup("k/a", "1"), now);
        assert!(model[&path("k/a")].class.is_some());
        assert_eq!(model.desired(&path("k/a")), Some(&"2-3".parse().unwrap()));
    }

    /// A re-read (an event's, a scan's) brings equal paths in allocations of its own; the
    /// record keeps the map key's bytes, so the model holds each path once, not once more per
    /// cgroup after every full reconcile.
    #[test]
    fn a_re_read_record_shares_its_path_with_the_key() {
        let kubepods = path("kubepods");
        let read = || {
            let whole = path("kubepods/pod1/c1");
            ScannedCgroup {
                relative: whole.strip_prefix(&kubepods).unwrap(),
                path: whole,
                ..cgroup("kubepods/pod1/c1", "0")
            }
        };
        let mut model = Model::default();
        let now = Instant::now();
        model.store(read(), now);
        model.store(read(), now);
        let (key, record) = model.records.iter().next().unwrap();
        let key = key.as_bytes().as_ptr();
        assert_eq!(record.cgroup.path.as_bytes().as_ptr(), key);
        let relative = record.cgroup.relative.as_bytes().as_ptr();
        assert_eq!(relative, key.wrapping_add("kubepods/".len()));
        assert_eq!(record.cgroup.relative, path("pod1/c1"));
    }

    #[test]
    fn a_full_scan_finds_gone_what_it_did_not_see_and_nobody_updated_since() {
        let mut model = Model::default();
        let t0 = Instant::now();
        let started = t0 + Duration::from_millis(5);
        for p in ["k/seen", "k/gone", "k/locked/x"] {
            model.store(cgroup(p, "0"), t0);
        }
        model.store(cgroup("k/raced", "0"), started + Duration::from_millis(1));
        let mut full = scan(vec![cgroup("k/seen", "0")]);
        full.skipped.push(SkippedEntry {
            path: path("k/locked"),
            reason: SkipReason::Unlistable,
        });
        assert_eq!(model.gone_after(&full, started), [path("k/gone")]);
        full.complete = false;
        assert!(model.gone_after(&full, started).is_empty());
    }
}
