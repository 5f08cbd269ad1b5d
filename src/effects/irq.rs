//! Device interrupts kept off the CPUs of `irq-load-balancing.crio.io` pods, with irqbalance
//! told the same CPUs first (so it does not move them back): [`crate::irq::IrqAffinity`].
//! irqbalance is part of this effect, not one of its own: it must be told before the
//! affinities are written, and what it was told is restored with them.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use super::{Assigned, Effect, Env, InForce, Recorded, Restored, Wanted};
use crate::agent::metrics::Metrics;
use crate::cpuset::CpuSet;
use crate::irq::{IrqAffinity, IrqSaved};

/// Its key in the saved-state maps (today's checkpoint member of the same name).
pub const NAME: &str = "irq";

#[derive(Debug)]
struct Irq {
    affinity: IrqAffinity,
    /// Failures said (once each).
    said: HashSet<String>,
}

/// The effect, with what earlier runs recorded (the host record's originals win).
pub fn build(env: &Env<'_>, recorded: &Recorded<'_>) -> Option<Box<dyn Effect>> {
    let (mut saved, host) = recorded.typed::<IrqSaved>(NAME);
    if let Some(host) = host {
        saved.default_affinity = host.default_affinity;
        saved.irqs = host.irqs;
        saved.irqbalance = host.irqbalance;
    }
    let affinity = match &env.effect_done {
        Some(told) => {
            IrqAffinity::with_irqbalance_in_background(env.proc_root, saved, Some(told.clone()))
        }
        None => IrqAffinity::new(env.proc_root, saved),
    };
    let affinity = match &env.journal {
        Some(journal) => affinity.with_journal(journal.clone()),
        None => affinity,
    };
    Some(Box::new(Irq {
        affinity,
        said: HashSet::new(),
    }))
}

/// The CPUs of the containers whose pod asks for no interrupts (with `housekeeping`, all but
/// the first core of each container's set).
fn banned(wanted: &Wanted<'_>) -> CpuSet {
    let mut cpus = CpuSet::new();
    for Assigned {
        isolation,
        cpus: held,
        ..
    } in wanted.containers.iter().filter(|a| a.isolation.no_irqs)
    {
        if isolation.irq_housekeeping {
            let kept = wanted.topology.housekeeping_cpus(held);
            cpus.extend_from(&held.difference(&kept));
        } else {
            cpus.extend_from(held);
        }
    }
    cpus
}

impl Effect for Irq {
    fn name(&self) -> &'static str {
        NAME
    }

    fn update(&mut self, wanted: &Wanted<'_>, always: bool, metrics: &mut Metrics) {
        let banned = banned(wanted);
        let changed = self.affinity.saved().banned != banned;
        if !always && !changed {
            return;
        }
        let was_in_force = self.affinity.saved().in_force.clone();
        let outcome = self.affinity.apply(&banned);
        let in_force = &self.affinity.saved().in_force;
        if !outcome.not_in_force.is_empty() && (changed || *in_force != was_in_force) {
            log::warn!(
                "device interrupts are not kept off cpus {}: an affinity read back after the writes still has them (the error logged with this says why); irq-load-balancing.crio.io is not in force there",
                outcome.not_in_force
            );
        }
        if changed {
            log::info!(
                "device interrupts kept off cpus {}: {} affinity file(s) written, {} IRQ(s) the kernel would not move, {} with no other cpu",
                if banned.is_empty() { "none".to_string() } else { banned.to_string() },
                outcome.written,
                outcome.unchangeable,
                outcome.no_other_cpu
            );
        }
        match &outcome.irqbalance_news {
            Some((true, line)) => log::warn!("{line}"),
            Some((false, line)) => log::info!("{line}"),
            None => {}
        }
        for error in &outcome.errors {
            if self.said.insert(error.clone()) {
                log::warn!("cannot change an interrupt's affinity: {error} (with the systemd unit, install its irq drop-in)");
            }
        }
        metrics.irq_affinity_writes += outcome.written as u64;
        metrics.irq_unchangeable = outcome.unchangeable as u64;
        self.report(metrics);
    }

    /// irqbalance learns the daemon's own banned cpus in its exchange: its answer is the only
    /// record of them, so a stop waits for it.
    fn settle(&mut self, within: std::time::Duration) {
        self.affinity.settle_irqbalance(within);
    }

    fn sync(&mut self, metrics: &mut Metrics) -> bool {
        let changed = self.affinity.sync_irqbalance();
        self.report(metrics);
        changed
    }

    fn report(&self, metrics: &mut Metrics) {
        let saved = self.affinity.saved();
        metrics.irq_isolated_cpus = saved.in_force.len() as u64;
        metrics.irqbalance_banned_cpus = saved
            .irqbalance
            .as_ref()
            .map_or(0, |told| told.banned.len() as u64);
    }

    fn in_force(&self, into: &mut InForce) {
        into.irq = self.affinity.saved().in_force.clone();
    }

    fn saved(&self) -> Value {
        let saved = self.affinity.saved();
        super::to_saved(saved, saved.is_empty())
    }

    fn restore(&mut self) -> Restored {
        let mut restored = Restored::default();
        if self.affinity.saved().is_empty() {
            return restored;
        }
        let outcome = self.affinity.apply(&CpuSet::new());
        restored.said.push(format!(
            "interrupt affinities restored: {} file(s) written",
            outcome.written
        ));
        match outcome.irqbalance_news {
            Some((true, line)) => restored.errors.push(format!(
                "{line} (restarting irqbalance also drops what it was told)"
            )),
            Some((false, line)) => restored.said.push(line),
            None => {}
        }
        for error in &outcome.errors {
            restored
                .errors
                .push(format!("cannot restore an interrupt's affinity: {error}"));
        }
        restored
    }

    fn status_note(&self, proc_root: &Path) -> Option<String> {
        let saved = self.affinity.saved();
        crate::irqbalance::status_note(proc_root, &saved.banned, saved.irqbalance.as_ref())
    }
}
