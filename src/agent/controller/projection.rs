//! The projection files (see [`crate::projection`]): what each container of a pod that asks
//! for it is told of its CPUs, kept after the pass's cgroup writes (the agent calls
//! [`Controller::update_projections`] only when no event waits, so no pin waits for it).

use super::*;
use crate::projection::{ProjectionBody, Projector, Wanted};

/// The shortest time between two updates of the projection files while passes keep coming.
pub(super) const PROJECTION_INTERVAL: Duration = Duration::from_millis(20);

impl Controller {
    /// Keeps projection files from now on: for pods that ask (`cpusetd.io/projection:
    /// "enable"`), or every pod with `all` (`--project-all`).
    pub fn manage_projection(&mut self, projector: Projector, all: bool) {
        self.projection = Some((projector, all));
        self.deadlines.projection.due = true;
    }

    /// When projection files are owed (a pass ran since, or the last update stopped early):
    /// at most every [`PROJECTION_INTERVAL`], so a stream of passes walks the model for them
    /// that often at most.
    pub fn projections_due(&self) -> Option<Instant> {
        if !self.deadlines.projection.due || self.projection.is_none() {
            return None;
        }
        Some(match self.deadlines.projection.at {
            Some(at) => at + PROJECTION_INTERVAL,
            None => Instant::now(),
        })
    }

    /// Brings the projection files up to date when they are due ([`Self::projections_due`]);
    /// nothing is read or written otherwise. `stop` is asked before each file: when it says so
    /// (an event waits) the rest stays owed. Failures are logged once, never fatal.
    pub fn update_projections(&mut self, now: Instant, stop: impl FnMut() -> bool) {
        let early = self
            .deadlines
            .projection
            .at
            .is_some_and(|at| at + PROJECTION_INTERVAL > now);
        if !self.deadlines.projection.due || self.projection.is_none() || early {
            return;
        }
        self.deadlines.projection.due = false;
        self.deadlines.projection.at = Some(now);
        let Some((_, all)) = &self.projection else {
            return;
        };
        let wanted = self.projections_wanted(*all);
        // The live pods only when a pod may have gone (no set of every pod at every pass).
        let needs_live = self
            .projection
            .as_ref()
            .is_some_and(|(p, _)| p.needs_live(&wanted));
        let live: HashSet<String> = match needs_live {
            true => self
                .model
                .values()
                .filter_map(|e| e.class.as_deref()?.pod_uid.clone())
                .collect(),
            false => HashSet::new(),
        };
        let Some((projector, _)) = self.projection.as_mut() else {
            return;
        };
        self.deadlines.projection.due = !projector.sync(&wanted, &live, stop);
        self.metrics.projection_writes = projector.writes;
        self.metrics.projection_failures = projector.failures;
    }

    /// What every projected container's file should say now, from the model (its cpuset as
    /// last written or read), the assignments and the isolation read back.
    fn projections_wanted(&self, all: bool) -> Wanted {
        let mut wanted = Wanted::new();
        for (path, entry) in &self.model {
            let Some(class) = entry.class.as_deref() else {
                continue;
            };
            if class.kind != CgroupKind::Container || !(all || class.projection) {
                continue;
            }
            let (Some(uid), Some(name)) = (&class.pod_uid, &class.container_name) else {
                continue;
            };
            let Some(cpus) = entry.cgroup.cpus.configured().filter(|c| !c.is_empty()) else {
                continue;
            };
            let exclusive = class
                .assignment_key()
                .and_then(|k| self.parts.assignments.get(&k))
                .map(|a| a.cpus.intersection(cpus))
                .unwrap_or_default();
            let isolation = self.in_force(path, class, cpus, &exclusive);
            let topology = &self.parts.topology;
            let body = ProjectionBody::new(
                uid,
                name,
                cpus,
                &exclusive,
                |cpu| topology.cpu(cpu).map(|c| c.numa),
                isolation,
            );
            wanted
                .entry(uid.clone())
                .or_default()
                .insert(name.clone(), body);
        }
        wanted
    }

    /// The high-performance annotations in force for a container, as read back.
    fn in_force(
        &self,
        path: &CgroupPath,
        class: &Classification,
        cpus: &CpuSet,
        exclusive: &CpuSet,
    ) -> Vec<String> {
        let mut in_force: Vec<&str> = Vec::new();
        if exclusive.is_empty() {
            return Vec::new();
        }
        let wanted = &class.isolation;
        if wanted.no_cpu_quota && self.parts.quota_lifted.contains_key(path) {
            in_force.push(crate::classify::CPU_QUOTA_ANNOTATION);
        }
        let sched = self.sched.as_ref().map(|s| &s.saved().isolated);
        if wanted.no_load_balancing && sched.is_some_and(|s| exclusive.is_subset(s)) {
            in_force.push(crate::classify::CPU_LOAD_BALANCING_ANNOTATION);
        }
        let irq = self.irq.as_ref().map(|i| &i.saved().in_force);
        if wanted.no_irqs && irq.is_some_and(|s| exclusive.is_subset(s)) {
            in_force.push(crate::classify::IRQ_LOAD_BALANCING_ANNOTATION);
        }
        if class.cpu_shared && cpus.len() > exclusive.len() {
            in_force.push("cpu-shared.crio.io");
        }
        in_force.into_iter().map(String::from).collect()
    }
}
