//! The second step of isolating a pod's cpus: the host effects ([`crate::effects`]), brought
//! to what the isolation annotations of the pods holding exclusive cpus ask for, after the
//! pin writes of a pass.

use super::*;
use crate::effects::{self, Effect, EffectState, Wanted};

impl Controller {
    /// Manages the host effects from now on (each with what an earlier run changed).
    pub(crate) fn manage_effects(&mut self, list: Vec<Box<dyn Effect>>) {
        for effect in &list {
            effect.say_support();
            effect.report(&mut self.metrics);
        }
        self.effects = list;
    }

    /// What the host effects need to be restored (for the checkpoint), by effect name.
    pub fn effects_saved(&self) -> EffectState {
        effects::saved(&self.effects)
    }

    /// Brings every host effect to what the pods ask for: after a pass when that changed,
    /// and on every full reconcile (`always`: IRQs registered since, flags set back by
    /// someone else). Never on the way to a pin: called after the pass's pin writes.
    pub(super) fn update_effects(&mut self, always: bool) {
        self.last_pass.effects_owed = false;
        self.update_effects_where(always, |_| true);
    }

    /// [`Controller::update_effects`] after a pass's pins, unless something arrived meanwhile
    /// (a new cgroup, new CPU settings: [`Arrivals`]): then its pin goes first and the effects
    /// are owed, brought up to date by [`Controller::update_owed_effects`] once nothing waits
    /// (the agent's loop), or by the next pass. The quota effect's write-ahead alone (a
    /// `host.json` written and synced) is more than the pin's own writes (PERFORMANCE "The
    /// in-process pin, profiled"). Without arrivals (the library) they run at once.
    ///
    /// [`Arrivals`]: crate::watcher::Arrivals
    pub(super) fn update_effects_unless_arrived(&mut self) {
        if self.arrivals.as_ref().is_some_and(|a| a.arrived()) {
            self.last_pass.effects_owed = true;
            return;
        }
        self.update_effects(false);
    }

    /// The effects a pass left owed ([`Controller::update_effects_unless_arrived`]), brought up
    /// to date: the agent's loop calls it once no event waits. Whether what is to be saved
    /// changed (the checkpoint must say so).
    pub fn update_owed_effects(&mut self) -> bool {
        if !std::mem::take(&mut self.last_pass.effects_owed) {
            return false;
        }
        let before = self.effects_saved();
        self.update_effects(false);
        self.effects_saved() != before
    }

    /// [`Controller::update_effects`] of the effects `which` names.
    fn update_effects_where(
        &mut self,
        always: bool,
        mut which: impl FnMut(&mut dyn Effect) -> bool,
    ) {
        if self.effects.is_empty() {
            return;
        }
        let (assignments, topology) = (&self.parts.assignments, &self.parts.topology);
        let (keep_cfs_quota, model) = (self.parts.keep_cfs_quota, &self.model);
        let wanted = Wanted::of(
            &model.isolated,
            assignments,
            topology,
            keep_cfs_quota,
            model,
        );
        let mut written = Vec::new();
        for effect in self.effects.iter_mut() {
            if !which(effect.as_mut()) {
                continue;
            }
            effect.update(&wanted, always, &mut self.metrics);
            written.extend(effect.take_written());
        }
        // The model takes what they wrote, as it takes a plan's writes.
        let now = Instant::now();
        for (path, file, value) in written {
            if let Some(entry) = self.model.get_mut(&path) {
                entry.cgroup.assume_written(file, &value);
                entry.updated = now;
                self.model_changed = true;
            }
        }
    }

    /// Takes in what the effects' own threads (irqbalance, systemd) did since the last look
    /// (nothing is read or written but the host record); whether the checkpoint must say
    /// something new.
    pub fn sync_effects(&mut self) -> bool {
        let mut changed = false;
        for effect in &mut self.effects {
            changed |= effect.sync(&mut self.metrics);
        }
        changed
    }

    /// The agent is stopping: each effect waits, at most `within` in all, for what its own
    /// thread was asked ([`Effect::settle`]), and what they did is taken in
    /// ([`Controller::sync_effects`]) for the last checkpoint.
    pub fn settle_effects(&mut self, within: std::time::Duration) -> bool {
        let until = Instant::now() + within;
        for effect in &mut self.effects {
            effect.settle(until.saturating_duration_since(Instant::now()));
        }
        self.sync_effects()
    }

    /// Re-applies the host effects that can move without the tree (see
    /// [`Effect::on_quiet_ticks`]) on a reconcile tick that found the tree unchanged (IRQs
    /// registered since, moved back by someone else, a restarted irqbalance). Nothing to do,
    /// and nothing read, while no pod asks for it. Returns whether what is to be restored
    /// changed (the checkpoint must say so).
    pub fn refresh_effects(&mut self) -> bool {
        let before = self.effects_saved();
        self.update_effects_where(true, |e| e.on_quiet_ticks());
        self.effects_saved() != before
    }
}
