//! Who holds which exclusive CPUs after this pass: keep, adopt, reuse, allocate, release.
//!
//! Input: the containers found in the tree with what they are entitled to, the pods that still
//! exist, and the assignments so far (from memory or the checkpoint). Rules, in order:
//!
//! 1. Assignments of pods that no longer exist are released. An assignment some of whose CPUs
//!    are out of reach now (offline, held back by kubepods' parent, newly reserved) keeps the
//!    rest and is *short* (it remembers the count it is `wanted` for); one left with none is
//!    released. The shared pool is never empty: when the CPUs no one holds went (reserved CPUs
//!    offline), the smallest assignments are released until one is free.
//! 2. A container that keeps its entitlement keeps its CPUs (matched by key: (pod UID, name), or
//!    (pod UID, id)); one whose entitlement went to shared is released. One resized in place
//!    keeps its original set (what it was first given): a growth keeps what it holds and gets
//!    the rest near it (as a short assignment, step 4), and the additions are remembered in
//!    order; a shrink gives back the CPUs added last first, and below the original keeps whole
//!    cores of the original on its NUMA node ([`shrink_in_place`]). One whose entitlement is
//!    *unknown* (e.g. cgroup v2 after the quota was lifted) keeps what it has.
//! 3. **The live tree wins**: a container without an assignment whose current `cpuset.cpus` has
//!    exactly its entitlement, lies within the allocatable CPUs and overlaps no other assignment
//!    is adopted as it is (so planning twice writes nothing, and a restarted agent keeps pins).
//! 4. A short assignment gets replacements from the shared pool, near the CPUs it kept (see
//!    [`replacements`]), before anything new is allocated; when none can be given it keeps what
//!    it has, asks again every pass, and the error says why in kubelet's words.
//! 5. Assignments of containers that are gone while their pod lives are *idle*: a container
//!    restarting under the same key gets them back (rule 2); an unnamed container of the same pod
//!    asking for exactly that many CPUs takes one over (a restart seen only through a new id);
//!    otherwise their CPUs are offered to the pod's next container (kubelet's init-container
//!    reuse) and released when the pod goes.
//! 6. Everything else is allocated with the static policy from the shared pool, in tree order.
//!
//! Steps 4 and 6 give CPUs no one held; a pass whose scan stopped at its limit gives none
//! ([`NewCpus::Withheld`]): a container past the limit may hold them.
//!
//! Pure: no I/O. The result is overlap-free by construction ([`Assignments::insert`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::allocator::{AllocationError, CpuPool, StaticPolicy};
use crate::cpuset::CpuSet;
use crate::state::{Adoption, AssignmentKey, Assignments, ExclusiveAssignment, PodRejection};
use crate::topology::CoreType;

/// What a container is entitled to, as classification decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entitlement {
    /// N exclusive CPUs.
    Exclusive(usize),
    /// The shared pool.
    Shared,
    /// Cannot be told from what is visible now (cgroup v2 after the quota was lifted: only the
    /// lossy `cpu.weight` is left): keep whatever the container holds. `request_range` is what
    /// the visible settings still allow, in millicores; a live set whose size fits it is adopted.
    Unknown { request_range: Option<(u64, u64)> },
}

/// One container found in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDemand {
    pub key: AssignmentKey,
    pub container_id: Option<String>,
    pub entitlement: Entitlement,
    /// Its `cpuset.cpus` now; `None` when not yet initialised or unreadable.
    pub current: Option<CpuSet>,
    /// The NUMA nodes of its devices (empty: none, or not known): the topology hint for a new
    /// allocation, as kubelet's Topology Manager takes it from device plugins.
    pub device_numa: CpuSet,
    /// The CPUs its exclusive set comes from: the isolated pool when its pod asks for it.
    pub pool: CpuPool,
    /// The core type best fit places on first on a hybrid part (`cpusetd.io/core-type`).
    pub core_type: CoreType,
}

/// What happened to one assignment in this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignEvent {
    /// Newly allocated by the policy.
    Allocated { key: AssignmentKey, cpus: CpuSet },
    /// Taken over from the live tree.
    Adopted { key: AssignmentKey, cpus: CpuSet },
    /// Taken over from an idle assignment of the same pod.
    Reused {
        key: AssignmentKey,
        from: AssignmentKey,
        cpus: CpuSet,
    },
    /// Given back to the shared pool.
    Released {
        key: AssignmentKey,
        cpus: CpuSet,
        why: ReleaseReason,
    },
    /// Resized in place to more cpus: it keeps those it held and `added` join them.
    Grown {
        key: AssignmentKey,
        from: CpuSet,
        added: CpuSet,
        cpus: CpuSet,
    },
    /// Resized in place to fewer cpus: it keeps these of the ones it held.
    Shrunk {
        key: AssignmentKey,
        from: CpuSet,
        cpus: CpuSet,
    },
    /// Some of its cpus went out of reach (offline …) and others replace them: it holds its
    /// count again. `lost` is empty when they went in an earlier pass.
    Replaced {
        key: AssignmentKey,
        lost: CpuSet,
        added: CpuSet,
        cpus: CpuSet,
    },
    /// Some of its cpus went out of reach and no replacement can be given: it keeps `cpus`,
    /// fewer than the `wanted` it is entitled to, and asks again next pass.
    Short {
        key: AssignmentKey,
        lost: CpuSet,
        cpus: CpuSet,
        wanted: usize,
        error: AllocationError,
    },
    /// kubelet would reject the pod at admission (`rejection`, for the container `key`, or the
    /// pod's first container when that one is gone): no container of it holds exclusive cpus.
    PodRejected {
        key: AssignmentKey,
        rejection: PodRejection,
    },
    /// The request cannot be met: the container stays in the shared pool.
    Failed {
        key: AssignmentKey,
        requested: usize,
        error: AllocationError,
    },
}

impl AssignEvent {
    /// The assignment the event is about.
    pub fn key(&self) -> &AssignmentKey {
        match self {
            AssignEvent::Allocated { key, .. }
            | AssignEvent::Adopted { key, .. }
            | AssignEvent::Reused { key, .. }
            | AssignEvent::Released { key, .. }
            | AssignEvent::Grown { key, .. }
            | AssignEvent::Shrunk { key, .. }
            | AssignEvent::Replaced { key, .. }
            | AssignEvent::Short { key, .. }
            | AssignEvent::PodRejected { key, .. }
            | AssignEvent::Failed { key, .. } => key,
        }
    }
}

/// Why CPUs went back to the shared pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    PodGone,
    NowShared,
    Resized,
    /// An idle assignment whose CPUs another container of the pod took in part.
    Reused,
    /// Every cpu it held went out of reach (offline, held back by kubepods' parent, newly
    /// reserved): allocated afresh.
    OutOfReach,
    /// The shared pool would have been empty (its reserved cpus went offline).
    SharedPoolEmpty,
    /// kubelet would reject its pod at admission.
    PodRejected,
}

/// The `n` cpus a container keeps when resized in place to fewer, and what is left of what
/// resizes added to it (`grown`, oldest first): the cpus added last go first (a step given
/// back in part keeps whole cores near the rest); below its original set it keeps whole cores
/// of the original on the NUMA node holding most of it. `None` when it does not shrink or the
/// policy cannot pick.
fn shrink_in_place(
    policy: &StaticPolicy,
    cpus: &CpuSet,
    grown: &[CpuSet],
    n: usize,
) -> Option<(CpuSet, Vec<CpuSet>)> {
    if n == 0 || n >= cpus.len() {
        return None;
    }
    let mut steps = grown.to_vec();
    let mut kept = cpus.clone();
    while kept.len() > n {
        let Some(last) = steps.pop() else {
            break;
        };
        let excess = kept.len() - n;
        if last.len() <= excess {
            kept.remove_all(&last);
            continue;
        }
        let rest = kept.difference(&last);
        let keep = keep_near(policy, &last, last.len() - excess, &rest)?;
        kept = rest.union(&keep);
        steps.push(keep);
    }
    if kept.len() > n {
        kept = keep_near(policy, &kept, n, &kept)?;
    }
    (kept.len() == n && kept.is_subset(cpus)).then_some((kept, steps))
}

/// `n` of `from`, NUMA node by node (the nodes holding most of `anchor` first, then most of
/// `from`, then the lowest id), each node's share the policy's pick (whole cores first).
fn keep_near(policy: &StaticPolicy, from: &CpuSet, n: usize, anchor: &CpuSet) -> Option<CpuSet> {
    let index = policy.topology_index();
    let mut nodes: Vec<(usize, usize, u32, CpuSet)> = index
        .numa_node_ids()
        .iter()
        .map(|&id| {
            let node = index.numa_node_cpus(&CpuSet::from_iter([id]));
            let part = from.intersection(&node);
            (anchor.intersection_len(&node), part.len(), id, part)
        })
        .filter(|(_, len, _, _)| *len > 0)
        .collect();
    nodes.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut kept = CpuSet::new();
    for (_, len, _, part) in &nodes {
        let take = (n - kept.len()).min(*len);
        if take == 0 {
            break;
        }
        kept.extend_from(&policy.take_by_topology(part, take).ok()?);
    }
    if kept.len() < n {
        // Cpus of no known node: the policy's pick among them all.
        kept = policy.take_by_topology(from, n).ok()?;
    }
    (kept.len() == n && kept.is_subset(from)).then_some(kept)
}

/// Whether a pass may give CPUs no one held before it (allocations, replacements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewCpus {
    Given,
    /// The scan stopped at its limit: a container past it may hold any CPU. Every request for
    /// new CPUs fails with [`AllocationError::ScanIncomplete`]; keeping, adopting, shrinking and
    /// a pod's own idle CPUs taken over by a restarted container go on.
    Withheld,
}

/// Runs the rules of the module documentation. `pool_cpus` is every CPU pods may use (the
/// kubepods root) but the isolated pool, `live_pods` the UIDs of the pods present.
pub fn assign(
    policy: &StaticPolicy,
    pool_cpus: &CpuSet,
    demands: &[ContainerDemand],
    live_pods: &BTreeSet<String>,
    previous: &Assignments,
) -> (Assignments, Vec<AssignEvent>) {
    assign_with(
        policy,
        pool_cpus,
        demands,
        live_pods,
        previous,
        (policy.isolated_pool(), NewCpus::Given),
    )
}

/// [`assign`], with the isolated cpus pods may use now (those of the policy's isolated pool
/// kubepods' parent lets them have: [`CpuPool::Isolated`] demands take theirs from there, every
/// other demand never does), and new CPUs given or withheld.
pub fn assign_with(
    policy: &StaticPolicy,
    pool_cpus: &CpuSet,
    demands: &[ContainerDemand],
    live_pods: &BTreeSet<String>,
    previous: &Assignments,
    (isolated_cpus, new_cpus): (&CpuSet, NewCpus),
) -> (Assignments, Vec<AssignEvent>) {
    let mut events = Vec::new();
    let mut assignments = previous.clone();
    let pools = PoolCpus::new(policy, pool_cpus, isolated_cpus, demands);

    // 1. Pods gone, cpus out of reach.
    let lost = release_gone_and_out_of_reach(&pools, live_pods, &mut assignments, &mut events);
    release_for_shared_pool(pool_cpus, &mut assignments, &mut events);

    // Pods kubelet would reject at admission whatever is free.
    assignments.retain_rejections(|uid, _| live_pods.contains(uid));
    let mut rejected_now = reject_pods(policy, demands, &mut assignments, &mut events);

    // 2. Keep, or release what changed.
    let kept = keep_or_release(
        policy,
        demands,
        &rejected_now,
        &mut assignments,
        &mut events,
    );

    // 3. Adopt what the live tree shows.
    let to_allocate = adopt_live(&pools, kept.pending, &mut assignments, &mut events);

    // 4. Replacements for cpus short assignments lost.
    replace_short(
        policy,
        (&pools, new_cpus),
        (kept.short, &kept.growing),
        lost,
        &mut assignments,
        &mut events,
    );

    // 5 and 6. Reuse idle assignments of the pod, else allocate.
    allocate_pods(
        policy,
        (&pools, new_cpus),
        demands,
        to_allocate,
        &mut rejected_now,
        &mut assignments,
        &mut events,
    );
    // A pod seen asking and not rejected in this pass is admitted (or asks for nothing now).
    let asking: BTreeSet<&str> = demands.iter().map(|d| d.key.pod_uid()).collect();
    assignments.retain_rejections(|uid, _| rejected_now.contains(uid) || !asking.contains(uid));
    (assignments, events)
}

/// Step 1: pods gone. CPUs out of reach (offline, held back by kubepods' parent, newly
/// reserved) leave their assignment: it keeps the rest and is short until replacements are
/// found (step 4); one left with none is released and allocated afresh. The cpus each short
/// assignment lost.
fn release_gone_and_out_of_reach(
    pools: &PoolCpus,
    live_pods: &BTreeSet<String>,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) -> BTreeMap<AssignmentKey, CpuSet> {
    let mut lost: BTreeMap<AssignmentKey, CpuSet> = BTreeMap::new();
    let held_before: Vec<(AssignmentKey, ExclusiveAssignment)> = assignments
        .iter()
        .map(|(k, a)| (k.clone(), a.clone()))
        .collect();
    for (key, a) in held_before {
        if !live_pods.contains(key.pod_uid()) {
            assignments.remove(&key);
            events.push(AssignEvent::Released {
                key,
                cpus: a.cpus,
                why: ReleaseReason::PodGone,
            });
            continue;
        }
        let allocatable = pools.allocatable_for(key.pod_uid());
        if a.cpus.is_subset(allocatable) {
            continue;
        }
        let kept = a.cpus.intersection(allocatable);
        if kept.is_empty() {
            assignments.remove(&key);
            events.push(AssignEvent::Released {
                key,
                cpus: a.cpus,
                why: ReleaseReason::OutOfReach,
            });
            continue;
        }
        lost.insert(key.clone(), a.cpus.difference(allocatable));
        let short = ExclusiveAssignment {
            wanted: Some(a.entitled()),
            cpus: kept,
            ..a
        };
        // A subset of its own cpus overlaps no one else's.
        let _ = assignments.insert(key, short);
    }
    lost
}

/// Pods kubelet would reject at admission whatever is free (a request that is not whole
/// cores): one so decided stands while the pod lives; the others are decided again, the
/// pod's containers together (steps 5 and 6). The pods rejected in this pass.
fn reject_pods(
    policy: &StaticPolicy,
    demands: &[ContainerDemand],
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) -> BTreeSet<String> {
    let mut refused: Vec<(&ContainerDemand, Option<(usize, AllocationError)>)> = Vec::new();
    let mut rejected_now: BTreeSet<String> = BTreeSet::new();
    for demand in demands {
        let uid = demand.key.pod_uid();
        if rejected_now.contains(uid) {
            continue;
        }
        let error = match demand.entitlement {
            Entitlement::Exclusive(n) => policy.request_error(n).map(|e| (n, e)),
            _ => None,
        };
        if error.is_some() || assignments.rejection(uid).is_some_and(|r| r.permanent) {
            refused.push((demand, error));
            rejected_now.insert(uid.to_string());
        }
    }
    for (demand, error) in &refused {
        let uid = demand.key.pod_uid();
        match error {
            Some((n, error)) => {
                events.push(AssignEvent::Failed {
                    key: demand.key.clone(),
                    requested: *n,
                    error: error.clone(),
                });
                reject_pod(uid, demand, error, assignments, events);
            }
            None => {
                let rejection = assignments.rejection(uid).cloned();
                release_pod(uid, assignments, events);
                if let Some(rejection) = rejection {
                    events.push(AssignEvent::PodRejected {
                        key: demand.key.clone(),
                        rejection,
                    });
                }
            }
        }
    }
    rejected_now
}

/// What step 2 leaves to the steps after it.
struct Kept<'d> {
    /// Containers that hold no assignment now (step 3, then 5 and 6), in tree order.
    pending: Vec<&'d ContainerDemand>,
    /// Assignments short of the count they are entitled to (step 4), in tree order.
    short: Vec<(&'d ContainerDemand, usize)>,
    /// Those of `short` that grow in place.
    growing: BTreeSet<AssignmentKey>,
}

/// Step 2 for one container: what comes of it next.
enum KeptAs {
    /// Kept as it is, released to shared, or nothing to do.
    Done,
    /// Holds nothing now (step 3, then 5 and 6).
    Pending,
    /// Short of `n` cpus it is entitled to (step 4).
    Short(usize),
    /// Grows in place to `n` cpus (step 4).
    Growing(usize),
}

/// Step 2: keep, or release what changed (the containers of pods not rejected in this pass).
fn keep_or_release<'d>(
    policy: &StaticPolicy,
    demands: &'d [ContainerDemand],
    rejected_now: &BTreeSet<String>,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) -> Kept<'d> {
    let mut pending: Vec<&ContainerDemand> = Vec::new();
    let mut short: Vec<(&ContainerDemand, usize)> = Vec::new();
    let mut growing: BTreeSet<AssignmentKey> = BTreeSet::new();
    for demand in demands {
        if rejected_now.contains(demand.key.pod_uid()) {
            continue;
        }
        match keep_one(policy, demand, assignments, events) {
            KeptAs::Done => {}
            KeptAs::Pending => pending.push(demand),
            KeptAs::Short(n) => short.push((demand, n)),
            KeptAs::Growing(n) => {
                growing.insert(demand.key.clone());
                short.push((demand, n));
            }
        }
    }
    Kept {
        pending,
        short,
        growing,
    }
}

/// Step 2 for one container: its entitlement against what it holds.
fn keep_one(
    policy: &StaticPolicy,
    demand: &ContainerDemand,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) -> KeptAs {
    let held = assignments.get(&demand.key).cloned();
    let wanted = held.as_ref().and_then(|a| a.wanted);
    match (demand.entitlement, held.map(|a| a.cpus)) {
        (Entitlement::Exclusive(n), Some(cpus)) if cpus.len() == n => {
            refresh_container_id(assignments, demand);
            if wanted.is_some() {
                set_wanted(assignments, &demand.key, None);
            }
            KeptAs::Done
        }
        // Short of cpus that went out of reach: replacements are looked for (step 4).
        (Entitlement::Exclusive(n), Some(_)) if wanted == Some(n) => {
            refresh_container_id(assignments, demand);
            KeptAs::Short(n)
        }
        (Entitlement::Unknown { .. }, Some(_)) => {
            refresh_container_id(assignments, demand);
            wanted.map_or(KeptAs::Done, KeptAs::Short)
        }
        (Entitlement::Exclusive(n), Some(cpus)) => {
            resize(policy, demand, (cpus, n), assignments, events)
        }
        (Entitlement::Shared, Some(cpus)) => {
            release(
                &demand.key,
                cpus,
                ReleaseReason::NowShared,
                assignments,
                events,
            );
            KeptAs::Done
        }
        (Entitlement::Exclusive(_) | Entitlement::Unknown { .. }, None) => KeptAs::Pending,
        (Entitlement::Shared, None) => KeptAs::Done,
    }
}

/// Step 2 for a container resized in place from `cpus` to `n` (neither what it holds nor what
/// it is short of).
fn resize(
    policy: &StaticPolicy,
    demand: &ContainerDemand,
    (cpus, n): (CpuSet, usize),
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) -> KeptAs {
    // An in-place growth keeps what it holds and asks for the rest near it, as a
    // short assignment does (step 4); until it can be given it keeps what it has.
    if n > cpus.len() {
        refresh_container_id(assignments, demand);
        set_wanted(assignments, &demand.key, Some(n));
        return KeptAs::Growing(n);
    }
    // An in-place shrink gives back the cpus added last; below the original set it
    // keeps whole cores of the original on its NUMA node (see `shrink_in_place`), so
    // the container neither moves nor loses its memory locality. (A pick that fails
    // is released and allocated afresh.)
    if let Some(shrunk) = shrink_in_place(policy, &cpus, assignments.grown(&demand.key), n) {
        shrink(demand, cpus, shrunk, assignments, events);
        return KeptAs::Done;
    }
    release(
        &demand.key,
        cpus,
        ReleaseReason::Resized,
        assignments,
        events,
    );
    KeptAs::Pending
}

/// An in-place shrink of `demand` from `from` to `kept`, what is left of its growth `steps`
/// (see [`shrink_in_place`]).
fn shrink(
    demand: &ContainerDemand,
    from: CpuSet,
    (kept, steps): (CpuSet, Vec<CpuSet>),
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) {
    // A subset of its own cpus overlaps no one else's.
    let _ = assignments.remove(&demand.key);
    let _ = assignments.insert(
        demand.key.clone(),
        ExclusiveAssignment {
            cpus: kept.clone(),
            container_id: demand.container_id.clone(),
            adopted: None,
            wanted: None,
        },
    );
    assignments.set_grown(&demand.key, steps);
    events.push(AssignEvent::Shrunk {
        key: demand.key.clone(),
        from,
        cpus: kept,
    });
}

/// The assignment of `key` (holding `cpus`) goes back to the shared pool.
fn release(
    key: &AssignmentKey,
    cpus: CpuSet,
    why: ReleaseReason,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) {
    assignments.remove(key);
    events.push(AssignEvent::Released {
        key: key.clone(),
        cpus,
        why,
    });
}

/// Step 3: adopt what the live tree shows. The containers left to allocate (steps 5 and 6).
fn adopt_live<'d>(
    pools: &PoolCpus,
    pending: Vec<&'d ContainerDemand>,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) -> Vec<&'d ContainerDemand> {
    let mut to_allocate: Vec<&ContainerDemand> = Vec::new();
    for demand in pending {
        match adoptable(pools, demand, assignments) {
            Some(cpus) => {
                let assignment = ExclusiveAssignment {
                    cpus: cpus.clone(),
                    container_id: demand.container_id.clone(),
                    adopted: Some(Adoption::LiveTree),
                    wanted: None,
                };
                if assignments.insert(demand.key.clone(), assignment).is_ok() {
                    events.push(AssignEvent::Adopted {
                        key: demand.key.clone(),
                        cpus: cpus.clone(),
                    });
                } else {
                    to_allocate.push(demand);
                }
            }
            // Unknown entitlements are never allocated: nothing says they want CPUs.
            None if matches!(demand.entitlement, Entitlement::Exclusive(_)) => {
                to_allocate.push(demand)
            }
            None => {}
        }
    }
    to_allocate
}

/// The live set of `demand` when it may be adopted: its entitlement's size, within the
/// allocatable cpus, and no one else's.
fn adoptable<'d>(
    pools: &PoolCpus,
    demand: &'d ContainerDemand,
    assignments: &Assignments,
) -> Option<&'d CpuSet> {
    let pool_cpus = pools.pool_cpus;
    let fits = |len: usize| match demand.entitlement {
        Entitlement::Exclusive(n) => len == n,
        Entitlement::Unknown {
            request_range: Some((min, max)),
        } => (min..=max).contains(&(len as u64 * 1000)),
        _ => false,
    };
    // Not the shared pool as it stands (a shared container sits there), and never a set
    // that would leave the shared pool empty.
    let shared_now = pool_cpus.difference(&assignments.exclusive_cpus());
    demand.current.as_ref().filter(|cur| {
        fits(cur.len())
            && cur.is_subset(pools.allocatable_for(demand.key.pod_uid()))
            && *cur != pool_cpus
            && **cur != shared_now
            && !shared_now.is_subset(cur)
            && assignments.holder_of(cur, &demand.key).is_none()
    })
}

/// Step 4: replacements for cpus short assignments lost (`lost`: the cpus each lost in this
/// pass), and the rest of in-place growths (`growing`), before anything new is allocated: a
/// running container comes first.
fn replace_short(
    policy: &StaticPolicy,
    (pools, new_cpus): (&PoolCpus, NewCpus),
    (short, growing): (Vec<(&ContainerDemand, usize)>, &BTreeSet<AssignmentKey>),
    mut lost: BTreeMap<AssignmentKey, CpuSet>,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) {
    for (demand, n) in short {
        let Some(held) = assignments.get(&demand.key).cloned() else {
            continue;
        };
        let lost = lost.remove(&demand.key).unwrap_or_default();
        let free = pools.free(demand.pool, assignments);
        let replaced = match new_cpus {
            NewCpus::Given => replacements(
                policy,
                (demand.pool, demand.core_type),
                &held.cpus,
                n,
                &free,
            ),
            NewCpus::Withheld => Err(AllocationError::ScanIncomplete),
        };
        match replaced {
            Ok(cpus) => {
                let grows = growing.contains(&demand.key);
                replace(
                    &demand.key,
                    (held, cpus),
                    (lost, grows),
                    assignments,
                    events,
                );
            }
            Err(error) => events.push(AssignEvent::Short {
                key: demand.key.clone(),
                lost,
                cpus: held.cpus,
                wanted: n,
                error,
            }),
        }
    }
}

/// The short assignment `held` of `key` holds `cpus` now: it lost `lost` (in this pass), or it
/// `grows` in place.
fn replace(
    key: &AssignmentKey,
    (held, cpus): (ExclusiveAssignment, CpuSet),
    (lost, grows): (CpuSet, bool),
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) {
    let added = cpus.difference(&held.cpus);
    let from = held.cpus.clone();
    // Moved in part: the agent's choice now, no longer an adopted pin.
    let whole = ExclusiveAssignment {
        cpus: cpus.clone(),
        wanted: None,
        adopted: None,
        ..held
    };
    // Its own cpus and some of the shared pool's: no one else's.
    if assignments.insert(key.clone(), whole).is_ok() {
        // Cpus added to those it kept are its newest: a shrink gives them back
        // first (a move keeps only what is left of earlier additions).
        if from.is_subset(&cpus) && !added.is_empty() {
            let mut steps = assignments.grown(key).to_vec();
            steps.push(added.clone());
            assignments.set_grown(key, steps);
        }
        events.push(if grows {
            AssignEvent::Grown {
                key: key.clone(),
                from,
                added,
                cpus,
            }
        } else {
            AssignEvent::Replaced {
                key: key.clone(),
                lost,
                added,
                cpus,
            }
        });
    }
}

/// Steps 5 and 6: reuse idle assignments of the pod, else allocate: a pod's containers
/// together, as kubelet admits a pod, pods in tree order. A pod rejected joins `rejected_now`.
fn allocate_pods(
    policy: &StaticPolicy,
    (pools, new_cpus): (&PoolCpus, NewCpus),
    demands: &[ContainerDemand],
    to_allocate: Vec<&ContainerDemand>,
    rejected_now: &mut BTreeSet<String>,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) {
    let present: BTreeSet<&AssignmentKey> = demands.iter().map(|d| &d.key).collect();
    let mut by_pod: Vec<(&str, Vec<&ContainerDemand>)> = Vec::new();
    for demand in to_allocate {
        let uid = demand.key.pod_uid();
        match by_pod.iter_mut().find(|(u, _)| *u == uid) {
            Some((_, group)) => group.push(demand),
            None => by_pod.push((uid, vec![demand])),
        }
    }
    for (uid, group) in by_pod {
        if !allocate_pod(
            policy,
            (pools, new_cpus),
            (group, &present),
            assignments,
            events,
        ) {
            rejected_now.insert(uid.to_string());
        }
    }
}

/// Steps 5 and 6 for the containers of one pod (`group`), `present` the keys of every
/// container in the tree. The first that cannot be met rejects the pod: what its other
/// containers were given in this pass is undone and what they held is released. Whether the
/// pod is admitted.
fn allocate_pod(
    policy: &StaticPolicy,
    (pools, new_cpus): (&PoolCpus, NewCpus),
    (group, present): (Vec<&ContainerDemand>, &BTreeSet<&AssignmentKey>),
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) -> bool {
    let mut undo = Undo::default();
    let first_event = events.len();
    for demand in group {
        let Entitlement::Exclusive(n) = demand.entitlement else {
            continue;
        };
        let allocated = allocate_one(
            policy,
            (pools, new_cpus),
            demand,
            n,
            present,
            assignments,
            events,
            &mut undo,
        );
        if let Err(AllocationError::ScanIncomplete) = allocated {
            // Not kubelet's refusal: the agent cannot see every holder yet. The pod is
            // neither rejected nor released; it is asked again once a scan sees the tree.
            events.push(AssignEvent::Failed {
                key: demand.key.clone(),
                requested: n,
                error: AllocationError::ScanIncomplete,
            });
            continue;
        }
        if let Err(error) = allocated {
            undo.roll_back(assignments);
            events.truncate(first_event);
            events.push(AssignEvent::Failed {
                key: demand.key.clone(),
                requested: n,
                error: error.clone(),
            });
            reject_pod(demand.key.pod_uid(), demand, &error, assignments, events);
            return false;
        }
    }
    true
}

/// Changes to the assignments that a pod's rejection takes back: each key with what it held
/// before (`None`: nothing).
#[derive(Default)]
struct Undo(Vec<(AssignmentKey, Option<ExclusiveAssignment>, Vec<CpuSet>)>);

impl Undo {
    fn record(&mut self, assignments: &Assignments, key: &AssignmentKey) {
        let grown = assignments.grown(key).to_vec();
        self.0
            .push((key.clone(), assignments.get(key).cloned(), grown));
    }

    fn roll_back(self, assignments: &mut Assignments) {
        for (key, before, grown) in self.0.into_iter().rev() {
            assignments.remove(&key);
            if let Some(before) = before {
                // What it held before this pass's changes, which are all undone by now.
                let _ = assignments.insert(key.clone(), before);
                assignments.set_grown(&key, grown);
            }
        }
    }
}

/// kubelet would reject pod `uid` at admission (`error` for its container `demand`): no
/// container of it keeps exclusive cpus; the rejection is recorded and said.
fn reject_pod(
    uid: &str,
    demand: &ContainerDemand,
    error: &AllocationError,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) {
    release_pod(uid, assignments, events);
    let container = match &demand.key {
        AssignmentKey::Named { container, .. } => container.clone(),
        AssignmentKey::Id { container_id, .. } => format!("id:{container_id}"),
    };
    let fresh = PodRejection {
        reason: error.admission_reason(),
        container,
        message: error.admission_message(),
        permanent: error.is_permanent(),
    };
    // Rejected again for the same reason: kept as first said (the free counts in the message
    // may differ from pass to pass; the decision does not).
    let rejection = match assignments.rejection(uid) {
        Some(known) if known.reason == fresh.reason && known.container == fresh.container => {
            known.clone()
        }
        _ => fresh,
    };
    assignments.reject(uid, rejection.clone());
    events.push(AssignEvent::PodRejected {
        key: demand.key.clone(),
        rejection,
    });
}

/// Every assignment of pod `uid` is released: kubelet would reject the pod.
fn release_pod(uid: &str, assignments: &mut Assignments, events: &mut Vec<AssignEvent>) {
    let held: Vec<(AssignmentKey, CpuSet)> = assignments
        .iter()
        .filter(|(k, _)| k.pod_uid() == uid)
        .map(|(k, a)| (k.clone(), a.cpus.clone()))
        .collect();
    for (key, cpus) in held {
        assignments.remove(&key);
        events.push(AssignEvent::Released {
            key,
            cpus,
            why: ReleaseReason::PodRejected,
        });
    }
}

/// Rule 5 or 6 for one container entitled to `n` cpus: an idle set of its pod taken over, or
/// the policy's allocation. Every change is recorded in `undo`.
#[allow(clippy::too_many_arguments)]
fn allocate_one(
    policy: &StaticPolicy,
    (pools, new_cpus): (&PoolCpus, NewCpus),
    demand: &ContainerDemand,
    n: usize,
    present: &BTreeSet<&AssignmentKey>,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
    undo: &mut Undo,
) -> Result<(), AllocationError> {
    let idle: Vec<(AssignmentKey, CpuSet)> = assignments
        .iter()
        .filter(|(k, _)| k.pod_uid() == demand.key.pod_uid() && !present.contains(k))
        .map(|(k, a)| (k.clone(), a.cpus.clone()))
        .collect();
    if reuse_restarted(demand, n, &idle, assignments, events, undo) {
        return Ok(());
    }
    if new_cpus == NewCpus::Withheld {
        return Err(AllocationError::ScanIncomplete);
    }
    let reusable: CpuSet = idle.iter().fold(CpuSet::new(), |mut acc, (_, c)| {
        acc.extend_from(c);
        acc
    });
    let free = pools.free(demand.pool, assignments);
    let hint = allocation_hint(policy, demand, n, &free, &reusable);
    match policy.allocate_in(
        demand.pool,
        n,
        &free,
        hint.as_ref(),
        &reusable,
        demand.core_type,
    ) {
        Ok(cpus) => {
            for (from, idle_cpus) in &idle {
                if !idle_cpus.is_disjoint(&cpus) {
                    undo.record(assignments, from);
                    assignments.remove(from);
                    events.push(AssignEvent::Released {
                        key: from.clone(),
                        cpus: idle_cpus.clone(),
                        why: ReleaseReason::Reused,
                    });
                }
            }
            let assignment = ExclusiveAssignment {
                cpus: cpus.clone(),
                container_id: demand.container_id.clone(),
                adopted: None,
                wanted: None,
            };
            undo.record(assignments, &demand.key);
            match assignments.insert(demand.key.clone(), assignment) {
                Ok(()) => events.push(AssignEvent::Allocated {
                    key: demand.key.clone(),
                    cpus,
                }),
                // Cannot happen: the policy only picks from the shared pool and this pod's
                // idle CPUs, which were just released. Kept shared if it ever does.
                Err(e) => log::error!("cg={} allocation refused: {e}", demand.key),
            }
        }
        Err(error) => return Err(error),
    }
    Ok(())
}

/// A restart seen only through a new container id: the pod's idle assignment of the same
/// size (under an old id) passes to the new id. Whether it did.
fn reuse_restarted(
    demand: &ContainerDemand,
    n: usize,
    idle: &[(AssignmentKey, CpuSet)],
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
    undo: &mut Undo,
) -> bool {
    if !matches!(demand.key, AssignmentKey::Id { .. }) {
        return false;
    }
    let Some((from, cpus)) = idle
        .iter()
        .find(|(k, c)| matches!(k, AssignmentKey::Id { .. }) && c.len() == n)
    else {
        return false;
    };
    undo.record(assignments, from);
    assignments.remove(from);
    let assignment = ExclusiveAssignment {
        cpus: cpus.clone(),
        container_id: demand.container_id.clone(),
        adopted: None,
        wanted: None,
    };
    undo.record(assignments, &demand.key);
    if assignments.insert(demand.key.clone(), assignment).is_err() {
        return false;
    }
    events.push(AssignEvent::Reused {
        key: demand.key.clone(),
        from: from.clone(),
        cpus: cpus.clone(),
    });
    true
}

/// The NUMA hint of one allocation. The devices' NUMA nodes are the hint when known (the
/// device plugins' hint, which a Topology Manager merges with the CPU manager's to the
/// devices' nodes; with `align-by-socket` the policy widens it to their sockets). Otherwise:
/// kubelet without a Topology Manager gives no hint, so `align-by-socket` would do nothing:
/// with it, the hint a best-effort Topology Manager would give (see `socket_aligned_hint`)
/// is computed here.
fn allocation_hint(
    policy: &StaticPolicy,
    demand: &ContainerDemand,
    n: usize,
    free: &CpuSet,
    reusable: &CpuSet,
) -> Option<CpuSet> {
    if demand.device_numa.is_empty() {
        policy
            .aligns_by_socket()
            .then(|| policy.socket_aligned_hint_in(demand.pool, n, free, reusable))
            .flatten()
    } else {
        Some(demand.device_numa.clone())
    }
}

/// The cpus a short assignment holding `held` should hold to have `n` again: `n - held` more
/// from the shared pool, the policy's pick with the NUMA nodes of the held cpus as its hint (so
/// the container neither moves nor leaves its node where it can be helped); when that cannot
/// be given (`full-pcpus-only` asks for whole cores), all `n` afresh from the shared pool and
/// the held cpus (kubelet's reusable cpus), which may move it. The error is the last
/// allocation's, in kubelet's words.
fn replacements(
    policy: &StaticPolicy,
    (pool, core_type): (CpuPool, CoreType),
    held: &CpuSet,
    n: usize,
    free: &CpuSet,
) -> Result<CpuSet, AllocationError> {
    let missing = n.saturating_sub(held.len());
    let hint = policy.numa_nodes_of(held);
    let hint = (!hint.is_empty()).then_some(hint);
    policy
        .allocate_in(
            pool,
            missing,
            free,
            hint.as_ref(),
            &CpuSet::new(),
            core_type,
        )
        .map(|added| held.union(&added))
        .or_else(|_| policy.allocate_in(pool, n, free, hint.as_ref(), held, core_type))
}

/// The cpus each pool may hand out in one pass, and which pool each pod's cpus belong to.
struct PoolCpus<'a> {
    /// Every cpu pods may use but the isolated pool (the kubepods root without it).
    pool_cpus: &'a CpuSet,
    /// The isolated pool's cpus pods may use now (all allocatable).
    isolated: CpuSet,
    /// The general pool's allocatable cpus, and those with the isolated ones.
    general_allocatable: CpuSet,
    either_allocatable: CpuSet,
    /// The pool of every pod with a container in the tree (the annotation is the pod's).
    by_pod: BTreeMap<&'a str, CpuPool>,
}

impl<'a> PoolCpus<'a> {
    fn new(
        policy: &StaticPolicy,
        pool_cpus: &'a CpuSet,
        isolated_cpus: &CpuSet,
        demands: &'a [ContainerDemand],
    ) -> Self {
        let isolated = policy.allocatable_in(CpuPool::Isolated, isolated_cpus);
        let general_allocatable = policy.allocatable(pool_cpus);
        // Without an isolated pool and a pod asking for one, every pod's pool is the general
        // one, which is what an empty map says (`either` is `general` then): the usual node
        // builds no map.
        let by_pod = if isolated.is_empty() && demands.iter().all(|d| d.pool == CpuPool::General) {
            BTreeMap::new()
        } else {
            demands.iter().map(|d| (d.key.pod_uid(), d.pool)).collect()
        };
        PoolCpus {
            pool_cpus,
            either_allocatable: general_allocatable.union(&isolated),
            isolated,
            general_allocatable,
            by_pod,
        }
    }

    /// The cpus pod `uid`'s assignments may hold: its pool's allocatable cpus (either pool's
    /// for a pod with no container in the tree now).
    fn allocatable_for(&self, uid: &str) -> &CpuSet {
        match self.by_pod.get(uid) {
            Some(CpuPool::General) => &self.general_allocatable,
            Some(CpuPool::Isolated) => &self.isolated,
            None => &self.either_allocatable,
        }
    }

    /// The cpus of `pool` no assignment holds: the shared pool, or the isolated cpus free.
    fn free(&self, pool: CpuPool, assignments: &Assignments) -> CpuSet {
        match pool {
            CpuPool::General => self.pool_cpus.difference(&assignments.exclusive_cpus()),
            CpuPool::Isolated => self.isolated.difference(&assignments.exclusive_cpus()),
        }
    }
}

/// The shared pool is never empty (it is where every other container runs): when the cpus out
/// of reach were the ones no container holds (the reserved cpus went offline), the smallest
/// assignments (the last key among equals) give theirs back until one is free.
fn release_for_shared_pool(
    pool_cpus: &CpuSet,
    assignments: &mut Assignments,
    events: &mut Vec<AssignEvent>,
) {
    while !pool_cpus.is_empty() && pool_cpus.is_subset(&assignments.exclusive_cpus()) {
        let Some((key, cpus)) = assignments
            .iter()
            .min_by(|(ka, a), (kb, b)| a.cpus.len().cmp(&b.cpus.len()).then(kb.cmp(ka)))
            .map(|(k, a)| (k.clone(), a.cpus.clone()))
        else {
            return;
        };
        assignments.remove(&key);
        events.push(AssignEvent::Released {
            key,
            cpus,
            why: ReleaseReason::SharedPoolEmpty,
        });
    }
}

fn set_wanted(assignments: &mut Assignments, key: &AssignmentKey, wanted: Option<usize>) {
    if let Some(held) = assignments.get(key) {
        let updated = ExclusiveAssignment {
            wanted,
            ..held.clone()
        };
        // Same key, same CPUs: cannot overlap anything new.
        let _ = assignments.insert(key.clone(), updated);
    }
}

fn refresh_container_id(assignments: &mut Assignments, demand: &ContainerDemand) {
    let Some(held) = assignments.get(&demand.key) else {
        return;
    };
    if demand.container_id.is_some() && held.container_id != demand.container_id {
        let updated = ExclusiveAssignment {
            cpus: held.cpus.clone(),
            container_id: demand.container_id.clone(),
            adopted: held.adopted,
            wanted: None,
        };
        // Same key, same CPUs: cannot overlap anything new.
        let _ = assignments.insert(demand.key.clone(), updated);
    }
}

#[allow(clippy::too_many_lines)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{Placement, PolicyOptions, ReservedCpus};
    use crate::topology::{CpuInfo, Topology};

    /// 1 socket, 4 cores, HT: core n = cpus n and n+4.
    fn one_socket_four_cores() -> Topology {
        let cpus = (0..8)
            .map(|id| CpuInfo {
                id,
                socket: 0,
                die: 0,
                numa: 0,
                core: id % 4,
                uncore: 0,
                cluster: None,
            })
            .collect();
        Topology::new(cpus, CpuSet::new(), CpuSet::new(), CpuSet::range(0, 0)).unwrap()
    }

    fn policy(reserved: &str) -> (StaticPolicy, CpuSet) {
        let p = StaticPolicy::new(
            &one_socket_four_cores(),
            PolicyOptions::default(),
            ReservedCpus::List(CpuSet::parse(reserved).unwrap()),
            false,
        )
        .unwrap();
        (p, CpuSet::range(0, 7))
    }

    fn named(pod: &str, name: &str) -> AssignmentKey {
        AssignmentKey::Named {
            pod_uid: pod.into(),
            container: name.into(),
        }
    }

    fn demand(key: AssignmentKey, e: Entitlement, current: Option<&str>) -> ContainerDemand {
        ContainerDemand {
            key,
            container_id: None,
            entitlement: e,
            current: current.map(|c| CpuSet::parse(c).unwrap()),
            device_numa: CpuSet::new(),
            pool: CpuPool::General,
            core_type: CoreType::default(),
        }
    }

    fn pods(uids: &[&str]) -> BTreeSet<String> {
        uids.iter().map(|s| s.to_string()).collect()
    }

    fn held(a: &Assignments, key: &AssignmentKey) -> String {
        a.get(key).map(|x| x.cpus.to_string()).unwrap_or_default()
    }

    /// 2 sockets, each one NUMA node of 4 cores without SMT: node 0 = cpus 0-3, node 1 = 4-7.
    fn two_node_policy(options: PolicyOptions, placement: Placement) -> StaticPolicy {
        let cpus = (0..8)
            .map(|id| CpuInfo {
                id,
                socket: id / 4,
                die: 0,
                numa: id / 4,
                core: id,
                uncore: id / 4,
                cluster: None,
            })
            .collect();
        let topo = Topology::new(cpus, CpuSet::new(), CpuSet::new(), CpuSet::range(0, 1)).unwrap();
        StaticPolicy::new(
            &topo,
            options,
            ReservedCpus::List(CpuSet::parse("0").unwrap()),
            false,
        )
        .unwrap()
        .with_placement(placement)
        .unwrap()
    }

    fn with_devices_on(key: AssignmentKey, n: usize, nodes: &str) -> ContainerDemand {
        ContainerDemand {
            device_numa: CpuSet::parse(nodes).unwrap(),
            pool: CpuPool::General,
            core_type: CoreType::default(),
            ..demand(key, Entitlement::Exclusive(n), Some("1-7"))
        }
    }

    #[test]
    fn devices_pull_a_new_allocation_to_their_numa_node() {
        let all = CpuSet::range(0, 7);
        let socket = PolicyOptions {
            align_by_socket: true,
            ..PolicyOptions::default()
        };
        for (options, placement) in [
            (PolicyOptions::default(), Placement::Kubelet),
            (PolicyOptions::default(), Placement::BestFit),
            (socket, Placement::Kubelet),
        ] {
            let p = two_node_policy(options, placement);
            let what = format!("{options:?} {placement:?}");
            // Without devices: kubelet's pick, node 0 after the reserved cpu.
            let plain = vec![demand(
                named("a", "app"),
                Entitlement::Exclusive(2),
                Some("1-7"),
            )];
            let (a, _) = assign(&p, &all, &plain, &pods(&["a"]), &Assignments::new());
            assert_eq!(held(&a, &named("a", "app")), "1-2", "{what}");
            // With a device on node 1: node 1.
            let d = vec![with_devices_on(named("a", "app"), 2, "1")];
            let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
            assert_eq!(held(&a, &named("a", "app")), "4-5", "{what}");
            // More than the node has free: all of node 1, the rest from elsewhere.
            let d = vec![with_devices_on(named("a", "app"), 5, "1")];
            let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
            let cpus = a.get(&named("a", "app")).unwrap().cpus.clone();
            assert_eq!(cpus.len(), 5, "{what}");
            assert!(CpuSet::range(4, 7).is_subset(&cpus), "{what}: {cpus}");
        }
    }

    #[test]
    fn devices_on_a_full_or_unknown_node_change_nothing() {
        let all = CpuSet::range(0, 7);
        let distribute = PolicyOptions {
            distribute_cpus_across_numa: true,
            ..PolicyOptions::default()
        };
        for options in [PolicyOptions::default(), distribute] {
            let p = two_node_policy(options, Placement::Kubelet);
            // Node 1 is held by another pod: the hint finds nothing there.
            let mut previous = Assignments::new();
            previous
                .insert(
                    named("b", "other"),
                    ExclusiveAssignment {
                        cpus: CpuSet::range(4, 7),
                        container_id: None,
                        adopted: None,
                        wanted: None,
                    },
                )
                .unwrap();
            let other = demand(named("b", "other"), Entitlement::Exclusive(4), Some("4-7"));
            let plain = vec![
                other.clone(),
                demand(named("a", "app"), Entitlement::Exclusive(2), Some("0-3")),
            ];
            let (expected, _) = assign(&p, &all, &plain, &pods(&["a", "b"]), &previous);
            for nodes in ["1", "5"] {
                let d = vec![other.clone(), with_devices_on(named("a", "app"), 2, nodes)];
                let (a, events) = assign(&p, &all, &d, &pods(&["a", "b"]), &previous);
                assert_eq!(
                    held(&a, &named("a", "app")),
                    held(&expected, &named("a", "app")),
                    "{options:?} devices on {nodes}: {events:?}"
                );
                let cpus = &a.get(&named("a", "app")).unwrap().cpus;
                assert!(
                    cpus.len() == 2 && cpus.is_subset(&CpuSet::range(1, 3)),
                    "{cpus}"
                );
            }
        }
    }

    #[test]
    fn devices_never_split_a_core_under_full_pcpus_only() {
        // 2 nodes of 2 HT cores: core n = cpus 2n, 2n+1; node 0 = 0-3, node 1 = 4-7. With cpus
        // 0 and 5 reserved and 6-7 held, node 1 has one lone thread (4) left.
        let cpus = (0..8)
            .map(|id| CpuInfo {
                id,
                socket: id / 4,
                die: 0,
                numa: id / 4,
                core: id / 2,
                uncore: id / 4,
                cluster: None,
            })
            .collect();
        let topo = Topology::new(cpus, CpuSet::new(), CpuSet::new(), CpuSet::range(0, 1)).unwrap();
        let options = PolicyOptions {
            full_pcpus_only: true,
            ..PolicyOptions::default()
        };
        let p = StaticPolicy::new(
            &topo,
            options,
            ReservedCpus::List(CpuSet::parse("0,5").unwrap()),
            false,
        )
        .unwrap();
        let mut previous = Assignments::new();
        previous
            .insert(
                named("b", "other"),
                ExclusiveAssignment {
                    cpus: CpuSet::range(6, 7),
                    container_id: None,
                    adopted: None,
                    wanted: None,
                },
            )
            .unwrap();
        let d = vec![
            demand(named("b", "other"), Entitlement::Exclusive(2), Some("6-7")),
            with_devices_on(named("a", "app"), 2, "1"),
        ];
        let (a, events) = assign(&p, &CpuSet::range(0, 7), &d, &pods(&["a", "b"]), &previous);
        assert_eq!(held(&a, &named("a", "app")), "2-3", "{events:?}");
    }

    #[test]
    fn devices_do_not_move_what_a_container_holds() {
        let p = two_node_policy(PolicyOptions::default(), Placement::Kubelet);
        let all = CpuSet::range(0, 7);
        let mut previous = Assignments::new();
        previous
            .insert(
                named("a", "app"),
                ExclusiveAssignment {
                    cpus: CpuSet::parse("1-2").unwrap(),
                    container_id: None,
                    adopted: None,
                    wanted: None,
                },
            )
            .unwrap();
        let d = vec![with_devices_on(named("a", "app"), 2, "1")];
        let (a, events) = assign(&p, &all, &d, &pods(&["a"]), &previous);
        assert_eq!(held(&a, &named("a", "app")), "1-2");
        assert!(events.is_empty(), "{events:?}");
    }

    #[test]
    fn allocates_like_kubelet_and_keeps_on_the_next_pass() {
        let (p, all) = policy("0");
        let d = vec![demand(
            named("a", "app"),
            Entitlement::Exclusive(2),
            Some("0-7"),
        )];
        let (a, ev) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert_eq!(held(&a, &named("a", "app")), "1,5");
        assert!(matches!(ev[0], AssignEvent::Allocated { .. }));
        let (again, ev) = assign(&p, &all, &d, &pods(&["a"]), &a);
        assert_eq!(again, a);
        assert!(ev.is_empty());
    }

    /// Issue 23, item 1: with new cpus withheld (a scan stopped at its limit) nothing is
    /// allocated, but what the tree shows is still adopted and what is held still kept.
    #[test]
    fn withheld_new_cpus_allocate_nothing_and_still_adopt_and_keep() {
        let (p, all) = policy("0");
        let d = vec![
            demand(named("a", "app"), Entitlement::Exclusive(2), Some("0-7")),
            demand(named("b", "app"), Entitlement::Exclusive(2), Some("2,6")),
        ];
        let (a, ev) = assign_with(
            &p,
            &all,
            &d,
            &pods(&["a", "b"]),
            &Assignments::new(),
            (&CpuSet::new(), NewCpus::Withheld),
        );
        assert!(a.get(&named("a", "app")).is_none());
        assert_eq!(held(&a, &named("b", "app")), "2,6");
        assert!(ev.iter().any(|e| matches!(
            e,
            AssignEvent::Failed {
                error: AllocationError::ScanIncomplete,
                ..
            }
        )));
        let (again, ev) = assign_with(
            &p,
            &all,
            &d[1..],
            &pods(&["a", "b"]),
            &a,
            (&CpuSet::new(), NewCpus::Withheld),
        );
        assert_eq!(again, a);
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn the_live_tree_wins() {
        let (p, all) = policy("0");
        // The container already sits on 3,7 (a previous agent put it there).
        let d = vec![demand(
            named("a", "app"),
            Entitlement::Exclusive(2),
            Some("3,7"),
        )];
        let (a, ev) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert_eq!(held(&a, &named("a", "app")), "3,7");
        assert!(matches!(ev[0], AssignEvent::Adopted { .. }));
        // Not adoptable: reserved CPU, wrong size, or the whole pool.
        for current in ["0,4", "3", "0-7"] {
            let d = vec![demand(
                named("a", "app"),
                Entitlement::Exclusive(2),
                Some(current),
            )];
            let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
            assert_eq!(held(&a, &named("a", "app")), "1,5", "{current}");
        }
        // Nor the shared pool as it stands: b holds 1-3,5-7, the shared pool is 0,4.
        let mut taken = Assignments::new();
        taken
            .insert(
                named("b", "big"),
                ExclusiveAssignment {
                    cpus: CpuSet::parse("1-3,5-7").unwrap(),
                    container_id: None,
                    adopted: None,
                    wanted: None,
                },
            )
            .unwrap();
        let d = vec![demand(
            named("a", "app"),
            Entitlement::Exclusive(2),
            Some("0,4"),
        )];
        let (a, _) = assign(&p, &all, &d, &pods(&["a", "b"]), &taken);
        assert_eq!(held(&a, &named("a", "app")), "");
    }

    #[test]
    fn an_undecidable_request_adopts_a_live_set_of_plausible_size() {
        let (p, all) = policy("0");
        let unknown = |range| Entitlement::Unknown {
            request_range: Some(range),
        };
        // cpu.weight says 1900m..2100m and the container sits on two CPUs: adopted.
        let d = vec![demand(
            named("a", "app"),
            unknown((1900, 2100)),
            Some("3,7"),
        )];
        let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert_eq!(held(&a, &named("a", "app")), "3,7");
        // Three CPUs do not fit that range; nothing is allocated for an unknown request.
        let d = vec![demand(
            named("a", "app"),
            unknown((1900, 2100)),
            Some("2-3,7"),
        )];
        let (a, ev) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert!(a.is_empty() && ev.is_empty());
    }

    #[test]
    fn two_containers_claiming_one_set_do_not_share_it() {
        let (p, all) = policy("0");
        let d = vec![
            demand(named("a", "x"), Entitlement::Exclusive(2), Some("3,7")),
            demand(named("b", "y"), Entitlement::Exclusive(2), Some("3,7")),
        ];
        let (a, _) = assign(&p, &all, &d, &pods(&["a", "b"]), &Assignments::new());
        assert_eq!(held(&a, &named("a", "x")), "3,7");
        assert_eq!(held(&a, &named("b", "y")), "1,5");
    }

    #[test]
    fn restart_keeps_cpus_and_pod_deletion_releases_them() {
        let (p, all) = policy("0");
        let d = vec![demand(named("a", "app"), Entitlement::Exclusive(2), None)];
        let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        // The container is gone (restarting); the pod lives: kept, and a newcomer of another
        // pod does not get those CPUs.
        let other = vec![demand(named("b", "x"), Entitlement::Exclusive(2), None)];
        let (a2, _) = assign(&p, &all, &other, &pods(&["a", "b"]), &a);
        assert_eq!(held(&a2, &named("a", "app")), "1,5");
        assert_eq!(held(&a2, &named("b", "x")), "2,6");
        // Back under the same name: same CPUs.
        let (a3, _) = assign(&p, &all, &d, &pods(&["a", "b"]), &a2);
        assert_eq!(held(&a3, &named("a", "app")), "1,5");
        // Pod a deleted.
        let (a4, ev) = assign(&p, &all, &other, &pods(&["b"]), &a3);
        assert_eq!(held(&a4, &named("a", "app")), "");
        assert!(ev.iter().any(|e| matches!(
            e,
            AssignEvent::Released {
                why: ReleaseReason::PodGone,
                ..
            }
        )));
    }

    #[test]
    fn init_container_cpus_are_reused_by_the_app_container() {
        // kubelet's TestStaticPolicyReuseCPUs: init takes 4, then app takes 2 out of them.
        let (p, all) = policy("");
        let init = vec![demand(named("a", "init"), Entitlement::Exclusive(4), None)];
        let (a, _) = assign(&p, &all, &init, &pods(&["a"]), &Assignments::new());
        assert_eq!(held(&a, &named("a", "init")), "0-1,4-5");
        let app = vec![demand(named("a", "app"), Entitlement::Exclusive(2), None)];
        let (a2, ev) = assign(&p, &all, &app, &pods(&["a"]), &a);
        assert_eq!(held(&a2, &named("a", "app")), "0,4");
        assert_eq!(held(&a2, &named("a", "init")), "");
        assert!(ev.iter().any(|e| matches!(
            e,
            AssignEvent::Released {
                why: ReleaseReason::Reused,
                ..
            }
        )));
    }

    #[test]
    fn unnamed_restart_takes_over_the_idle_set() {
        let (p, all) = policy("0");
        let key1 = AssignmentKey::Id {
            pod_uid: "a".into(),
            container_id: "111".into(),
        };
        let key2 = AssignmentKey::Id {
            pod_uid: "a".into(),
            container_id: "222".into(),
        };
        let (a, _) = assign(
            &p,
            &all,
            &[demand(key1.clone(), Entitlement::Exclusive(1), None)],
            &pods(&["a"]),
            &Assignments::new(),
        );
        let first = held(&a, &key1);
        let (a2, ev) = assign(
            &p,
            &all,
            &[demand(key2.clone(), Entitlement::Exclusive(1), None)],
            &pods(&["a"]),
            &a,
        );
        assert_eq!(held(&a2, &key2), first);
        assert!(matches!(ev[0], AssignEvent::Reused { .. }));
    }

    /// Issue 17, item 27: `align-by-socket` takes effect in `run`/`plan`: the planner asks for
    /// the hint a best-effort Topology Manager would give, so the cpus come from one NUMA node
    /// of one socket where kubelet's hint-less packing splits them over two nodes.
    #[test]
    fn align_by_socket_reaches_the_allocator() {
        use crate::topology::RegularShape;
        // 2 sockets × 2 NUMA nodes × 10 cores × 2 threads: core c = cpus c and c+40; NUMA n
        // holds cores 10n..10n+9.
        let topo = Topology::regular(RegularShape {
            sockets: 2,
            numa_nodes_per_socket: 2,
            uncore_caches_per_numa_node: 1,
            cores_per_uncore_cache: 10,
            threads_per_core: 2,
        })
        .unwrap();
        let make = |options: &str| {
            StaticPolicy::new(
                &topo,
                PolicyOptions::parse(options).unwrap(),
                ReservedCpus::List(CpuSet::parse("0,40").unwrap()),
                false,
            )
            .unwrap()
        };
        // NUMA 0 has 4 free cpus, NUMA 1 six, NUMA 2 and 3 are free.
        let pool = CpuSet::parse("0,40,8-9,48-49,14-16,54-56,20-39,60-79").unwrap();
        let key = named("a", "app");
        let wants = [demand(key.clone(), Entitlement::Exclusive(8), None)];
        let numa_of =
            |cpus: &CpuSet| -> BTreeSet<u32> { cpus.iter().map(|c| (c % 40) / 10).collect() };
        let (plain, _) = assign(&make(""), &pool, &wants, &pods(&["a"]), &Assignments::new());
        let plain = CpuSet::parse(&held(&plain, &key)).unwrap();
        assert_eq!(numa_of(&plain).len(), 2, "{plain}");
        let (aligned, _) = assign(
            &make("align-by-socket=true"),
            &pool,
            &wants,
            &pods(&["a"]),
            &Assignments::new(),
        );
        let aligned = CpuSet::parse(&held(&aligned, &key)).unwrap();
        assert_eq!(aligned.len(), 8);
        assert_eq!(numa_of(&aligned).len(), 1, "{aligned}");
    }

    /// Issue 17, item 18: an in-place shrink keeps cpus the container has (here the last 4,
    /// made its own by an earlier allocation elsewhere), never moving it.
    #[test]
    fn an_in_place_shrink_keeps_a_subset_of_the_cpus_held() {
        let (p, all) = policy("0");
        let key = named("a", "app");
        let mut held_before = Assignments::new();
        held_before
            .insert(
                key.clone(),
                ExclusiveAssignment {
                    cpus: CpuSet::parse("3,7,2,6").unwrap(),
                    container_id: None,
                    adopted: None,
                    wanted: None,
                },
            )
            .unwrap();
        let (shrunk, ev) = assign(
            &p,
            &all,
            &[demand(key.clone(), Entitlement::Exclusive(2), None)],
            &pods(&["a"]),
            &held_before,
        );
        let kept = CpuSet::parse(&held(&shrunk, &key)).unwrap();
        assert_eq!(kept.len(), 2);
        assert!(kept.is_subset(&CpuSet::parse("2-3,6-7").unwrap()), "{kept}");
        // Whole cores first: one core's two threads.
        assert!(
            kept == CpuSet::parse("2,6").unwrap() || kept == CpuSet::parse("3,7").unwrap(),
            "{kept}"
        );
        assert!(matches!(ev[0], AssignEvent::Shrunk { .. }), "{ev:?}");
    }

    /// 2 sockets, one NUMA node each, 4 HT cores per node: core c = cpus c and c+8; node 0 =
    /// 0-3,8-11, node 1 = 4-7,12-15 (the agent tests' node); cpu 0 reserved.
    fn two_node_ht_policy(options: &str) -> (StaticPolicy, CpuSet) {
        use crate::topology::RegularShape;
        let topo = Topology::regular(RegularShape {
            sockets: 2,
            numa_nodes_per_socket: 1,
            uncore_caches_per_numa_node: 1,
            cores_per_uncore_cache: 4,
            threads_per_core: 2,
        })
        .unwrap();
        let p = StaticPolicy::new(
            &topo,
            PolicyOptions::parse(options).unwrap(),
            ReservedCpus::List(CpuSet::parse("0").unwrap()),
            false,
        )
        .unwrap();
        (p, CpuSet::range(0, 15))
    }

    /// Issue 23, item 24: an in-place resize keeps the set the container was given first (its
    /// original): growth adds to it, a shrink gives back the cpus added last, so 4 → 6 → 4
    /// returns exactly the original; below the original it keeps whole cores of the original
    /// on its NUMA node (before, the policy's best fit among the cpus held kept the other
    /// node's: `1-2,7,9-10,15 → 7,15`).
    #[test]
    fn an_in_place_resize_gives_back_what_it_added_and_keeps_the_originals_node() {
        for options in ["", "full-pcpus-only=true"] {
            let (p, all) = two_node_ht_policy(options);
            let (a, b) = (named("a", "app"), named("b", "fill"));
            let live = pods(&["a", "b"]);
            let want = |n: usize| {
                vec![
                    demand(a.clone(), Entitlement::Exclusive(n), None),
                    demand(b.clone(), Entitlement::Exclusive(2), None),
                ]
            };
            // a gets two whole cores of node 0, b the third: node 0 keeps only cpu 8 free.
            let (first, _) = assign(&p, &all, &want(4), &live, &Assignments::new());
            assert_eq!(held(&first, &a), "1-2,9-10", "{options}");
            assert_eq!(held(&first, &b), "3,11", "{options}");
            // 4 → 6: it keeps its four and gets two more near them: node 0's last free cpu and
            // one of node 1 (kubelet's hint rule), or under full-pcpus-only a whole core of
            // node 1.
            let (grown, ev) = assign(&p, &all, &want(6), &live, &first);
            let expected = if options.is_empty() {
                "1-2,4,8-10"
            } else {
                "1-2,4,9-10,12"
            };
            assert_eq!(held(&grown, &a), expected, "{options}: {ev:?}");
            // 6 → 4: exactly the original again.
            let (back, ev) = assign(&p, &all, &want(4), &live, &grown);
            assert_eq!(held(&back, &a), "1-2,9-10", "{options}: {ev:?}");
            assert!(
                matches!(&ev[..], [AssignEvent::Shrunk { cpus, .. }] if cpus.to_string() == "1-2,9-10"),
                "{ev:?}"
            );
            assert_eq!(grown.original(&a).unwrap().to_string(), "1-2,9-10");
            assert!(back.grown(&a).is_empty());
            // 6 → 2: below the original, a whole core of it on node 0.
            let (small, ev) = assign(&p, &all, &want(2), &live, &grown);
            assert_eq!(held(&small, &a), "1,9", "{options}: {ev:?}");
            // Planned again: nothing moves.
            let (again, ev) = assign(&p, &all, &want(2), &live, &small);
            assert_eq!((again, ev), (small, Vec::new()));
        }
    }

    /// Issue 23, item 24: steps added in turn go back last-first, a partly returned step
    /// keeping a whole core; a short resize's addition (nothing free) keeps what it has.
    #[test]
    fn resizes_give_back_the_last_added_cpus_first() {
        let (p, all) = two_node_ht_policy("");
        let a = named("a", "app");
        let live = pods(&["a"]);
        let want = |n: usize| vec![demand(a.clone(), Entitlement::Exclusive(n), None)];
        let (two, _) = assign(&p, &all, &want(2), &live, &Assignments::new());
        assert_eq!(held(&two, &a), "1,9");
        let (four, _) = assign(&p, &all, &want(4), &live, &two);
        let (eight, _) = assign(&p, &all, &want(8), &live, &four);
        let added_first = four.grown(&a).to_vec();
        assert_eq!(added_first.len(), 1, "{four:?}");
        assert_eq!(eight.grown(&a).len(), 2, "{eight:?}");
        assert_eq!(eight.grown(&a)[0], added_first[0]);
        let step1 = CpuSet::parse("1,9").unwrap().union(&added_first[0]);
        // 8 → 5: the last step (4 cpus) goes but one thread.
        let (five, _) = assign(&p, &all, &want(5), &live, &eight);
        let kept = CpuSet::parse(&held(&five, &a)).unwrap();
        assert!(kept.len() == 5 && step1.is_subset(&kept), "{kept}");
        assert_eq!(five.grown(&a).len(), 2, "{five:?}");
        // 8 → 3: the last step goes, and one thread of the first one.
        let (three, _) = assign(&p, &all, &want(3), &live, &eight);
        let kept = CpuSet::parse(&held(&three, &a)).unwrap();
        assert!(kept.len() == 3 && kept.is_subset(&step1), "{kept}");
        assert!(CpuSet::parse("1,9").unwrap().is_subset(&kept), "{kept}");
        // 5 → 2: the original.
        let (back, _) = assign(&p, &all, &want(2), &live, &five);
        assert_eq!(held(&back, &a), "1,9");
    }

    /// Issue 23, item 26: kubelet admits a pod as a whole. Under `full-pcpus-only` a pod with
    /// an even and an odd container is rejected (SMTAlignmentError): neither is pinned, one
    /// pinned before the odd one appeared is released, and the rejection stands while the pod
    /// lives (the odd container may be an init container that is gone); other pods are not
    /// touched.
    #[test]
    fn a_pod_kubelet_would_reject_gets_no_exclusive_cpus() {
        let (p, all) = two_node_ht_policy("full-pcpus-only=true");
        let (even, odd, other) = (named("m", "even"), named("m", "odd"), named("o", "app"));
        let live = pods(&["m", "o"]);
        let mut d = vec![
            demand(even.clone(), Entitlement::Exclusive(2), None),
            demand(other.clone(), Entitlement::Exclusive(2), None),
        ];
        let (first, _) = assign(&p, &all, &d, &live, &Assignments::new());
        assert_eq!(
            (held(&first, &even), held(&first, &other)),
            ("1,9".into(), "2,10".into())
        );
        d.insert(1, demand(odd.clone(), Entitlement::Exclusive(1), None));
        let (rejected, ev) = assign(&p, &all, &d, &live, &first);
        assert_eq!(held(&rejected, &even), "");
        assert_eq!(held(&rejected, &odd), "");
        assert_eq!(held(&rejected, &other), "2,10");
        let r = rejected.rejection("m").unwrap();
        assert_eq!(r.reason.to_string(), "SMTAlignmentError");
        assert_eq!(
            (r.container.as_str(), r.message.as_str(), r.permanent),
            (
                "odd",
                "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2",
                true
            )
        );
        assert!(
            matches!(&ev[..], [
            AssignEvent::Failed { key, .. },
            AssignEvent::Released { why: ReleaseReason::PodRejected, .. },
            AssignEvent::PodRejected { .. },
        ] if *key == odd),
            "{ev:?}"
        );
        // The odd container goes: the pod stays rejected.
        d.remove(1);
        let (still, ev) = assign(&p, &all, &d, &live, &rejected);
        assert_eq!(held(&still, &even), "");
        assert!(still.rejection("m").is_some());
        assert!(
            matches!(&ev[..], [AssignEvent::PodRejected { key, .. }] if *key == even),
            "{ev:?}"
        );
        // The pod goes: so does its rejection.
        let (gone, _) = assign(&p, &all, &d[1..], &pods(&["o"]), &still);
        assert!(gone.rejection("m").is_none());
    }

    /// Issue 23, item 26: a pod whose second container finds too few cpus is rejected as a
    /// whole (kubelet's UnexpectedAdmissionError): what the first was given is undone. It is
    /// admitted again, all at once, when it fits.
    #[test]
    fn a_pod_that_does_not_fit_is_admitted_whole_or_not_at_all() {
        let (p, all) = policy("0");
        let (a, b, c) = (named("m", "a"), named("m", "b"), named("x", "c"));
        let live = pods(&["m", "x"]);
        let big = vec![
            demand(c.clone(), Entitlement::Exclusive(2), None),
            demand(a.clone(), Entitlement::Exclusive(3), None),
            demand(b.clone(), Entitlement::Exclusive(3), None),
        ];
        let (none, ev) = assign(&p, &all, &big, &live, &Assignments::new());
        assert_eq!(held(&none, &c), "1,5");
        assert_eq!(
            (held(&none, &a), held(&none, &b)),
            (String::new(), String::new())
        );
        let r = none.rejection("m").unwrap();
        assert_eq!(
            (r.reason.to_string(), r.message.as_str(), r.permanent),
            (
                "UnexpectedAdmissionError".to_string(),
                "Allocate failed due to not enough cpus available to satisfy request: \
                 requested=3, available=2, which is unexpected",
                false
            )
        );
        assert!(
            !ev.iter()
                .any(|e| matches!(e, AssignEvent::Allocated { key, .. } if *key == a)),
            "{ev:?}"
        );
        // Planned again: the same.
        let (again, _) = assign(&p, &all, &big, &live, &none);
        assert_eq!(again, none);
        // c goes: the pod fits and is admitted whole.
        let (fits, _) = assign(&p, &all, &big[1..], &pods(&["m"]), &again);
        assert!(fits.rejection("m").is_none());
        for key in [&a, &b] {
            assert_eq!(fits.get(key).map(|x| x.cpus.len()), Some(3), "{fits:?}");
        }
    }

    /// Issue 23, item 24: a growth that cannot be given yet keeps what the container holds
    /// (it is never moved or dropped for it) and asks again every pass; once cpus are free it
    /// grows in place.
    #[test]
    fn a_growth_with_nothing_free_keeps_what_it_holds_until_it_can_grow() {
        let (p, all) = policy("0");
        let (a, b) = (named("a", "app"), named("b", "big"));
        let start = vec![
            demand(a.clone(), Entitlement::Exclusive(2), None),
            demand(b.clone(), Entitlement::Exclusive(4), None),
        ];
        let (first, _) = assign(&p, &all, &start, &pods(&["a", "b"]), &Assignments::new());
        assert_eq!(held(&first, &a), "1,5");
        let grow = vec![
            demand(a.clone(), Entitlement::Exclusive(4), None),
            start[1].clone(),
        ];
        let (waiting, ev) = assign(&p, &all, &grow, &pods(&["a", "b"]), &first);
        assert_eq!(held(&waiting, &a), "1,5");
        assert_eq!(waiting.get(&a).unwrap().wanted, Some(4));
        assert!(matches!(&ev[..], [AssignEvent::Short { .. }]), "{ev:?}");
        // b goes: a grows in place.
        let (grown, ev) = assign(&p, &all, &grow[..1], &pods(&["a"]), &waiting);
        let cpus = CpuSet::parse(&held(&grown, &a)).unwrap();
        assert!(
            cpus.len() == 4 && CpuSet::parse("1,5").unwrap().is_subset(&cpus),
            "{cpus}"
        );
        assert_eq!(grown.original(&a).unwrap().to_string(), "1,5");
        assert!(
            ev.iter()
                .any(|e| matches!(e, AssignEvent::Replaced { .. } | AssignEvent::Grown { .. })),
            "{ev:?}"
        );
    }

    #[test]
    fn resize_and_opt_out_release_and_unknown_keeps() {
        let (p, all) = policy("0");
        let key = named("a", "app");
        let (a, _) = assign(
            &p,
            &all,
            &[demand(key.clone(), Entitlement::Exclusive(2), None)],
            &pods(&["a"]),
            &Assignments::new(),
        );
        let (kept, _) = assign(
            &p,
            &all,
            &[demand(
                key.clone(),
                Entitlement::Unknown {
                    request_range: None,
                },
                None,
            )],
            &pods(&["a"]),
            &a,
        );
        assert_eq!(held(&kept, &key), "1,5");
        let (grown, _) = assign(
            &p,
            &all,
            &[demand(key.clone(), Entitlement::Exclusive(4), None)],
            &pods(&["a"]),
            &a,
        );
        assert_eq!(held(&grown, &key), "1-2,5-6");
        let (shared, ev) = assign(
            &p,
            &all,
            &[demand(key.clone(), Entitlement::Shared, None)],
            &pods(&["a"]),
            &a,
        );
        assert_eq!(held(&shared, &key), "");
        assert!(matches!(
            ev[0],
            AssignEvent::Released {
                why: ReleaseReason::NowShared,
                ..
            }
        ));
    }

    #[test]
    fn failures_leave_the_container_shared_with_kubelets_text() {
        let (p, all) = policy("0");
        let d = vec![demand(named("a", "big"), Entitlement::Exclusive(8), None)];
        let (a, ev) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert!(a.is_empty());
        let AssignEvent::Failed { error, .. } = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(
            error.to_string(),
            "not enough cpus available to satisfy request: requested=8, available=7"
        );
    }

    /// CPU hotplug: the cpus pods may use lose 5 (offline). The container on 1,5 keeps 1 and
    /// gets one replacement near it; with nothing free it keeps 1, says why, and gets its
    /// second cpu once one is free again.
    #[test]
    fn a_container_that_lost_a_cpu_gets_a_replacement_or_keeps_the_rest() {
        let (p, all) = policy("0");
        let key = named("a", "app");
        let d = vec![demand(key.clone(), Entitlement::Exclusive(2), None)];
        let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert_eq!(held(&a, &key), "1,5");

        let without_5 = CpuSet::parse("0-4,6-7").unwrap();
        let (replaced, ev) = assign(&p, &without_5, &d, &pods(&["a"]), &a);
        let now = CpuSet::parse(&held(&replaced, &key)).unwrap();
        assert_eq!(now.len(), 2);
        assert!(now.contains(1) && !now.contains(5), "{now}");
        assert!(replaced.get(&key).unwrap().wanted.is_none());
        let AssignEvent::Replaced {
            lost, added, cpus, ..
        } = &ev[0]
        else {
            panic!("{ev:?}")
        };
        assert_eq!((lost.to_string(), cpus), ("5".to_string(), &now));
        assert_eq!(added.len(), 1);
        // Planned again: kept as it is.
        let (again, ev) = assign(&p, &without_5, &d, &pods(&["a"]), &replaced);
        assert_eq!(again, replaced);
        assert!(ev.is_empty(), "{ev:?}");

        // Nothing free: cpus 2-4,6-7 are b's, 0 is reserved.
        let mut full = a.clone();
        full.insert(
            named("b", "big"),
            ExclusiveAssignment {
                cpus: CpuSet::parse("2-4,6-7").unwrap(),
                container_id: None,
                adopted: None,
                wanted: None,
            },
        )
        .unwrap();
        let both = vec![
            d[0].clone(),
            demand(named("b", "big"), Entitlement::Exclusive(5), None),
        ];
        let (short, ev) = assign(&p, &without_5, &both, &pods(&["a", "b"]), &full);
        assert_eq!(held(&short, &key), "1");
        assert_eq!(short.get(&key).unwrap().wanted, Some(2));
        let AssignEvent::Short {
            lost,
            wanted,
            error,
            ..
        } = &ev[0]
        else {
            panic!("{ev:?}")
        };
        assert_eq!((lost.to_string(), *wanted), ("5".to_string(), 2));
        assert_eq!(
            error.to_string(),
            "not enough cpus available to satisfy request: requested=1, available=0"
        );
        // Still nothing: it keeps its one cpu, asks again.
        let (still, ev) = assign(&p, &without_5, &both, &pods(&["a", "b"]), &short);
        assert_eq!(still, short);
        assert!(matches!(&ev[0], AssignEvent::Short { lost, .. } if lost.is_empty()));
        // Cpu 5 comes back: it is its replacement.
        let (whole, ev) = assign(&p, &all, &both, &pods(&["a", "b"]), &still);
        assert_eq!(held(&whole, &key), "1,5");
        assert!(whole.get(&key).unwrap().wanted.is_none());
        assert!(
            matches!(&ev[0], AssignEvent::Replaced { added, .. } if added.to_string() == "5"),
            "{ev:?}"
        );
    }

    /// A container whose request cannot be told any more (v2 after the quota lift) still gets
    /// the count it held back; one that lost every cpu is allocated afresh.
    #[test]
    fn replacements_for_an_unknown_request_and_for_a_container_that_lost_all() {
        let (p, all) = policy("0");
        let key = named("a", "app");
        let one = named("a", "one");
        let d = vec![
            demand(key.clone(), Entitlement::Exclusive(2), None),
            demand(one.clone(), Entitlement::Exclusive(1), None),
        ];
        let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert_eq!((held(&a, &key), held(&a, &one)), ("1,5".into(), "4".into()));
        let unknown = vec![
            demand(
                key.clone(),
                Entitlement::Unknown {
                    request_range: None,
                },
                None,
            ),
            d[1].clone(),
        ];
        // 5 and 4 go offline.
        let pool = CpuSet::parse("0-3,6-7").unwrap();
        let (b, ev) = assign(&p, &pool, &unknown, &pods(&["a"]), &a);
        let kept = CpuSet::parse(&held(&b, &key)).unwrap();
        assert!(
            kept.len() == 2 && kept.contains(1) && kept.is_subset(&pool),
            "{kept}"
        );
        assert!(ev.iter().any(|e| matches!(
            e,
            AssignEvent::Released {
                why: ReleaseReason::OutOfReach,
                ..
            }
        )));
        let fresh = CpuSet::parse(&held(&b, &one)).unwrap();
        assert!(fresh.len() == 1 && fresh.is_subset(&pool) && fresh.is_disjoint(&kept));
    }

    /// Reserved cpus offline: the shared pool would be empty, so the smallest assignment gives
    /// its cpus back and stays shared with the allocator's reason.
    #[test]
    fn the_shared_pool_is_never_emptied_by_reserved_cpus_going_offline() {
        let (p, all) = policy("0");
        let big = named("a", "big");
        let small = named("b", "small");
        let d = vec![
            demand(big.clone(), Entitlement::Exclusive(6), None),
            demand(small.clone(), Entitlement::Exclusive(1), None),
        ];
        let (a, _) = assign(&p, &all, &d, &pods(&["a", "b"]), &Assignments::new());
        assert_eq!(a.exclusive_cpus().len(), 7);
        // Cpu 0 (reserved, the last shared cpu) goes offline.
        let online = CpuSet::parse("1-7").unwrap();
        let (b, ev) = assign(&p, &online, &d, &pods(&["a", "b"]), &a);
        assert_eq!(held(&b, &small), "");
        assert_eq!(b.exclusive_cpus().len(), 6);
        assert!(ev.iter().any(|e| matches!(
            e,
            AssignEvent::Released {
                why: ReleaseReason::SharedPoolEmpty,
                ..
            }
        )));
        assert!(
            ev.iter()
                .any(|e| matches!(e, AssignEvent::Failed { error, .. }
                if matches!(error, AllocationError::WouldEmptySharedPool { .. }))),
            "{ev:?}"
        );
    }

    /// `full-pcpus-only`: a single replacement cpu is not a whole core, so the container gets
    /// a whole free core afresh.
    #[test]
    fn full_pcpus_only_replaces_a_broken_core_with_a_whole_one() {
        let p = StaticPolicy::new(
            &one_socket_four_cores(),
            PolicyOptions::parse("full-pcpus-only=true").unwrap(),
            ReservedCpus::List(CpuSet::parse("0,4").unwrap()),
            false,
        )
        .unwrap();
        let key = named("a", "app");
        let d = vec![demand(key.clone(), Entitlement::Exclusive(2), None)];
        let all = CpuSet::range(0, 7);
        let (a, _) = assign(&p, &all, &d, &pods(&["a"]), &Assignments::new());
        assert_eq!(held(&a, &key), "1,5");
        let without_5 = CpuSet::parse("0-4,6-7").unwrap();
        let (b, ev) = assign(&p, &without_5, &d, &pods(&["a"]), &a);
        assert_eq!(held(&b, &key), "2,6");
        assert!(matches!(&ev[0], AssignEvent::Replaced { .. }), "{ev:?}");
    }

    /// Issue 28, item 3: each pod's cpus come from its pool (the isolated cpus for pods asking
    /// for them, the others for the rest), what the live tree or a checkpoint shows is kept only
    /// within it, a full pool rejects the pod without touching the other cpus, and a release
    /// serves the next asking pod.
    #[test]
    fn each_pod_holds_cpus_of_its_own_pool_only() {
        let set = |t: &str| CpuSet::parse(t).unwrap();
        let topo = Topology::new(
            one_socket_four_cores().cpus().to_vec(),
            CpuSet::new(),
            set("2-3,6-7"),
            CpuSet::range(0, 0),
        )
        .unwrap();
        let options = PolicyOptions::default();
        let p = StaticPolicy::new(&topo, options, ReservedCpus::List(set("0")), true).unwrap();
        let general = set("0-1,4-5");
        let isolated = p.isolated_pool().clone();
        assert_eq!(isolated, set("2-3,6-7"));
        let iso = |pod: &str, n: usize, current: Option<&str>| ContainerDemand {
            pool: CpuPool::Isolated,
            ..demand(named(pod, "app"), Entitlement::Exclusive(n), current)
        };
        let run = |d: &[ContainerDemand], live: &[&str], previous: &Assignments| {
            assign_with(
                &p,
                &general,
                d,
                &pods(live),
                previous,
                (&isolated, NewCpus::Given),
            )
        };
        // A restart without a checkpoint: the asking container on isolated cpus is adopted;
        // one that does not ask is not, nor is an asking one on the other cpus: both are
        // allocated from their own pool.
        let b = demand(named("b", "app"), Entitlement::Exclusive(1), Some("2"));
        let d = vec![
            iso("a", 2, Some("3,7")),
            b.clone(),
            iso("c", 2, Some("1,5")),
        ];
        let (a, _) = run(&d, &["a", "b", "c"], &Assignments::new());
        assert_eq!(held(&a, &named("a", "app")), "3,7");
        assert_eq!(held(&a, &named("c", "app")), "2,6");
        let b_cpus = set(&held(&a, &named("b", "app")));
        assert!(
            b_cpus.len() == 1 && b_cpus.is_subset(&set("1,4-5")),
            "{b_cpus}"
        );

        // A checkpoint giving a pod cpus of the other pool: moved into its own.
        let mut wrong = Assignments::new();
        let on_isolated = ExclusiveAssignment {
            cpus: set("2"),
            container_id: None,
            adopted: None,
            wanted: None,
        };
        wrong.insert(named("b", "app"), on_isolated).unwrap();
        let (moved, _) = run(std::slice::from_ref(&b), &["b"], &wrong);
        assert!(set(&held(&moved, &named("b", "app"))).is_subset(&set("1,4-5")));

        // The pool is full: e is rejected, the other cpus stay free.
        let mut d = d;
        d.push(iso("e", 2, None));
        let (full, ev) = run(&d, &["a", "b", "c", "e"], &a);
        assert_eq!(held(&full, &named("e", "app")), "");
        let rejection = full.rejection("e").expect("rejected");
        assert_eq!(
            rejection.reason,
            crate::state::AdmissionReason::IsolatedCpus
        );
        assert!(ev.iter().any(|e| matches!(
            e,
            AssignEvent::Failed {
                error: AllocationError::IsolatedPoolTooSmall { requested: 2, .. },
                ..
            }
        )));
        assert_eq!(full.exclusive_cpus().union(&b_cpus), full.exclusive_cpus());
        assert_eq!(full.exclusive_cpus().len(), 5);
        // a goes: its cpus serve e, and e's rejection is gone.
        let (after, _) = run(&d[1..], &["b", "c", "e"], &full);
        assert_eq!(held(&after, &named("e", "app")), "3,7");
        assert!(after.rejection("e").is_none());
    }
}
