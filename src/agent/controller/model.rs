//! The model: what the files of each cgroup said when last read, kept up to date from watcher
//! events and full scans, with what the passes learnt of it (its classification, the cpus the
//! last pass wanted there).

use std::collections::btree_map::Entry;

use super::drift::Fight;
use super::*;

#[derive(Debug, Clone)]
pub(super) struct ModelEntry {
    pub(super) cgroup: ScannedCgroup,
    pub(super) updated: Instant,
    /// The classification of `cgroup`, kept while its path and CPU settings stay the same and
    /// the runtime's config was found (or is not needed). `None`: classify in the next pass.
    pub(super) class: Option<Class>,
    /// The cpus the last pass wanted here, for drift detection and pin latency.
    pub(super) desired: Option<CpuSet>,
    /// Its cpuset has been seen set up: empty later means a foreign write (drift), not a
    /// runtime still at work.
    pub(super) initialised: bool,
    /// Until then, since when its cpuset has been seen empty: left to its runtime for
    /// [`RUNTIME_SETUP_LIMIT`] at most.
    pub(super) empty_since: Option<Instant>,
    /// New after the first pass: when it was seen, until its pin is timed (event → pin).
    pub(super) pin_seen: Option<Instant>,
    /// Someone else keeps rewriting its cpuset (see [`Controller::hold_off_drift`]).
    pub(super) fight: Option<Box<Fight>>,
    /// What classification noticed and the log said, so a re-classification (its CPU
    /// settings written after its config was read) does not say it again.
    pub(super) said: Vec<Notice>,
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
        if scan.complete && !self.complete {
            log::info!("a scan saw the whole tree again: new exclusive cpus are given again");
        }
        self.complete = scan.complete;
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
            self.structural = true;
        }
        match self.model.get_mut(&path) {
            Some(entry) if entry.cgroup.same_settings(&cgroup) => {
                // Keep the kernel's latest derived values; nothing to plan.
                entry.cgroup.effective_cpus = cgroup.effective_cpus;
                return false;
            }
            Some(_) => {}
            None if self.planned => self.last_new_cgroup = Some(now),
            None => {}
        }
        // New after the first pass: timed until its pin (whichever way it was seen first).
        let track_pin = self.planned && !self.model.contains_key(&path);
        if self.drifts(&path, &cgroup) {
            self.drifted.insert(path.clone());
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
            self.pins_pending += 1;
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
    ) -> &mut ModelEntry {
        self.bump();
        match self.model.entry(path) {
            Entry::Occupied(slot) => {
                let entry = slot.into_mut();
                if entry.cgroup.cpu != cgroup.cpu || entry.cgroup.relative != cgroup.relative {
                    entry.class = None;
                }
                entry.cgroup = cgroup;
                entry.updated = now;
                entry
            }
            Entry::Vacant(slot) => slot.insert(Box::new(ModelEntry {
                cgroup,
                updated: now,
                class: None,
                desired: None,
                initialised: false,
                empty_since: None,
                pin_seen: None,
                fight: None,
                said: Vec::new(),
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
            (Some(_), None) => entry.initialised && cgroup.cpus.value().is_some(),
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
        if self.unreadable_said.insert(root.clone()) {
            log::warn!(
                "cg={root} cannot be read (not gone): what it holds stays its own; make it \
                 readable by root without capabilities (the unit has none)"
            );
        }
        false
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
                    entry.initialised = true;
                    entry.empty_since = None;
                    true
                }
                Some(entry) if entry.initialised => true,
                Some(entry) => {
                    let since = *entry.empty_since.get_or_insert(now);
                    now.saturating_duration_since(since) >= RUNTIME_SETUP_LIMIT
                }
                None => !empty,
            });
        });
        initialised
    }

    pub(super) fn forget(&mut self, path: &CgroupPath) {
        self.bump();
        self.structural = true;
        self.since_pass.new.remove(path);
        self.since_pass.touched.remove(path);
        // A container whose cgroup is gone asks for no isolation.
        self.isolated.retain(|_, (_, p)| p != path);
        let entry = self.model.remove(path);
        if entry.as_ref().is_some_and(|e| e.pin_seen.is_some()) {
            self.pins_pending -= 1;
        }
        let class = entry.and_then(|e| e.class);
        if class
            .as_ref()
            .is_some_and(|c| c.kind == CgroupKind::Container)
        {
            self.metrics.containers = self.metrics.containers.saturating_sub(1);
        }
        if let Some(id) = class.as_ref().and_then(|c| c.container_id.as_ref()) {
            self.parts.runtime.forget(id);
            self.settled.remove(id);
            self.resized.remove(id);
        }
        self.unreadable_said.remove(path);
        self.parts.quota_lifted.remove(path);
        self.settings_wait.remove(path);
        self.drifted.remove(path);
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
            cgroups: self.model.values().map(|e| e.cgroup.clone()).collect(),
            skipped: Vec::new(),
            complete: self.complete,
            truncated: !self.complete,
            gone_pods: Default::default(),
        }
    }
}

/// Calls `f` with each scanned cgroup and its model entry (`None`: not in the model), in scan
/// order. A scan of the whole model in its order (a full pass's) is walked along the model; a
/// part of it (a chain) is looked up.
pub(super) fn for_each_entry(
    model: &mut BTreeMap<CgroupPath, Box<ModelEntry>>,
    scan: &Scan,
    mut f: impl FnMut(&ScannedCgroup, Option<&mut ModelEntry>),
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
