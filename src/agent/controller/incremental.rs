//! Incremental passes: when the only change since the last pass is pods starting, containers
//! starting or going in pods that stay, or pods going, the pass plans just those pods' chains
//! — each pod's whole subtree and its ancestors up to kubepods — instead of the whole tree,
//! and writes only inside the pods (and the ancestors' widenings). Their pins land after work
//! proportional to the pods, not to the node.
//!
//! A chain plans the same as a full plan would, given what a full pass checks first (see
//! [`Controller::chain`]): the assignments of every other pod are kept (the chain's scan is
//! marked incomplete, so the planner releases nothing it did not see), the allocator sees the
//! same free CPUs, and every desired set is local (a container's set, its pod's union, a
//! parent's clamp). Debug builds and tests check it after every incremental pass against a
//! full plan of the same model ([`crate::planner::chain::assert_chain_is_full_plan`]).
//!
//! The shared pool's members (the cgroups that hold some of it in a set of their own), when
//! they are few ([`Burst::FEW_POOL_MEMBERS`]: cgroup v2 with inheritance, where they are the
//! QoS cgroups and the non-exclusive members of Guaranteed pods), are planned with the chain
//! ([`Pool`]): a change of the pool is written in the same pass, after the pins, and the pin
//! is exclusive when the pass ends. Where they are many (v1, a v2 tree whose containers hold
//! sets of their own), or a full pass's held-back writes are owed (a burst), a chain leaves
//! undone the ancestors' and the other shared members' rewrites when the shared pool changed;
//! and it leaves the kubepods root's narrowing when isolated cpus pinned there were released.
//! A full pass makes them, coalesced: [`Burst::QUIET`] after the last incremental pass, at
//! most [`Burst::LIMIT`] after the first.

use std::collections::BTreeSet;
use std::time::Instant;

use super::{undecided, Burst, CgroupKind, CgroupPath, Class, Controller, PassOutcome, Plan, Scan};
pub(super) use crate::planner::chain::{Mode, Pool};

impl Controller {
    /// Plans and writes only the chains of the pods that changed, when that is all that
    /// changed (see the module's documentation). `None`: a full pass is needed.
    pub(super) fn incremental_pass(&mut self, now: Instant) -> Option<PassOutcome> {
        let mut roots = self.chain()?;
        let pool = self.pool_of_chain(&mut roots);
        let alone = pool.as_ref().map_or(&[][..], |p| &p.alone);
        let chains = self.model.chains(&roots, alone).into_iter();
        let cgroups = chains.filter_map(|p| Some(self.model.get(&p)?.cgroup.clone()));
        // Nothing outside the chain is released but what went.
        let gone_pods = std::mem::take(&mut self.since_pass.gone_pods);
        let scan = self.scan_of(cgroups.collect(), false, gone_pods);
        let classes: Vec<_> = scan.cgroups.iter().map(|c| self.class_of(c)).collect();
        let classes = self.pod_level(&scan, classes);
        let undecided = classes.iter().any(|c| undecided(c));
        let known_limits = self.last_pass.limits.clone();
        let limits = self.node_limits();
        if undecided || known_limits.as_ref() != Some(&limits) {
            self.since_pass.other = true;
            return None;
        }
        let shared_before = self.shared_pool().cloned();
        let root_before = self.pod_cpus().cloned();
        let mode = Mode::Chain { roots, pool };
        let plans_pool = mode.plans_pool();
        let (outcome, follow_up) = self.plan_and_write(now, scan, classes, limits, mode);
        self.metrics.incremental_passes += 1;
        self.since_pass.planned_chains();
        let clean = follow_up.stale.is_empty()
            && follow_up.settling.is_empty()
            && !follow_up.vanished
            && outcome.failed_writes == 0;
        // A change of the pool is left to a full pass unless the chain planned its members.
        let pool_changed = self.shared_pool() != shared_before.as_ref() && !plans_pool;
        // The kubepods root changes without the shared pool when isolated cpus are pinned or
        // released (`cpusetd.io/isolated-cpus`): a chain widens it, a full pass narrows it.
        let root_changed = self.pod_cpus() != root_before.as_ref();
        // Writing showed the model out of date, or a write failed: a full pass sorts it out
        // now (it re-reads what it must and plans again). Without a watcher's arrivals to
        // coalesce (the library's default), every pass makes all its writes: the shared
        // pool's members are rewritten now, after the pins (by the chain itself, when it
        // planned them).
        if !clean || ((pool_changed || root_changed) && self.arrivals.is_none()) {
            self.since_pass.other = true;
            let full = self.full_pass(now);
            return Some(outcome.then(full));
        }
        self.hold_back_for_full_pass(now, pool_changed, root_changed);
        self.update_effects_unless_arrived();
        Some(outcome)
    }

    /// What a chain left undone waits for a full pass, coalesced: the shared pool's members
    /// (as the last full pass counted them) when the pool changed, else the kubepods root's
    /// narrowing when only it changed.
    fn hold_back_for_full_pass(&mut self, now: Instant, pool_changed: bool, root_changed: bool) {
        let held_back = if pool_changed {
            self.last_pass.shared_members as u64
        } else if root_changed {
            1
        } else {
            return;
        };
        self.metrics.writes_held_back += held_back;
        self.deadlines.full_pass.owe(now, now + Burst::QUIET);
    }

    /// The shared pool's members for a chain to plan (see [`Pool`]), when the passes so far
    /// found them few and no write a full pass held back is owed (a burst's rewrites stay
    /// coalesced): a member in a pod joins `roots` with its pod, the others are planned alone.
    fn pool_of_chain(&mut self, roots: &mut Vec<CgroupPath>) -> Option<Pool> {
        if self.deadlines.held_back.due().is_some() {
            return None;
        }
        let mut alone = Vec::new();
        for member in self.last_pass.pool_members.clone()? {
            match self.pod_of(&member) {
                Some(pod) if !roots.contains(&pod) => roots.push(pod),
                Some(_) => {}
                None => alone.push(member),
            }
        }
        Some(Pool { alone })
    }

    /// After a pass planned `scan` (`planned`, in `mode`): the shared pool's members as far
    /// as the passes know them (see [`Plan::pool_members`]), kept while they are few on a
    /// tree whose cgroups inherit (cgroup v2). A full pass finds them all; a chain replaces
    /// those it planned and keeps the others that are still there.
    pub(super) fn track_pool_members(
        &mut self,
        (scan, classes): (&Scan, &[Class]),
        planned: &Plan,
        mode: &Mode,
    ) {
        let known = match mode {
            Mode::Full => Some(BTreeSet::new()),
            Mode::Chain { .. } => self.last_pass.pool_members.take(),
        };
        let members = known.filter(|_| scan.inherits).map(|mut known| {
            known.retain(|p| !mode.owns(p) && self.model.contains_key(p));
            let planned = planned.pool_members(scan, classes).into_iter();
            known.extend(planned.filter(|p| mode.owns(p)).cloned());
            known
        });
        self.last_pass.pool_members = members.filter(|m| m.len() <= Burst::FEW_POOL_MEMBERS);
    }

    /// The pods whose chains an incremental pass plans, when it may: every change since the
    /// last pass is a cgroup new to the model inside a pod, a container gone from a pod that
    /// stays, or a pod gone, and the last full pass left nothing waiting (every demand met,
    /// nothing settling or drifted), so that a full plan would decide nothing about any other
    /// pod. Writes a full pass held back during a burst do not stop it: they are the shared
    /// pool's, which its flush makes, and the chain widens its own ancestors.
    fn chain(&mut self) -> Option<Vec<CgroupPath>> {
        let eligible = self.last_pass.planned
            && self.last_pass.steady
            && !self.since_pass.other
            && self.since_pass.pods_changed()
            && self.parts.policy.is_some()
            && self.deadlines.settling.is_empty()
            && self.since_pass.drifted.is_empty()
            && !self.model.any_waiting();
        if !eligible {
            return None;
        }
        let since = &self.since_pass;
        let changed: Vec<_> = since.new.iter().chain(&since.touched).cloned().collect();
        let roots: Option<BTreeSet<_>> = changed.iter().map(|p| self.pod_of(p)).collect();
        Some(roots?.into_iter().collect())
    }

    /// A cgroup the watcher saw go (see [`crate::agent::model::SincePass::removed`]). Returns
    /// whether the model changed.
    pub(super) fn removed(&mut self, root: &CgroupPath) -> bool {
        let kind = self
            .model
            .get(root)
            .and_then(|e| e.class.as_ref())
            .map(|c| (c.kind.clone(), c.pod_uid.clone()));
        let parent = root.parent().filter(|p| self.model.contains_key(p));
        if !self.forget_subtree(root) {
            return false;
        }
        self.since_pass.removed(kind, parent);
        true
    }

    /// The pod `path` belongs to (itself, or its nearest pod ancestor in the model).
    fn pod_of(&mut self, path: &CgroupPath) -> Option<CgroupPath> {
        let mut at = Some(path.clone());
        while let Some(path) = at {
            let cgroup = self.model.get(&path)?.cgroup.clone();
            if self.class_of(&cgroup).kind == CgroupKind::Pod {
                return Some(path);
            }
            at = path.parent();
        }
        None
    }
}
