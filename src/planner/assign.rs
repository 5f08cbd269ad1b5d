//! Who holds which exclusive CPUs after this pass: keep, adopt, reuse, allocate, release.
//!
//! Input: the containers found in the tree with what they are entitled to, the pods that still
//! exist, and the assignments so far (from memory or the checkpoint). Rules, in order:
//!
//! 1. Assignments of pods that no longer exist are released.
//! 2. A container that keeps its entitlement keeps its CPUs (matched by key: (pod UID, name), or
//!    (pod UID, id)); one whose entitlement changed size or went to shared is released and
//!    re-planned. One whose entitlement is *unknown* (e.g. cgroup v2 after the quota was lifted)
//!    keeps what it has.
//! 3. **The live tree wins**: a container without an assignment whose current `cpuset.cpus` has
//!    exactly its entitlement, lies within the allocatable CPUs and overlaps no other assignment
//!    is adopted as it is (so planning twice writes nothing, and a restarted agent keeps pins).
//! 4. Assignments of containers that are gone while their pod lives are *idle*: a container
//!    restarting under the same key gets them back (rule 2); an unnamed container of the same pod
//!    asking for exactly that many CPUs takes one over (a restart seen only through a new id);
//!    otherwise their CPUs are offered to the pod's next container (kubelet's init-container
//!    reuse) and released when the pod goes.
//! 5. Everything else is allocated with the static policy from the shared pool, in tree order.
//!
//! Pure: no I/O. The result is overlap-free by construction ([`Assignments::insert`]).

use std::collections::BTreeSet;

use crate::allocator::{AllocationError, StaticPolicy};
use crate::cpuset::CpuSet;
use crate::state::{Adoption, AssignmentKey, Assignments, ExclusiveAssignment};

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
    /// Resized in place to fewer cpus: it keeps these of the ones it held.
    Shrunk {
        key: AssignmentKey,
        from: CpuSet,
        cpus: CpuSet,
    },
    /// The request cannot be met: the container stays in the shared pool.
    Failed {
        key: AssignmentKey,
        requested: usize,
        error: AllocationError,
    },
}

/// Why CPUs went back to the shared pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    PodGone,
    NowShared,
    Resized,
    /// An idle assignment whose CPUs another container of the pod took in part.
    Reused,
}

/// The `n` cpus a container holding `cpus` keeps when it shrinks in place: the policy's pick
/// among them; `None` when it does not shrink or the pick fails.
fn shrunk(policy: &StaticPolicy, cpus: &CpuSet, n: usize) -> Option<CpuSet> {
    if n == 0 || n >= cpus.len() {
        return None;
    }
    policy
        .take_by_topology(cpus, n)
        .ok()
        .filter(|kept| kept.len() == n && kept.is_subset(cpus))
}

/// Runs the rules of the module documentation. `pool_cpus` is every CPU pods may use (the
/// kubepods root), `live_pods` the UIDs of the pods present.
pub fn assign(
    policy: &StaticPolicy,
    pool_cpus: &CpuSet,
    demands: &[ContainerDemand],
    live_pods: &BTreeSet<String>,
    previous: &Assignments,
) -> (Assignments, Vec<AssignEvent>) {
    let mut events = Vec::new();
    let mut assignments = previous.clone();
    let allocatable = policy.allocatable(pool_cpus);

    // 1. Pods gone; assignments that no longer fit the node (CPUs offline, newly reserved).
    assignments.retain(|key, a| {
        if !live_pods.contains(key.pod_uid()) {
            events.push(AssignEvent::Released {
                key: key.clone(),
                cpus: a.cpus.clone(),
                why: ReleaseReason::PodGone,
            });
            return false;
        }
        if !a.cpus.is_subset(&allocatable) {
            events.push(AssignEvent::Released {
                key: key.clone(),
                cpus: a.cpus.clone(),
                why: ReleaseReason::Resized,
            });
            return false;
        }
        true
    });

    // 2. Keep, or release what changed.
    let mut pending: Vec<&ContainerDemand> = Vec::new();
    for demand in demands {
        let held = assignments.get(&demand.key).map(|a| a.cpus.clone());
        match (demand.entitlement, held) {
            (Entitlement::Exclusive(n), Some(cpus)) if cpus.len() == n => {
                refresh_container_id(&mut assignments, demand);
            }
            (Entitlement::Unknown { .. }, Some(_)) => {
                refresh_container_id(&mut assignments, demand)
            }
            // An in-place shrink keeps cpus it has: the policy picks the `n` it would pick
            // from them (whole cores first, the same NUMA node and socket), so the container
            // neither moves nor loses its memory locality. (A pick that fails is released
            // and allocated afresh, below.)
            (Entitlement::Exclusive(n), Some(cpus)) if shrunk(policy, &cpus, n).is_some() => {
                let kept = shrunk(policy, &cpus, n).unwrap_or_default();
                // A subset of its own cpus overlaps no one else's.
                let _ = assignments.remove(&demand.key);
                let _ = assignments.insert(
                    demand.key.clone(),
                    ExclusiveAssignment {
                        cpus: kept.clone(),
                        container_id: demand.container_id.clone(),
                        adopted: None,
                    },
                );
                events.push(AssignEvent::Shrunk {
                    key: demand.key.clone(),
                    from: cpus,
                    cpus: kept,
                });
            }
            (Entitlement::Exclusive(_), Some(cpus)) => {
                assignments.remove(&demand.key);
                events.push(AssignEvent::Released {
                    key: demand.key.clone(),
                    cpus,
                    why: ReleaseReason::Resized,
                });
                pending.push(demand);
            }
            (Entitlement::Shared, Some(cpus)) => {
                assignments.remove(&demand.key);
                events.push(AssignEvent::Released {
                    key: demand.key.clone(),
                    cpus,
                    why: ReleaseReason::NowShared,
                });
            }
            (Entitlement::Exclusive(_) | Entitlement::Unknown { .. }, None) => pending.push(demand),
            (Entitlement::Shared, None) => {}
        }
    }

    // 3. Adopt what the live tree shows.
    let mut to_allocate: Vec<&ContainerDemand> = Vec::new();
    for demand in pending {
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
        let adoptable = demand.current.as_ref().filter(|cur| {
            fits(cur.len())
                && cur.is_subset(&allocatable)
                && *cur != pool_cpus
                && **cur != shared_now
                && !shared_now.is_subset(cur)
                && assignments.holder_of(cur, &demand.key).is_none()
        });
        match adoptable {
            Some(cpus) => {
                let assignment = ExclusiveAssignment {
                    cpus: cpus.clone(),
                    container_id: demand.container_id.clone(),
                    adopted: Some(Adoption::LiveTree),
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

    // 4 and 5. Reuse idle assignments of the pod, else allocate.
    let present: BTreeSet<&AssignmentKey> = demands.iter().map(|d| &d.key).collect();
    for demand in to_allocate {
        let Entitlement::Exclusive(n) = demand.entitlement else {
            continue;
        };
        let idle: Vec<(AssignmentKey, CpuSet)> = assignments
            .iter()
            .filter(|(k, _)| k.pod_uid() == demand.key.pod_uid() && !present.contains(k))
            .map(|(k, a)| (k.clone(), a.cpus.clone()))
            .collect();

        // A restart seen only through a new container id.
        if matches!(demand.key, AssignmentKey::Id { .. }) {
            if let Some((from, cpus)) = idle
                .iter()
                .find(|(k, c)| matches!(k, AssignmentKey::Id { .. }) && c.len() == n)
            {
                assignments.remove(from);
                let assignment = ExclusiveAssignment {
                    cpus: cpus.clone(),
                    container_id: demand.container_id.clone(),
                    adopted: None,
                };
                if assignments.insert(demand.key.clone(), assignment).is_ok() {
                    events.push(AssignEvent::Reused {
                        key: demand.key.clone(),
                        from: from.clone(),
                        cpus: cpus.clone(),
                    });
                    continue;
                }
            }
        }

        let reusable: CpuSet = idle.iter().fold(CpuSet::new(), |mut acc, (_, c)| {
            acc.extend_from(c);
            acc
        });
        let shared_pool = pool_cpus.difference(&assignments.exclusive_cpus());
        // The devices' NUMA nodes are the hint when known (the device plugins' hint, which a
        // Topology Manager merges with the CPU manager's to the devices' nodes; with
        // `align-by-socket` the policy widens it to their sockets). Otherwise: kubelet without
        // a Topology Manager gives no hint, so `align-by-socket` would do nothing: with it,
        // the hint a best-effort Topology Manager would give (see `socket_aligned_hint`) is
        // computed here.
        let hint = if demand.device_numa.is_empty() {
            policy
                .aligns_by_socket()
                .then(|| policy.socket_aligned_hint(n, &shared_pool, &reusable))
                .flatten()
        } else {
            Some(demand.device_numa.clone())
        };
        match policy.allocate(n, &shared_pool, hint.as_ref(), &reusable) {
            Ok(cpus) => {
                for (from, idle_cpus) in &idle {
                    if !idle_cpus.is_disjoint(&cpus) {
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
                };
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
            Err(error) => events.push(AssignEvent::Failed {
                key: demand.key.clone(),
                requested: n,
                error,
            }),
        }
    }
    (assignments, events)
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
        };
        // Same key, same CPUs: cannot overlap anything new.
        let _ = assignments.insert(demand.key.clone(), updated);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{Placement, PolicyOptions, ReservedCpus};
    use crate::topology::{CpuInfo, Topology};

    /// 1 socket, 4 cores, HT: core n = cpus n and n+4.
    fn policy(reserved: &str) -> (StaticPolicy, CpuSet) {
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
        let topo = Topology::new(cpus, CpuSet::new(), CpuSet::new(), CpuSet::range(0, 0)).unwrap();
        let p = StaticPolicy::new(
            &topo,
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
}
