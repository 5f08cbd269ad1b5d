//! Drift: foreign changes of a cgroup's `cpuset.cpus`, repaired without planning when nothing
//! else changed, and fights with another writer, repaired at a backed-off pace.

use super::*;

/// More foreign changes of one cgroup's cpuset than this within [`FIGHT_WINDOW`] is a fight.
pub(super) const FIGHT_DRIFTS: u32 = 10;
pub(super) const FIGHT_WINDOW: Duration = Duration::from_secs(1);
/// The first wait before repairing a fought-over cgroup, doubling while the fight goes on.
pub(super) const FIGHT_BACKOFF_MIN: Duration = Duration::from_millis(100);
pub(super) const FIGHT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// This long without a foreign change ends a fight.
pub(super) const FIGHT_QUIET: Duration = Duration::from_secs(30);

/// A cgroup whose `cpuset.cpus` someone else keeps changing.
#[derive(Debug, Clone)]
pub(super) struct Fight {
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
    /// Counts a foreign change to be repaired now, in the current [`FIGHT_WINDOW`]; whether it
    /// makes a fight (the repairs back off from now on).
    fn count_drift(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.window_start) > FIGHT_WINDOW {
            self.window_start = now;
            self.drifts = 0;
        }
        self.drifts += 1;
        if self.drifts <= FIGHT_DRIFTS {
            return false;
        }
        self.backoff = Some(FIGHT_BACKOFF_MIN);
        self.until = Some(now + FIGHT_BACKOFF_MIN);
        true
    }

    /// No fight yet: a first foreign change at `now`.
    pub(super) fn new(now: Instant) -> Fight {
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

impl Controller {
    /// Drift repair without planning: when the only change since a pass that wrote all it
    /// planned is foreign `cpuset.cpus` values in cgroups it planned, the plan is unchanged
    /// (it does not depend on those values), and they get its values back: parents first (a
    /// foreign narrowing of a parent took its children along). `None`: plan instead (also
    /// when a write fails: the pass sorts it out).
    pub(super) fn repair_drift(&mut self) -> Option<PassOutcome> {
        if self.since_pass.structural
            || self.since_pass.drifted.is_empty()
            || !self.last_pass.settled
            || self.deadlines.held_back.is_owed()
            || self.deadlines.full_pass.is_owed()
            || !self.deadlines.settling.is_empty()
            // CPU hotplug rewrites every v1 cpuset; the planned values may hold a cpu that is
            // offline now (the kernel refuses it: EINVAL): a full pass plans within the limits.
            || self.limits_moved()
        {
            return None;
        }
        let mut repairs = Vec::with_capacity(self.since_pass.drifted.len());
        for path in &self.since_pass.drifted {
            repairs.push((path.clone(), self.desired(path)?.clone()));
        }
        let plan = crate::planner::order::repairs(repairs);
        let known = crate::planner::Known::nothing();
        let (new_children, budget) = (NewChildren::NarrowNow, crate::writer::Budget::All);
        let executed =
            crate::writer::execute(&self.parts.hierarchy, plan, &known, new_children, budget);
        self.metrics.writes_issued += executed.done.len() as u64;
        let written_at = Instant::now();
        let mut outcome = PassOutcome::default();
        for step in executed.written() {
            outcome.writes += 1;
            self.metrics.drift_repairs += 1;
            self.since_pass.drifted.remove(&step.path);
            if let Some(entry) = self.model.get_mut(&step.path) {
                entry.cgroup.assume_written(step.file, &step.value);
                // As new as the write (see `take_written`).
                entry.updated = written_at;
            }
            self.bump();
        }
        (outcome.writes == executed.done.len()).then_some(outcome)
    }

    /// Records a foreign change of `path`'s `cpuset.cpus`; whether its repair must wait. More
    /// than [`FIGHT_DRIFTS`] within [`FIGHT_WINDOW`] is a fight with another writer (a second
    /// CPU manager, a tuning daemon): it is said once, counted, and from then on each repair
    /// waits a backoff that doubles (from [`FIGHT_BACKOFF_MIN`] to [`FIGHT_BACKOFF_MAX`]) while
    /// the writer goes on; [`FIGHT_QUIET`] without a foreign change ends the fight.
    pub(super) fn hold_off_drift(&mut self, path: &CgroupPath, now: Instant) -> bool {
        let Some(entry) = self.model.get_mut(path) else {
            return false;
        };
        let fight = entry.fight.get_or_insert_with(|| Box::new(Fight::new(now)));
        if now.saturating_duration_since(fight.last_drift) > FIGHT_QUIET {
            **fight = Fight::new(now);
        }
        fight.last_drift = now;
        if let Some(until) = fight.until.filter(|&until| now < until) {
            fight.pending = true;
            self.deadlines.fight = Some(self.deadlines.fight.map_or(until, |t| t.min(until)));
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
        if fight.count_drift(now) {
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

    /// Fights whose backoff has ended with a foreign value not yet repaired, once the first is
    /// due: the cgroup is read again (and so repaired); fights long quiet are forgotten. Whether
    /// the model changed.
    pub(super) fn resume_fights(&mut self, now: Instant) -> bool {
        if self.deadlines.fight.is_none_or(|t| t > now) {
            return false;
        }
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (path, entry) in self.model.iter_mut() {
            let Some(fight) = &mut entry.fight else {
                continue;
            };
            if !fight.pending && now.saturating_duration_since(fight.last_drift) > FIGHT_QUIET {
                entry.fight = None;
            } else if fight.pending && fight.until.is_some_and(|u| u <= now) {
                fight.pending = false;
                due.push(path.clone());
            } else if let Some(until) = fight.until.filter(|_| fight.pending) {
                next = Some(next.map_or(until, |t| t.min(until)));
            }
        }
        self.deadlines.fight = next;
        let mut changed = false;
        for path in due {
            changed |= self.reread(&path, now);
        }
        changed
    }
}
