//! The second step of isolating a pod's cpus: interrupt affinities and scheduler load
//! balancing, kept off the cpus of the pods whose annotations ask for it.

use super::*;

impl Controller {
    /// Manages interrupt affinities from now on (`saved`: what an earlier run changed).
    pub fn manage_irqs(&mut self, irq: IrqAffinity) {
        self.metrics.irq_isolated_cpus = irq.saved().in_force.len() as u64;
        self.metrics.irqbalance_banned_cpus = irq
            .saved()
            .irqbalance
            .as_ref()
            .map_or(0, |told| told.banned.len() as u64);
        self.irq = Some(irq);
    }

    /// What the IRQ affinities need to be restored (for the checkpoint).
    pub fn irq_saved(&self) -> IrqSaved {
        self.irq
            .as_ref()
            .map(|i| i.saved().clone())
            .unwrap_or_default()
    }

    /// The CPUs of exclusive containers whose pod asks for no interrupts.
    pub(super) fn irq_isolated_cpus(&self) -> CpuSet {
        let mut cpus = CpuSet::new();
        for (key, _) in self.isolated.iter().filter(|(_, (i, _))| i.no_irqs) {
            if let Some(held) = self.parts.assignments.get(key) {
                cpus.extend_from(&held.cpus);
            }
        }
        cpus
    }

    /// Takes in what the irqbalance thread told since the last look (nothing is read or
    /// written); whether the checkpoint must say something new.
    pub fn sync_irqbalance(&mut self) -> bool {
        let Some(irq) = self.irq.as_mut() else {
            return false;
        };
        let changed = irq.sync_irqbalance();
        self.metrics.irqbalance_banned_cpus = irq
            .saved()
            .irqbalance
            .as_ref()
            .map_or(0, |told| told.banned.len() as u64);
        changed
    }

    /// Re-applies the interrupt settings on a reconcile tick that found the tree unchanged
    /// (IRQs registered since, moved back by someone else, a restarted irqbalance). Nothing to
    /// do, and nothing read, while no pod asks for it. Returns whether what is to be restored
    /// changed (the checkpoint must say so).
    pub fn refresh_irqs(&mut self) -> bool {
        let before = self.irq.as_ref().map(|i| i.saved().clone());
        self.update_irqs(true);
        self.irq.as_ref().map(|i| i.saved().clone()) != before
    }

    /// Keeps interrupts off the CPUs that ask for it: after a pass when that set changed,
    /// and on every full reconcile (`always`: IRQs registered since, or moved back by
    /// someone else).
    pub(super) fn update_irqs(&mut self, always: bool) {
        let banned = self.irq_isolated_cpus();
        let Some(irq) = self.irq.as_mut() else {
            return;
        };
        let changed = irq.saved().banned != banned;
        if !always && !changed {
            return;
        }
        let was_in_force = irq.saved().in_force.clone();
        let outcome = irq.apply(&banned);
        let in_force = &irq.saved().in_force;
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
            if self.unreadable_said_irq.insert(error.clone()) {
                log::warn!("cannot change an interrupt's affinity: {error} (with the systemd unit, install its irq drop-in)");
            }
        }
        self.metrics.irq_isolated_cpus = in_force.len() as u64;
        self.metrics.irq_affinity_writes += outcome.written as u64;
        self.metrics.irq_unchangeable = outcome.unchangeable as u64;
        self.metrics.irqbalance_banned_cpus = irq
            .saved()
            .irqbalance
            .as_ref()
            .map_or(0, |told| told.banned.len() as u64);
    }

    /// Manages scheduler load balancing from now on (`sched`: with what an earlier run changed).
    pub fn manage_sched_balance(&mut self, sched: SchedBalance) {
        self.metrics.sched_isolated_cpus = sched.saved().isolated.len() as u64;
        self.sched = Some(sched);
    }

    /// What the scheduler load balancing changes need to be restored (for the checkpoint).
    pub fn sched_saved(&self) -> SchedSaved {
        self.sched
            .as_ref()
            .map(|s| s.saved().clone())
            .unwrap_or_default()
    }

    /// Keeps load balancing off the CPUs of exclusive containers whose pod asks for it (see
    /// [`SchedBalance::update`]): after a pass when they changed, and on every full reconcile.
    pub(super) fn update_sched_balance(&mut self, always: bool) {
        if self.sched.is_none() {
            return;
        }
        let mut wanted = Vec::new();
        for (key, (_, path)) in self
            .isolated
            .iter()
            .filter(|(_, (i, _))| i.no_load_balancing)
        {
            if let Some(held) = self.parts.assignments.get(key) {
                wanted.push((path.clone(), held.cpus.clone()));
            }
        }
        wanted.sort();
        let Some(sched) = self.sched.as_mut() else {
            return;
        };
        if let Some(outcome) = sched.update(&wanted, always) {
            self.metrics.sched_balance_writes += outcome.written as u64;
        }
        self.metrics.sched_isolated_cpus = sched.saved().isolated.len() as u64;
    }
}
