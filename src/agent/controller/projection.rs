//! The projection files (see [`crate::projection`]): what each container of a pod that asks
//! for it is told of its CPUs, kept after the pass's cgroup writes (the agent calls
//! [`Controller::update_projections`] only when no event waits, so no pin waits for it).

use super::*;
use crate::projection::{Host, Projector};

impl Controller {
    /// Keeps projection files from now on: for pods that ask (`cpusetd.io/projection:
    /// "enable"`), or every pod with `all` (`--project-all`).
    pub fn manage_projection(&mut self, projector: Projector, all: bool) {
        self.projection = Some((projector, all));
        self.deadlines.projection.due = true;
    }

    /// When projection files are owed (see [`crate::agent::deadlines::Projection::due_at`]).
    pub fn projections_due(&self) -> Option<Instant> {
        self.projection.as_ref()?;
        self.deadlines.projection.due_at(Instant::now())
    }

    /// Brings the projection files up to date when they are due ([`Self::projections_due`]);
    /// nothing is read or written otherwise. `stop` is asked before each file: when it says so
    /// (an event waits) the rest stays owed. Failures are logged once, never fatal.
    pub fn update_projections(&mut self, now: Instant, stop: impl FnMut() -> bool) {
        let Some((projector, all)) = &mut self.projection else {
            return;
        };
        if !self.deadlines.projection.start(now) {
            return;
        }
        let effects = crate::effects::in_force(&self.effects);
        let host = Host {
            assignments: &self.parts.assignments,
            topology: &self.parts.topology,
            effects: &effects,
        };
        let known = self.model.iter().filter_map(|(path, entry)| {
            let class = entry.class.as_deref()?;
            Some((path, class, entry.cgroup.cpus.configured()))
        });
        let wanted = crate::projection::wanted(known, *all, host);
        // The live pods only when a pod may have gone (no set of every pod at every pass).
        let live = match projector.needs_live(&wanted) {
            true => self.model.pod_uids(),
            false => HashSet::new(),
        };
        self.deadlines.projection.due = !projector.sync(&wanted, &live, stop);
        self.metrics.projection_writes = projector.writes;
        self.metrics.projection_failures = projector.failures;
    }
}
