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

    /// The CPUs of exclusive containers whose pod asks for no interrupts (with
    /// `housekeeping`, all but the first core of each container's set).
    pub(super) fn irq_isolated_cpus(&self) -> CpuSet {
        let mut cpus = CpuSet::new();
        for (key, (isolation, _)) in self.model.isolated.iter().filter(|(_, (i, _))| i.no_irqs) {
            if let Some(held) = self.parts.assignments.get(key) {
                if isolation.irq_housekeeping {
                    let kept = self.parts.topology.housekeeping_cpus(&held.cpus);
                    cpus.extend_from(&held.cpus.difference(&kept));
                } else {
                    cpus.extend_from(&held.cpus);
                }
            }
        }
        cpus
    }

    /// Manages the per-cpu power settings from now on (`power`: with what an earlier run
    /// changed).
    pub fn manage_power(&mut self, power: crate::cpu_power::CpuPower) {
        self.metrics.cstates_cpus = power.saved().latency_in_force.len() as u64;
        self.metrics.governor_cpus = power.saved().governor_in_force.len() as u64;
        self.power = Some(power);
    }

    /// What the per-cpu power settings need to be restored (for the checkpoint).
    pub fn power_saved(&self) -> crate::cpu_power::PowerSaved {
        self.power
            .as_ref()
            .map(|p| p.saved().clone())
            .unwrap_or_default()
    }

    /// Each exclusive CPU's asked-for resume latency and governor.
    fn power_wanted(&self) -> (BTreeMap<u32, String>, BTreeMap<u32, String>) {
        let (mut latency, mut governor) = (BTreeMap::new(), BTreeMap::new());
        for (key, (isolation, _)) in &self.model.isolated {
            let Some(held) = self.parts.assignments.get(key) else {
                continue;
            };
            for cpu in held.cpus.iter() {
                if let Some(c_states) = isolation.c_states {
                    latency.insert(cpu, c_states.sysfs_value());
                }
                if let Some(name) = isolation.governor {
                    governor.insert(cpu, name.as_str().to_string());
                }
            }
        }
        (latency, governor)
    }

    /// Sets the per-cpu power files the pods ask for and restores the others: after a pass
    /// when what is asked changed, and on every full reconcile (`always`). Nothing is read
    /// while nothing is asked or recorded.
    pub(super) fn update_power(&mut self, always: bool) {
        let (latency, governor) = self.power_wanted();
        let Some(power) = self.power.as_mut() else {
            return;
        };
        let saved = power.saved();
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
        let outcome = power.apply(&latency, &governor);
        let lines: HashSet<String> = outcome.lines.into_iter().collect();
        for line in &lines {
            if !self.power_said.contains(line) {
                log::warn!("{line}");
            }
        }
        self.power_said = lines;
        self.metrics.cpu_power_writes += outcome.written as u64;
        self.metrics.governor_refused_cpus = outcome.governor_refused.len() as u64;
        self.metrics.cstates_cpus = power.saved().latency_in_force.len() as u64;
        self.metrics.governor_cpus = power.saved().governor_in_force.len() as u64;
        if outcome.written > 0 {
            log::info!(
                "cpu power: resume latency set on cpus {}, governor on cpus {} ({} file(s) written)",
                describe(&power.saved().latency_in_force),
                describe(&power.saved().governor_in_force),
                outcome.written
            );
        }
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
        let power_before = self.power_saved();
        self.update_irqs(true);
        self.update_power(true);
        self.irq.as_ref().map(|i| i.saved().clone()) != before || self.power_saved() != power_before
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
            if self.said.irq.first(error.clone()) {
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
            .model
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

fn describe(cpus: &CpuSet) -> String {
    if cpus.is_empty() {
        "none".to_string()
    } else {
        cpus.to_string()
    }
}
