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
        let drifted = self.since_pass.drifted.iter();
        let repairs = drifted.map(|p| Some((p.clone(), self.model.desired(p)?.clone())));
        let plan = crate::planner::order::repairs(repairs.collect::<Option<Vec<_>>>()?);
        let known = crate::planner::Known::nothing();
        let executed = crate::writer::execute_all(&self.parts.hierarchy, plan, &known);
        self.metrics.writes_issued += executed.done.len() as u64;
        let written_at = Instant::now();
        let mut outcome = PassOutcome::default();
        for step in executed.written() {
            outcome.writes += 1;
            self.metrics.drift_repairs += 1;
            self.since_pass.drifted.remove(&step.path);
            self.model.written(step, written_at);
            self.bump();
        }
        (outcome.writes == executed.done.len()).then_some(outcome)
    }

    /// Records a foreign change of `cgroup`'s `cpuset.cpus` (read at `now`) as a drift of its
    /// record (see [`Fight::drift`]: a fight is counted, and its repair's deadline kept). A
    /// cgroup someone keeps rewriting is repaired at a backed-off pace: meanwhile its foreign
    /// value is not taken into the model (`cgroup` gets the record's), so no pass rewrites it.
    pub(super) fn hold_off_drift(&mut self, cgroup: &mut ScannedCgroup, now: Instant) {
        let Some(entry) = self.model.get_mut(&cgroup.path) else {
            return;
        };
        let (Some(desired), Some(cpus)) = (&entry.desired, cgroup.cpus.configured()) else {
            return;
        };
        if desired == cpus || cpus.is_empty() {
            return;
        }
        let fight = entry.fight.get_or_insert_with(|| Box::new(Fight::new(now)));
        match fight.drift(&cgroup.path, now) {
            Drift::Repair => {}
            Drift::FightStarts => self.metrics.drift_fights += 1,
            Drift::Wait(until) => {
                self.deadlines.fight = Some(self.deadlines.fight.map_or(until, |t| t.min(until)));
                cgroup.cpus = entry.cgroup.cpus.clone();
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
        due.iter()
            .fold(false, |changed, p| self.reread(p, now) | changed)
    }
}
