//! The per-cpu power settings of `cpu-c-states.crio.io` (resume latency) and
//! `cpu-freq-governor.crio.io` (cpufreq governor) pods: [`crate::cpu_power::CpuPower`].

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;

use super::{Effect, Env, InForce, Recorded, Restored, Wanted};
use crate::agent::metrics::Metrics;
use crate::cpu_power::{CpuPower, PowerSaved};
use crate::cpuset::CpuSet;

/// Its key in the saved-state maps (today's checkpoint member of the same name).
pub const NAME: &str = "power";

#[derive(Debug)]
struct Power {
    power: CpuPower,
    /// Failures and refusals said (once each while they last).
    said: HashSet<String>,
}

/// The effect, with what earlier runs recorded (the host record's originals win).
pub fn build(env: &Env<'_>, recorded: &Recorded<'_>) -> Option<Box<dyn Effect>> {
    let (mut saved, host) = recorded.typed::<PowerSaved>(NAME);
    if let Some(host) = host {
        saved.latency = host.latency;
        saved.governor = host.governor;
    }
    let power = CpuPower::new(env.sysfs_root, saved);
    let power = match &env.journal {
        Some(journal) => power.with_journal(journal.clone()),
        None => power,
    };
    Some(Box::new(Power {
        power,
        said: HashSet::new(),
    }))
}

/// Each exclusive CPU's asked-for resume latency and governor.
fn wanted_settings(wanted: &Wanted<'_>) -> (BTreeMap<u32, String>, BTreeMap<u32, String>) {
    let (mut latency, mut governor) = (BTreeMap::new(), BTreeMap::new());
    for assigned in &wanted.containers {
        for cpu in assigned.cpus.iter() {
            if let Some(c_states) = assigned.isolation.c_states {
                latency.insert(cpu, c_states.sysfs_value());
            }
            if let Some(name) = assigned.isolation.governor {
                governor.insert(cpu, name.as_str().to_string());
            }
        }
    }
    (latency, governor)
}

impl Effect for Power {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Nothing is read while nothing is asked or recorded.
    fn update(&mut self, wanted: &Wanted<'_>, always: bool, metrics: &mut Metrics) {
        let (latency, governor) = wanted_settings(wanted);
        let saved = self.power.saved();
        let idle = latency.is_empty()
            && governor.is_empty()
            && saved.latency.is_empty()
            && saved.governor.is_empty();
        let same = latency.keys().copied().collect::<CpuSet>() == saved.latency_in_force
            && governor.keys().copied().collect::<CpuSet>() == saved.governor_in_force
            && saved.latency.keys().all(|c| latency.contains_key(c))
            && saved.governor.keys().all(|c| governor.contains_key(c));
        if idle || (!always && same) {
            return;
        }
        let outcome = self.power.apply(&latency, &governor);
        let lines: HashSet<String> = outcome.lines.into_iter().collect();
        for line in &lines {
            if !self.said.contains(line) {
                log::warn!("{line}");
            }
        }
        self.said = lines;
        metrics.cpu_power_writes += outcome.written as u64;
        metrics.governor_refused_cpus = outcome.governor_refused.len() as u64;
        self.report(metrics);
        if outcome.written > 0 {
            let saved = self.power.saved();
            log::info!(
                "cpu power: resume latency set on cpus {}, governor on cpus {} ({} file(s) written)",
                describe(&saved.latency_in_force),
                describe(&saved.governor_in_force),
                outcome.written
            );
        }
    }

    fn report(&self, metrics: &mut Metrics) {
        metrics.cstates_cpus = self.power.saved().latency_in_force.len() as u64;
        metrics.governor_cpus = self.power.saved().governor_in_force.len() as u64;
    }

    fn in_force(&self, into: &mut InForce) {
        into.power = self.power.saved().clone();
    }

    fn saved(&self) -> Value {
        let saved = self.power.saved();
        super::to_saved(saved, saved.is_empty())
    }

    fn restore(&mut self) -> Restored {
        let mut restored = Restored::default();
        let saved = self.power.saved();
        if saved.latency.is_empty() && saved.governor.is_empty() {
            return restored;
        }
        let outcome = self.power.apply(&BTreeMap::new(), &BTreeMap::new());
        restored.said.push(format!(
            "cpu power settings restored (c-states, governor): {} file(s) written",
            outcome.written
        ));
        for line in &outcome.lines {
            restored
                .errors
                .push(format!("cannot restore a cpu power setting: {line}"));
        }
        restored
    }
}

fn describe(cpus: &CpuSet) -> String {
    if cpus.is_empty() {
        "none".to_string()
    } else {
        cpus.to_string()
    }
}
