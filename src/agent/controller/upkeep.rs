//! The model's upkeep: what was read of the tree (events, full scans) goes into its records
//! (see [`crate::agent::model`]), and cgroups that went are forgotten.

use super::*;

impl Controller {
    /// Merges a full scan: entries last updated before the scan started are replaced or, when
    /// the scan did not see them, dropped; entries updated since (by events that raced the
    /// scan) are newer and kept.
    /// Returns whether the model changed.
    pub fn merge_scan(&mut self, reconcile: ReconcileScan) -> bool {
        let ReconcileScan { started, scan } = reconcile;
        if scan.complete && !self.model.complete {
            log::info!("a scan saw the whole tree again: new exclusive cpus are given again");
        }
        self.model.complete = scan.complete;
        self.metrics.scan_incomplete = scan.truncated;
        // What the scan could not open or list is not gone (see `Model::gone_after`).
        let gone = self.model.gone_after(&scan, started);
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
        let desired = self.model.desired(&path);
        if let (Some(desired), Some(now_cpus)) = (desired, cgroup.cpus.configured()) {
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
        }) && self.model.desired(&path).is_some_and(|desired| {
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
        if self.model.drifts(&cgroup) {
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
        self.bump();
        let entry = self.model.store(cgroup, now);
        if track_pin {
            entry.pin_seen = Some(now);
        }
        true
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
        let doomed = self.model.subtree(root);
        for path in &doomed {
            self.forget(path);
        }
        !doomed.is_empty()
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

    /// The whole model as a scan (what a full pass plans).
    pub(super) fn model_scan(&self) -> Scan {
        let cgroups = self.model.values().map(|e| e.cgroup.clone()).collect();
        self.scan_of(cgroups, self.model.complete, Default::default())
    }

    /// `cgroups` of the model as a scan (`complete`: the planner may release what it does not
    /// see).
    pub(super) fn scan_of(
        &self,
        cgroups: Vec<ScannedCgroup>,
        complete: bool,
        gone_pods: std::collections::BTreeSet<String>,
    ) -> Scan {
        Scan {
            version: self.parts.hierarchy.version,
            kubepods: self.parts.scanner.kubepods().clone(),
            inherits: self.parts.scanner.inherits(),
            cgroups,
            skipped: Vec::new(),
            complete,
            truncated: !self.model.complete,
            gone_pods,
        }
    }
}
