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
//! full plan of the same model ([`Controller::assert_chain_is_full_plan`]).
//!
//! What a chain leaves undone: the ancestors' and the other shared members' rewrites when the
//! shared pool changed, and the kubepods root's narrowing when isolated cpus pinned there were
//! released. A full pass makes them, coalesced: [`Burst::QUIET`] after the last
//! incremental pass, at most [`Burst::LIMIT`] after the first.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use super::{entitlement, Burst, CgroupKind, CgroupPath, Controller, Entitlement, PassOutcome};

/// What a pass plans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Mode {
    /// The whole model.
    Full,
    /// New pods: their subtrees (`roots`) and the roots' ancestors.
    Chain { roots: Vec<CgroupPath> },
}

impl Mode {
    pub(super) fn is_full(&self) -> bool {
        matches!(self, Mode::Full)
    }

    /// Whether the pass plans `path`'s own values (and writes them): in a chain, only the
    /// pods' subtrees, not their ancestors.
    pub(super) fn owns(&self, path: &CgroupPath) -> bool {
        match self {
            Mode::Full => true,
            Mode::Chain { roots } => roots.iter().any(|r| path.strip_prefix(r).is_some()),
        }
    }
}

/// What changed in the model since the last pass: an index of paths over the records (a
/// record forgotten leaves it, see [`SincePass::forget`]), which decides what the next pass
/// plans (a chain, a drift repair, the whole model).
#[derive(Debug, Default)]
pub(super) struct SincePass {
    /// Cgroups new to the model.
    pub(super) new: BTreeSet<CgroupPath>,
    /// Pods that lost a container (its cgroup went).
    pub(super) touched: BTreeSet<CgroupPath>,
    /// Pods whose cgroup went (by uid).
    pub(super) gone_pods: BTreeSet<String>,
    /// Anything else: a cgroup gone, re-read with other values, drift. Only a full plan will do.
    pub(super) other: bool,
    /// Cgroups with a foreign change of their `cpuset.cpus` (drift), taken by the pass that
    /// repairs them.
    pub(super) drifted: HashSet<CgroupPath>,
    /// The model changed in more than drifted `cpuset.cpus` values of cgroups the last pass
    /// planned (which [`Controller::pass`] writes back without planning).
    pub(super) structural: bool,
}

impl SincePass {
    /// Before the first pass: everything is new.
    pub(super) fn start() -> SincePass {
        SincePass {
            structural: true,
            ..SincePass::default()
        }
    }

    /// A full pass plans all that changed (drift is taken by the pass that repairs it).
    pub(super) fn planned_all(&mut self) {
        let drifted = std::mem::take(&mut self.drifted);
        *self = SincePass {
            drifted,
            ..SincePass::default()
        };
    }

    /// `path` left the model: the next pass plans without it.
    pub(super) fn forget(&mut self, path: &CgroupPath) {
        self.structural = true;
        self.new.remove(path);
        self.touched.remove(path);
        self.drifted.remove(path);
    }
}

impl Controller {
    /// Plans and writes only the chains of the pods that changed, when that is all that
    /// changed (see the module's documentation). `None`: a full pass is needed.
    pub(super) fn incremental_pass(&mut self, now: Instant) -> Option<PassOutcome> {
        let roots = self.chain()?;
        let mut paths: BTreeSet<CgroupPath> = BTreeSet::new();
        for root in &roots {
            let mut up = root.parent();
            while let Some(parent) = up.filter(|p| self.model.contains_key(p)) {
                up = parent.parent();
                paths.insert(parent);
            }
            paths.extend(self.model.subtree(root));
        }
        let cgroups = paths.iter().filter_map(|p| self.model.get(p));
        let cgroups = cgroups.map(|e| e.cgroup.clone()).collect();
        // Nothing outside the chain is released but what went.
        let gone_pods = std::mem::take(&mut self.since_pass.gone_pods);
        let scan = self.scan_of(cgroups, false, gone_pods);
        let classes: Vec<_> = scan.cgroups.iter().map(|c| self.class_of(c)).collect();
        let classes = self.pod_level(&scan, classes);
        let undecided = classes.iter().any(|c| {
            c.kind == CgroupKind::Container && matches!(entitlement(c), Entitlement::Unknown { .. })
        });
        let known_limits = self.last_pass.limits.clone();
        let limits = self.node_limits();
        if undecided || known_limits.as_ref() != Some(&limits) {
            self.since_pass.other = true;
            return None;
        }
        let shared_before = self.shared_pool().cloned();
        let root_before = self.pod_cpus().cloned();
        let (outcome, follow_up) =
            self.plan_and_write(now, scan, classes, limits, Mode::Chain { roots });
        self.metrics.incremental_passes += 1;
        self.since_pass.structural = false;
        self.since_pass.new.clear();
        self.since_pass.touched.clear();
        let clean = follow_up.stale.is_empty()
            && follow_up.settling.is_empty()
            && !follow_up.vanished
            && outcome.failed_writes == 0;
        let pool_changed = self.shared_pool() != shared_before.as_ref();
        // The kubepods root changes without the shared pool when isolated cpus are pinned or
        // released (`cpusetd.io/isolated-cpus`): a chain widens it, a full pass narrows it.
        let root_changed = self.pod_cpus() != root_before.as_ref();
        // Writing showed the model out of date, or a write failed: a full pass sorts it out
        // now (it re-reads what it must and plans again). Without a watcher's arrivals to
        // coalesce (the library's default), every pass makes all its writes: the shared
        // pool's members are rewritten now, after the pins.
        if !clean || ((pool_changed || root_changed) && self.arrivals.is_none()) {
            self.since_pass.other = true;
            let full = self.full_pass(now);
            return Some(outcome.then(full));
        }
        self.hold_back_for_full_pass(now, pool_changed, root_changed);
        self.update_effects(false);
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

    /// The pods whose chains an incremental pass plans, when it may: every change since the
    /// last pass is a cgroup new to the model inside a pod, a container gone from a pod that
    /// stays, or a pod gone, and the last full pass left nothing waiting (every demand met,
    /// nothing settling or drifted), so that a full plan would decide nothing about any other
    /// pod. Writes a full pass held back during a burst do not stop it: they are the shared
    /// pool's, which its flush makes, and the chain widens its own ancestors.
    fn chain(&mut self) -> Option<Vec<CgroupPath>> {
        let changed = !self.since_pass.new.is_empty()
            || !self.since_pass.touched.is_empty()
            || !self.since_pass.gone_pods.is_empty();
        let eligible = self.last_pass.planned
            && self.last_pass.steady
            && !self.since_pass.other
            && changed
            && self.parts.policy.is_some()
            && self.deadlines.settling.is_empty()
            && self.since_pass.drifted.is_empty()
            && !self.model.any_waiting();
        if !eligible {
            return None;
        }
        let mut roots: BTreeSet<CgroupPath> = BTreeSet::new();
        let touched = self.since_pass.touched.iter();
        for path in self
            .since_pass
            .new
            .iter()
            .chain(touched)
            .cloned()
            .collect::<Vec<_>>()
        {
            roots.insert(self.pod_of(&path)?);
        }
        Some(roots.into_iter().collect())
    }

    /// A cgroup the watcher saw go. A pod that went, or a container that went from a pod that
    /// stays, leaves the next pass incremental (the pod's assignments released; the pod's
    /// chain planned again); anything else makes it a full one. Returns whether the model
    /// changed.
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
        match (kind, parent) {
            (Some((CgroupKind::Pod, Some(uid))), _) => {
                self.since_pass.gone_pods.insert(uid);
            }
            (
                Some((CgroupKind::Container | CgroupKind::Sandbox | CgroupKind::ContainerChild, _)),
                Some(parent),
            ) => {
                self.since_pass.touched.insert(parent);
            }
            _ => self.since_pass.other = true,
        }
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

    /// The reference an incremental pass is held to: a full plan of the same model, from the
    /// same assignments (`before`), decides the same assignments, pools and events, and the
    /// same desired sets and writes for every cgroup of the chain.
    #[cfg(debug_assertions)]
    pub(super) fn assert_chain_is_full_plan(
        &mut self,
        before: &crate::state::Assignments,
        chain: &super::Scan,
        planned: &crate::planner::Plan,
        limits: &crate::planner::NodeLimits,
        mode: &Mode,
    ) {
        use std::collections::HashMap;
        let scan = self.model_scan();
        let classes = self.classify_model(&scan);
        let full = crate::planner::plan(&scan, &classes, before, &self.plan_config(limits));
        assert_eq!(
            planned.assignments, full.assignments,
            "an incremental pass assigned what a full plan would not"
        );
        assert_eq!(planned.pools, full.pools, "an incremental pass's pools");
        assert_eq!(planned.events, full.events, "an incremental pass's events");
        let index: HashMap<&CgroupPath, usize> = scan
            .cgroups
            .iter()
            .enumerate()
            .map(|(i, c)| (&c.path, i))
            .collect();
        for (cgroup, desired) in chain.cgroups.iter().zip(&planned.desired) {
            assert_eq!(
                Some(desired),
                index.get(&cgroup.path).map(|&i| &full.desired[i]),
                "an incremental pass's desired sets of {}",
                cgroup.path
            );
        }
        let chain_paths: HashSet<&CgroupPath> = chain.cgroups.iter().map(|c| &c.path).collect();
        let in_chain = |w: &crate::planner::Step| {
            mode.owns(&w.path)
                || (w.step == crate::planner::WriteStep::Widen && chain_paths.contains(&w.path))
        };
        let key = |w: &crate::planner::Step| (w.path.clone(), w.file, w.value.clone(), w.step);
        let mut mine: Vec<_> = planned.writes.iter().map(key).collect();
        let mut theirs: Vec<_> = full
            .writes
            .iter()
            .filter(|w| in_chain(w))
            .map(key)
            .collect();
        mine.sort();
        theirs.sort();
        assert_eq!(
            mine, theirs,
            "an incremental pass's writes (in its pods, and its ancestors' widenings)"
        );
    }
}
