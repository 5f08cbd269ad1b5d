//! Scheduler load balancing kept off the CPUs of `cpu-load-balancing.crio.io` pods, and the
//! host cpusets `--isolate-host` confines to the reserved CPUs:
//! [`crate::sched_balance::SchedBalance`].

use std::path::Path;

use serde_json::Value;

use super::{Effect, Env, InForce, Recorded, Restored, Wanted};
use crate::agent::metrics::Metrics;
use crate::cgroupfs::CgroupPath;
use crate::cpuset::CpuSet;
use crate::sched_balance::{SchedBalance, SchedSaved};
use crate::systemd_slices::{is_systemd_host, Systemctl};

/// Its key in the saved-state maps (today's checkpoint member of the same name).
pub const NAME: &str = "sched";

#[derive(Debug)]
struct Sched(SchedBalance);

/// The effect on the cpuset hierarchy (none without one), with what earlier runs recorded
/// (the host record's originals win).
pub fn build(env: &Env<'_>, recorded: &Recorded<'_>) -> Option<Box<dyn Effect>> {
    let (fs, version, kubepods) = env.cpuset.clone()?;
    let (mut saved, host) = recorded.typed::<SchedSaved>(NAME);
    if let Some(host) = host {
        saved.flags = host.flags;
        saved.host = host.host;
        saved.partitions = host.partitions;
        saved.exclusive = host.exclusive;
        saved.slices = host.slices;
    }
    // Confined counts only for a unit still recorded (the host record may be newer).
    let slices = &saved.slices;
    saved.confined.retain(|unit| slices.contains_key(unit));
    // systemd's slices live on the real cgroup mount only (a fake tree never reaches systemd).
    let systemd = fs.root().starts_with("/sys/fs/cgroup")
        && is_systemd_host(&fs, version, Path::new("/run/systemd/system"));
    let sched = SchedBalance::new(fs, version, kubepods, env.isolate_host.clone(), saved);
    // The agent asks systemd on a thread of its own (a stalled systemd holds no pass);
    // `reset` asks in its own thread.
    let sched = match (systemd, &env.effect_done) {
        (false, _) => sched,
        (true, Some(done)) => {
            sched.with_systemd_in_background(Systemctl::default(), Some(done.clone()))
        }
        (true, None) => sched.with_systemd(Systemctl::default()),
    };
    let sched = match &env.journal {
        Some(journal) => sched.with_journal(journal.clone()),
        None => sched,
    };
    Some(Box::new(Sched(sched)))
}

impl Effect for Sched {
    fn name(&self) -> &'static str {
        NAME
    }

    fn update(&mut self, wanted: &Wanted<'_>, always: bool, metrics: &mut Metrics) {
        let mut cpus: Vec<(CgroupPath, CpuSet)> = wanted
            .containers
            .iter()
            .filter(|a| a.isolation.no_load_balancing)
            .map(|a| (a.path.clone(), a.cpus.clone()))
            .collect();
        cpus.sort();
        if let Some(outcome) = self.0.update(&cpus, always) {
            metrics.sched_balance_writes += outcome.written as u64;
        }
        self.report(metrics);
    }

    /// Its state is the cpuset tree: a full reconcile re-applies it; a quiet tick (which does
    /// not read the whole hierarchy) only when what it set outside kubepods reads otherwise
    /// (a host unit systemd was asked to widen, a flag set back: a few files read).
    fn on_quiet_ticks(&mut self) -> bool {
        self.0.host_moved()
    }

    fn say_support(&self) {
        self.0.say_support();
    }

    /// The host units' answers from systemd's thread: confined (or given back) only now.
    fn sync(&mut self, metrics: &mut Metrics) -> bool {
        let changed = self.0.sync();
        metrics.sched_balance_writes += self.0.take_synced_writes() as u64;
        self.report(metrics);
        changed
    }

    fn report(&self, metrics: &mut Metrics) {
        metrics.sched_isolated_cpus = self.0.saved().isolated.len() as u64;
    }

    fn in_force(&self, into: &mut InForce) {
        let saved = self.0.saved();
        into.sched = saved.isolated.clone();
        into.sched_not_in_force = self
            .0
            .support()
            .refusal()
            .map(str::to_string)
            .or_else(|| saved.not_in_force.clone());
    }

    fn saved(&self) -> Value {
        let saved = self.0.saved();
        super::to_saved(saved, saved.is_empty())
    }

    fn restore(&mut self) -> Restored {
        let mut restored = Restored::default();
        let saved = self.0.saved();
        if !saved.has_changes() {
            return restored;
        }
        let (flags, host, partitions) = (
            saved.flags.len(),
            saved.host.len() + saved.slices.len(),
            saved.partitions.len(),
        );
        let outcome = self.0.apply(&[]);
        restored.said.push(format!(
            "scheduler load balancing restored: {flags} cpuset(s) balance again, {host} host cgroup(s) get their cpus back, {partitions} partition(s) are members again; {} file(s) written",
            outcome.written
        ));
        for error in &outcome.errors {
            restored
                .errors
                .push(format!("cannot restore scheduler load balancing: {error}"));
        }
        restored
    }
}
