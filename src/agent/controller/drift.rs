//! Drift: foreign changes of a cgroup's `cpuset.cpus`, repaired without planning when nothing
//! else changed, and fights with another writer, repaired at a backed-off pace (the pace is
//! [`Fight`]'s).

use super::*;
use crate::agent::model::fight::Drift;
use crate::agent::model::Fight;

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
            repairs.push((path.clone(), self.model.desired(path)?.clone()));
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

    /// Records a foreign change of `path`'s `cpuset.cpus`; whether its repair must wait (see
    /// [`Fight::drift`]: a fight is counted, and its repair's deadline kept).
    pub(super) fn hold_off_drift(&mut self, path: &CgroupPath, now: Instant) -> bool {
        let Some(entry) = self.model.get_mut(path) else {
            return false;
        };
        let fight = entry.fight.get_or_insert_with(|| Box::new(Fight::new(now)));
        match fight.drift(path, now) {
            Drift::Repair => false,
            Drift::FightStarts => {
                self.metrics.drift_fights += 1;
                false
            }
            Drift::Wait(until) => {
                self.deadlines.fight = Some(self.deadlines.fight.map_or(until, |t| t.min(until)));
                true
            }
        }
    }

    /// Fights whose backoff has ended with a foreign value not yet repaired, once the first is
    /// due: the cgroup is read again (and so repaired); fights long quiet are forgotten. Whether
    /// the model changed.
    pub(super) fn resume_fights(&mut self, now: Instant) -> bool {
        if self.deadlines.fight.is_none_or(|t| t > now) {
            return false;
        }
        let (due, next) = self.model.due_fights(now);
        self.deadlines.fight = next;
        let mut changed = false;
        for path in due {
            changed |= self.reread(&path, now);
        }
        changed
    }
}
