//! The planner: from the scanned tree, its classification and the assignments so far to the
//! desired `cpuset.cpus` / `cpuset.mems` of every cgroup and an ordered [`WritePlan`]
//! (DESIGN.md §5). Pure: values in, values out; `writer` does the I/O.
//!
//! Steps: [`assign`] decides who holds which exclusive CPUs; [`desired_tree`] derives every
//! cgroup's value from that; [`order_writes`] orders the cpuset writes so the kernel's nesting
//! rules hold after every single write. The plan holds cpuset writes only: the CFS quota lift
//! of exclusive containers is a host effect (`effects::quota`), made after a pass's writes.

pub mod assign;
pub mod chain;
pub mod desired;
pub mod known;
pub mod order;

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, HashSet};

pub use assign::{
    assign, assign_with, AssignEvent, ContainerDemand, Entitlement, NewCpus, ReleaseReason,
};
pub use desired::{desired_tree, parent_indexes, DesiredCgroup, Pools};
pub use known::Known;
pub use order::{
    order_writes, NestingChecker, NestingViolation, Phase, SetNode, SetWrite, Unseen, WritePlan,
};

use crate::allocator::{CpuPool, StaticPolicy};
use crate::cgroupfs::{CgroupPath, FileValue, InterfaceFile, Scan};
use crate::classify::{CgroupKind, Classification, Exclusivity, Millicores, SharedReason};
use crate::cpuset::CpuSet;
use crate::state::{AssignmentKey, Assignments};
use crate::topology::Topology;

/// What the planner needs besides the tree.
#[derive(Debug, Clone, Copy)]
pub struct PlanConfig<'a> {
    pub topology: &'a Topology,
    /// `None` is the `none` policy: nothing is managed, nothing written.
    pub policy: Option<&'a StaticPolicy>,
    pub align_memory: bool,
    /// What kubepods' parent lets pods have now (its effective cpus and memory nodes), when
    /// known: CPUs outside it (offline, or held back by the parent) are never planned.
    pub limits: Option<&'a NodeLimits>,
    /// `--respect-isolcpus` under the `none` policy: no pod runs on the topology's isolated
    /// CPUs, so every cgroup gets the shared pool without them (the static policy carries the
    /// flag itself).
    pub respect_isolcpus: bool,
}

/// The CPUs and memory nodes the node gives kubepods now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLimits {
    pub cpus: Option<CpuSet>,
    pub mems: Option<CpuSet>,
}

/// The step of the plan a write belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteStep {
    /// Top-down, `old ∪ new`.
    Widen,
    /// Bottom-up, `new`.
    Narrow,
    /// A CFS quota written: never in a plan (the agent's lifts are the quota effect's); the
    /// lifts `plan` shows and `plan --apply` makes after the plan, and the quotas `reset`
    /// recovers from the runtime configs.
    LiftQuota,
}

/// One step of a plan: write `value` to `path`'s `file`. Keyed by path: nothing that crosses
/// from the planner to the writer and back is an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Relative to the controller root that holds `file`.
    pub path: CgroupPath,
    pub file: InterfaceFile,
    pub value: String,
    /// The phase of the plan the write belongs to.
    pub step: WriteStep,
    /// Made first, before the rest of the plan ([`WritePlan::urgent_len`]): a pin, a drift
    /// repair, or a write one of those depends on (see [`order::urgent_first`]).
    pub urgent: bool,
}

impl Step {
    /// A step of phase `step`, not urgent.
    pub fn new(path: CgroupPath, file: InterfaceFile, value: String, step: WriteStep) -> Step {
        Step {
            path,
            file,
            value,
            step,
            urgent: false,
        }
    }
}

/// Everything one planning pass decided.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `None` under the `none` policy.
    pub pools: Option<Pools>,
    /// Per scanned cgroup, in scan order.
    pub desired: Vec<DesiredCgroup>,
    pub parents: Vec<Option<usize>>,
    pub assignments: Assignments,
    pub events: Vec<AssignEvent>,
    pub writes: WritePlan,
}

impl Plan {
    /// Someone waits for cpus: an allocation failed or fell short, or a pod was rejected.
    pub fn unmet(&self) -> bool {
        self.events.iter().any(|e| {
            matches!(
                e,
                AssignEvent::Failed { .. }
                    | AssignEvent::Short { .. }
                    | AssignEvent::PodRejected { .. }
            )
        })
    }

    /// How many cgroups get the shared pool written: what a change of the pool rewrites.
    pub fn shared_members(&self) -> usize {
        let shared = self.pools.as_ref().map(|p| &p.shared);
        let desired = self.desired.iter();
        desired
            .filter(|d| d.cpus_to_write().is_some() && d.cpus.as_ref() == shared)
            .count()
    }

    /// The cgroups of `scan` (the tree planned, `classes` its classification) whose
    /// `cpuset.cpus` a change of the shared pool may rewrite: those that hold some of the pool
    /// in a set of their own, and (cgroup v2) those that follow the pool from a parent holding
    /// every pod cpu, which need a set of their own once the pool is narrower (a QoS cgroup,
    /// a Guaranteed pod's sandbox while no cpu is exclusive). Pins (disjoint from the pool)
    /// are not among them, nor pods that follow their parent, nor what follows a member.
    pub fn pool_members<'s, C: Borrow<Classification>>(
        &self,
        scan: &'s Scan,
        classes: &[C],
    ) -> Vec<&'s CgroupPath> {
        let Some(shared) = self.pools.as_ref().map(|p| &p.shared) else {
            return Vec::new();
        };
        let pod = |i: usize| classes[i].borrow().kind == CgroupKind::Pod;
        // Below the top of the scan (the kubepods root) through pods only.
        let mut below_top = vec![false; self.desired.len()];
        for i in 0..below_top.len() {
            below_top[i] = self.parents[i]
                .is_some_and(|p| self.parents[p].is_none() || (pod(p) && below_top[p]));
        }
        let member = |i: usize| {
            let d = &self.desired[i];
            let follows_top = d.cpus_inherited && !pod(i) && below_top[i];
            let cpus = d.cpus.as_ref().filter(|c| !c.is_disjoint(shared));
            cpus.is_some() && (d.cpus_to_write().is_some() || follows_top)
        };
        let paths = scan.cgroups.iter().enumerate();
        paths
            .filter(|&(i, _)| member(i))
            .map(|(_, c)| &c.path)
            .collect()
    }

    /// The containers asking for exclusive cpus: entitled to them (`classes`, the plan's), or
    /// short of them (which may not know their entitlement but remember it).
    pub fn asking<C: Borrow<Classification>>(&self, classes: &[C]) -> HashSet<AssignmentKey> {
        let entitled = classes.iter().map(Borrow::borrow);
        let entitled = entitled.filter(|c| c.exclusive_cpus() > 0);
        let assignments = self.assignments.iter();
        let short = assignments.filter(|(_, a)| a.wanted.is_some());
        let short = short.map(|(k, _)| k.clone());
        entitled
            .filter_map(|c| c.assignment_key())
            .chain(short)
            .collect()
    }
}

/// A container whose entitlement cannot be decided yet (see [`Entitlement::Unknown`]).
pub fn undecided(class: &Classification) -> bool {
    class.kind == CgroupKind::Container && matches!(entitlement(class), Entitlement::Unknown { .. })
}

/// What classification says a container is entitled to. Undecidable or unreadable settings
/// keep what the container holds rather than dropping a pin.
pub fn entitlement(class: &Classification) -> Entitlement {
    match &class.exclusivity {
        Exclusivity::Exclusive { cpus } => Entitlement::Exclusive(*cpus as usize),
        Exclusivity::Shared {
            reason: SharedReason::Undecidable { request },
        } => Entitlement::Unknown {
            request_range: Some(match *request {
                Millicores::Exact(m) => (m, m),
                Millicores::Between { min, max } => (min, max),
            }),
        },
        Exclusivity::Shared {
            reason: SharedReason::CpuSettingsUnavailable,
        } => Entitlement::Unknown {
            request_range: None,
        },
        Exclusivity::Shared { .. } | Exclusivity::NotApplicable => Entitlement::Shared,
    }
}

/// Containers whose name is unknown now (their `config.json` became unreadable) but that hold
/// an assignment made under their name, recognised by container id: the name is filled in, so
/// the container keeps its assignment key and its pin. Returns whether any name was filled.
pub fn names_from_assignments(classes: &mut [Classification], assignments: &Assignments) -> bool {
    let mut filled = false;
    for class in classes.iter_mut().filter(|c| lacks_name(c)) {
        let (Some(pod), Some(id)) = (&class.pod_uid, &class.container_id) else {
            continue;
        };
        let named = assignments.iter().find_map(|(key, a)| match key {
            AssignmentKey::Named { pod_uid, container }
                if pod_uid == pod && a.container_id.as_ref() == Some(id) =>
            {
                Some(container.clone())
            }
            _ => None,
        });
        if let Some(name) = named {
            class.container_name = Some(name);
            filled = true;
        }
    }
    filled
}

/// A container whose name is unknown, but not its pod and id: [`names_from_assignments`] may
/// find it.
fn lacks_name(class: &Classification) -> bool {
    class.kind == CgroupKind::Container
        && class.container_name.is_none()
        && class.pod_uid.is_some()
        && class.container_id.is_some()
}

/// Plans one pass. `classes[i]` classifies `scan.cgroups[i]` (owned, or shared with a cache:
/// they are read, never copied); `previous` are the assignments so far (empty for a one-shot
/// `plan`: the live tree is adopted).
pub fn plan<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    previous: &Assignments,
    config: &PlanConfig<'_>,
) -> Plan {
    // Copied only when a container lacks its name (rare: its config became unreadable).
    if classes.iter().any(|c| lacks_name(c.borrow())) {
        let mut named: Vec<Classification> = classes.iter().map(|c| c.borrow().clone()).collect();
        if names_from_assignments(&mut named, previous) {
            return plan_named(scan, &named, previous, config);
        }
    }
    plan_named(scan, classes, previous, config)
}

/// [`plan`], every container named that can be.
fn plan_named<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    previous: &Assignments,
    config: &PlanConfig<'_>,
) -> Plan {
    let parents = parent_indexes(scan);
    let Some(policy) = config.policy else {
        return plan_without_policy(scan, classes, parents, config);
    };

    let mut pod_cpus = pod_cpus(policy, config);
    let (demands, live_pods) = container_demands(scan, classes, previous);
    // Past the scan's limit nothing unseen is handed out: no new exclusive cpus, and the shared
    // pool does not grow.
    let new_cpus = if scan.truncated {
        NewCpus::Withheld
    } else {
        NewCpus::Given
    };
    // The isolated pool's cpus kubepods' parent lets pods have.
    let mut isolated_cpus = policy.isolated_pool().clone();
    if let Some(cpus) = config.limits.and_then(|l| l.cpus.as_ref()) {
        isolated_cpus = isolated_cpus.intersection(cpus);
    }
    let (assignments, events) = assign_with(
        policy,
        &pod_cpus,
        &demands,
        &live_pods,
        previous,
        (&isolated_cpus, new_cpus),
    );
    let mut shared = pod_cpus.difference(&assignments.exclusive_cpus());
    // The kubepods root holds the isolated cpus pinned there (only those: no other pod runs on
    // an isolated cpu).
    pod_cpus.extend_from(&assignments.exclusive_cpus().intersection(&isolated_cpus));
    if scan.truncated {
        shared = shared_pool_not_grown(scan, classes, shared);
    }

    let pools = Pools {
        shared,
        pod_cpus,
        memory_nodes: pod_memory_nodes(config),
    };
    let desired = desired_tree(
        scan,
        classes,
        &parents,
        &assignments,
        &pools,
        config.topology,
        config.align_memory,
    );

    let reachable = reachable_cpus(config);
    let writes = cpuset_writes(scan, &parents, &desired, &reachable);
    Plan {
        pools: Some(pools),
        desired,
        parents,
        assignments,
        events,
        writes,
    }
}

/// The cpus pods may use: the policy's initial shared pool without what it excludes, within
/// what kubepods' parent gives (unless that leaves nothing).
fn pod_cpus(policy: &StaticPolicy, config: &PlanConfig<'_>) -> CpuSet {
    let mut pod_cpus = policy.initial_shared_pool();
    pod_cpus.remove_all(policy.excluded());
    if let Some(cpus) = config.limits.and_then(|l| l.cpus.as_ref()) {
        let limited = pod_cpus.intersection(cpus);
        // Never an empty pool: a parent that leaves pods nothing is not planned around.
        if !limited.is_empty() {
            pod_cpus = limited;
        }
    }
    pod_cpus
}

/// The cpus that exist for pods now: a cgroup's current set may still name cpus that went
/// offline (v1 took them out of every cpuset already; the model has not read that yet), and
/// a widening must not write them back.
fn reachable_cpus(config: &PlanConfig<'_>) -> CpuSet {
    let mut reachable = config.topology.all_cpus().clone();
    if let Some(cpus) = config.limits.and_then(|l| l.cpus.as_ref()) {
        reachable = reachable.intersection(cpus);
    }
    reachable
}

/// One demand per container that can hold exclusive CPUs (one per key: see below), and the
/// pods that live (those seen, and where the scan is incomplete, those it may not have seen).
fn container_demands<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    previous: &Assignments,
) -> (Vec<ContainerDemand>, BTreeSet<String>) {
    let mut demands: Vec<ContainerDemand> = Vec::new();
    let mut demand_of: HashMap<AssignmentKey, usize> = HashMap::new();
    let mut live_pods: BTreeSet<String> = BTreeSet::new();
    for (cgroup, class) in scan.cgroups.iter().zip(classes.iter().map(Borrow::borrow)) {
        match class.kind {
            CgroupKind::Pod => live_pods.extend(class.pod_uid.clone()),
            CgroupKind::Container => {
                if let Some(key) = class.assignment_key() {
                    let demand = ContainerDemand {
                        key,
                        container_id: class.container_id.clone(),
                        entitlement: entitlement(class),
                        current: cgroup.cpus.configured().cloned(),
                        device_numa: crate::devices::numa_nodes(&class.devices),
                        pool: if class.isolated_cpus {
                            CpuPool::Isolated
                        } else {
                            CpuPool::General
                        },
                        core_type: class.core_type,
                    };
                    match demand_of.get(&demand.key) {
                        None => {
                            demand_of.insert(demand.key.clone(), demands.len());
                            demands.push(demand);
                        }
                        // Two live containers under one key: a restarted container whose old
                        // cgroup is not gone yet. One demand per key, or the two would undo each
                        // other's assignment pass after pass; the container holding the
                        // assignment speaks for the key while it lives, else the first found.
                        // Both sit on the key's CPUs meanwhile.
                        Some(&i) => {
                            let holder = previous
                                .get(&demand.key)
                                .and_then(|a| a.container_id.as_ref());
                            if holder.is_some() && holder == demand.container_id.as_ref() {
                                demands[i] = demand;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if !scan.complete {
        // Pods beyond the scan limit (or outside an incremental pass's part of the tree) were
        // not seen: keep their assignments and rejections, unless they are known to be gone.
        live_pods.extend(
            previous
                .iter()
                .map(|(k, _)| k.pod_uid())
                .chain(previous.rejected().map(|(uid, _)| uid.as_str()))
                .filter(|uid| !scan.gone_pods.contains(*uid))
                .map(str::to_string),
        );
    }
    (demands, live_pods)
}

/// The memory nodes pods may use: those kubepods' parent gives, all of them where it gives
/// none of the node's.
fn pod_memory_nodes(config: &PlanConfig<'_>) -> CpuSet {
    match config.limits.and_then(|l| l.mems.as_ref()) {
        Some(mems) if !mems.intersection(config.topology.memory_nodes()).is_empty() => {
            mems.intersection(config.topology.memory_nodes())
        }
        _ => config.topology.memory_nodes().clone(),
    }
}

/// The shared pool of a truncated scan: at most what the QoS directories (the shared pool's
/// holders) hold now. A CPU they do not hold may be held exclusively by a container past the
/// scan's limit that no checkpoint names: it does not join the pool before a scan sees the
/// whole tree. `shared` as it is when no QoS directory was seen or they hold none of it.
fn shared_pool_not_grown<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    shared: CpuSet,
) -> CpuSet {
    let held_now = scan
        .cgroups
        .iter()
        .zip(classes.iter().map(Borrow::borrow))
        .filter(|(_, class)| class.kind == CgroupKind::QosDir)
        .filter_map(|(cgroup, _)| cgroup.cpus.configured())
        .fold(None, |all: Option<CpuSet>, cpus| {
            Some(all.map_or_else(|| cpus.clone(), |all| all.intersection(cpus)))
        });
    match held_now.map(|held| shared.intersection(&held)) {
        Some(kept) if !kept.is_empty() => kept,
        _ => shared,
    }
}

/// The `none` policy: nothing is managed, nothing written; with `--respect-isolcpus` (which
/// the respect-isolcpus KEP makes policy-agnostic) every cgroup gets the shared pool: every
/// CPU pods may use but the isolated ones.
fn plan_without_policy<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    parents: Vec<Option<usize>>,
    config: &PlanConfig<'_>,
) -> Plan {
    let mut pod_cpus = config
        .topology
        .all_cpus()
        .difference(config.topology.isolated());
    if let Some(cpus) = config.limits.and_then(|l| l.cpus.as_ref()) {
        pod_cpus = pod_cpus.intersection(cpus);
    }
    let isolated = config
        .topology
        .isolated()
        .intersection(config.topology.all_cpus());
    // Never an empty pool: with every cpu isolated (or held back), pods are left alone.
    if !config.respect_isolcpus || isolated.is_empty() || pod_cpus.is_empty() {
        return Plan {
            pools: None,
            desired: vec![DesiredCgroup::default(); scan.cgroups.len()],
            parents,
            assignments: Assignments::new(),
            events: Vec::new(),
            writes: WritePlan::default(),
        };
    }
    let assignments = Assignments::new();
    let pools = Pools {
        shared: pod_cpus.clone(),
        pod_cpus,
        memory_nodes: config.topology.memory_nodes().clone(),
    };
    let desired = desired_tree(
        scan,
        classes,
        &parents,
        &assignments,
        &pools,
        config.topology,
        false,
    );
    let mut reachable = config.topology.all_cpus().clone();
    if let Some(cpus) = config.limits.and_then(|l| l.cpus.as_ref()) {
        reachable = reachable.intersection(cpus);
    }
    let writes = cpuset_writes(scan, &parents, &desired, &reachable);
    Plan {
        pools: Some(pools),
        desired,
        parents,
        assignments,
        events: Vec::new(),
        writes,
    }
}

/// Widen top-down then narrow bottom-up, for `cpuset.cpus` and `cpuset.mems`. A widening of
/// `cpuset.cpus` writes `old ∪ new` without the cpus outside `reachable` (offline ones, which
/// the kernel refuses).
fn cpuset_writes(
    scan: &Scan,
    parents: &[Option<usize>],
    desired: &[DesiredCgroup],
    reachable: &CpuSet,
) -> WritePlan {
    let current = |v: &FileValue<CpuSet>| v.value().cloned().unwrap_or_default();
    let nodes = |pick: fn(&DesiredCgroup) -> Option<&CpuSet>,
                 now: fn(&crate::cgroupfs::ScannedCgroup) -> &FileValue<CpuSet>| {
        scan.cgroups
            .iter()
            .zip(desired)
            .zip(parents)
            .map(|((c, d), p)| SetNode {
                parent: *p,
                current: current(now(c)),
                desired: pick(d).cloned().unwrap_or_default(),
            })
            .collect::<Vec<_>>()
    };
    // What a v2 cgroup inherits is not written (`DesiredCgroup::cpus_inherited`).
    let mut cpus = order_writes(&nodes(DesiredCgroup::cpus_to_write, |c| &c.cpus));
    for w in cpus.iter_mut().filter(|w| w.phase == Phase::Widen) {
        if !w.value.is_subset(reachable) {
            let mut value = w.value.intersection(reachable);
            if let Some(d) = &desired[w.node].cpus {
                value.extend_from(d);
            }
            w.value = value;
        }
    }
    let mems = order_writes(&nodes(DesiredCgroup::mems_to_write, |c| &c.mems));
    let to_write = |w: &SetWrite, file| {
        let step = match w.phase {
            Phase::Widen => WriteStep::Widen,
            Phase::Narrow => WriteStep::Narrow,
        };
        Step::new(
            scan.cgroups[w.node].path.clone(),
            file,
            w.value.to_string(),
            step,
        )
    };
    let mut plan = WritePlan::with_capacity(cpus.len() + mems.len());
    for phase in [Phase::Widen, Phase::Narrow] {
        plan.extend(
            cpus.iter()
                .filter(|w| w.phase == phase)
                .map(|w| to_write(w, InterfaceFile::CpusetCpus)),
        );
        plan.extend(
            mems.iter()
                .filter(|w| w.phase == phase)
                .map(|w| to_write(w, InterfaceFile::CpusetMems)),
        );
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::AllocationError;

    fn key(container: &str) -> AssignmentKey {
        AssignmentKey::Named {
            pod_uid: "uid".into(),
            container: container.into(),
        }
    }

    #[test]
    fn a_plan_says_who_waits_for_cpus_and_how_many_cgroups_share_the_pool() {
        let set = |s: &str| -> CpuSet { s.parse().unwrap() };
        let desired = |cpus: &str, inherited: bool| DesiredCgroup {
            cpus: Some(set(cpus)),
            cpus_inherited: inherited,
            ..DesiredCgroup::default()
        };
        let mut plan = Plan {
            pools: Some(Pools {
                pod_cpus: set("0-3"),
                shared: set("0-1"),
                memory_nodes: set("0"),
            }),
            desired: vec![
                desired("0-3", false),
                desired("0-1", false),
                desired("0-1", true),
                desired("2", false),
            ],
            parents: Vec::new(),
            assignments: Assignments::default(),
            events: vec![AssignEvent::Allocated {
                key: key("a"),
                cpus: set("2"),
            }],
            writes: WritePlan::default(),
        };
        // Written with the pool: not the root, not one that inherits it, not a pin.
        assert_eq!(plan.shared_members(), 1);
        assert!(!plan.unmet());
        plan.events.push(AssignEvent::Failed {
            key: key("b"),
            requested: 3,
            error: AllocationError::SmtNotMultipleOfCore {
                requested: 3,
                cpus_per_core: 2,
            },
        });
        assert!(plan.unmet());
    }
}
