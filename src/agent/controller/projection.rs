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

    /// Counts the containers `cpu-shared.crio.io` is in force for (their cgroup, as last
    /// written or read, holds their exclusive cpus and more) for the metrics: a walk of the
    /// model reading one flag per cgroup but theirs.
    pub(super) fn count_cpu_shared(&mut self) {
        let assignments = &self.parts.assignments;
        let count = self
            .model
            .values()
            .filter(|entry| {
                let Some(class) = entry.class.as_deref().filter(|c| c.cpu_shared) else {
                    return false;
                };
                let held = class.assignment_key().and_then(|k| assignments.get(&k));
                let cpus = entry.cgroup.cpus.configured();
                match (held, cpus) {
                    (Some(held), Some(cpus)) => {
                        held.cpus.is_subset(cpus) && cpus.len() > held.cpus.len()
                    }
                    _ => false,
                }
            })
            .count();
        self.metrics.cpu_shared_containers = count as u64;
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
        let effects = self.effects_in_force();
        if wanted.no_load_balancing && exclusive.is_subset(&effects.sched) {
            in_force.push(crate::classify::CPU_LOAD_BALANCING_ANNOTATION);
        }
        if wanted.no_irqs && exclusive.is_subset(&effects.irq) {
            in_force.push(crate::classify::IRQ_LOAD_BALANCING_ANNOTATION);
        }
        if class.cpu_shared && cpus.len() > exclusive.len() {
            in_force.push("cpu-shared.crio.io");
        }
        let power = Some(&effects.power);
        if wanted.c_states.is_some()
            && power.is_some_and(|p| exclusive.is_subset(&p.latency_in_force))
        {
            in_force.push(crate::classify::CPU_C_STATES_ANNOTATION);
        }
        if wanted.governor.is_some()
            && power.is_some_and(|p| exclusive.is_subset(&p.governor_in_force))
        {
            in_force.push(crate::classify::CPU_FREQ_GOVERNOR_ANNOTATION);
        }
        in_force.into_iter().map(String::from).collect()
    }
}
