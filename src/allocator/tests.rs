//! The worked examples of the kubelet static policy reference, cpusetd's own rules (isolated
//! CPUs, the never-empty shared pool, hybrid cores), and property tests over random regular
//! topologies.

use proptest::prelude::*;

use super::*;
use crate::cpuset::CpuSet;
use crate::topology::{CoreType, CpuInfo, RegularShape, Topology};

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap()
}

fn cpu(id: u32, core: u32, socket: u32, uncore: u32) -> CpuInfo {
    CpuInfo {
        id,
        socket,
        die: 0,
        numa: socket,
        core,
        uncore,
        cluster: None,
    }
}

fn topology(cpus: Vec<CpuInfo>) -> Topology {
    let nodes = cpus.iter().map(|c| c.numa).collect();
    Topology::new(cpus, CpuSet::new(), CpuSet::new(), nodes).unwrap()
}

/// kubelet's `topoSingleSocketHT`: 4 cores, CPU i on core i % 4.
fn single_socket_ht() -> Topology {
    topology((0..8).map(|i| cpu(i, i % 4, 0, 0)).collect())
}

/// kubelet's `topoDualSocketHT`: 6 cores alternating sockets, CPU i on core i % 6.
fn dual_socket_ht() -> Topology {
    topology((0..12).map(|i| cpu(i, i % 6, i % 6 % 2, 0)).collect())
}

/// kubelet's `topoDualSocketMultiNumaPerSocketHT`: 2 sockets × 2 NUMA nodes × 10 cores × 2.
fn dual_socket_multi_numa_ht() -> Topology {
    Topology::regular(RegularShape {
        sockets: 2,
        numa_nodes_per_socket: 2,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 10,
        threads_per_core: 2,
    })
    .unwrap()
}

fn packed(topo: &Topology, available: &str, count: usize) -> Result<CpuSet, TakeError> {
    let index = TopologyIndex::new(topo);
    take_by_topology_packed(
        &index,
        &set(available),
        count,
        CpuSortingStrategy::Packed,
        false,
    )
}

fn policy(topo: &Topology, options: &str, reserved: ReservedCpus) -> StaticPolicy {
    StaticPolicy::new(
        topo,
        PolicyOptions::parse(options).unwrap(),
        reserved,
        false,
    )
    .unwrap()
}

#[test]
fn packed_takes_sibling_threads_of_one_core() {
    assert_eq!(packed(&single_socket_ht(), "0-7", 2).unwrap(), set("0,4"));
}

#[test]
fn packed_fills_the_half_used_core_first() {
    assert_eq!(packed(&single_socket_ht(), "1,3,5-7", 1).unwrap(), set("6"));
}

#[test]
fn packed_takes_a_whole_socket_then_the_first_core_of_the_other() {
    let topo = dual_socket_ht();
    assert_eq!(packed(&topo, "0-11", 8).unwrap(), set("0,2,4,6,8,10,1,7"));
}

#[test]
fn packed_takes_whole_numa_nodes_and_sockets() {
    let topo = dual_socket_multi_numa_ht();
    assert_eq!(packed(&topo, "0-79", 40).unwrap(), set("0-19,40-59"));
    assert_eq!(packed(&topo, "0-79", 60).unwrap(), set("0-29,40-69"));
}

#[test]
fn zero_and_too_large_requests() {
    let topo = single_socket_ht();
    assert_eq!(packed(&topo, "0-7", 0).unwrap(), CpuSet::new());
    // `available=` counts the argument, even CPUs the topology does not have.
    let err = packed(&topo, "0-2,99", 4).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not enough cpus available to satisfy request: requested=4, available=4"
    );
}

#[test]
fn spread_takes_a_socket_then_spreads_over_cores() {
    let index = TopologyIndex::new(&dual_socket_ht());
    let spread =
        take_by_topology_packed(&index, &set("0-11"), 8, CpuSortingStrategy::Spread, false);
    assert_eq!(spread.unwrap(), set("0,2,4,6,8,10,1,3"));
}

#[test]
fn distributed_balances_numa_nodes_where_packed_fills_one() {
    let index = TopologyIndex::new(&dual_socket_ht());
    let available = set("1-5,7-11");
    let distributed =
        take_by_topology_distributed(&index, &available, 1, 1, CpuSortingStrategy::Packed);
    assert_eq!(distributed.unwrap(), set("1"));
    let packed = take_by_topology_packed(&index, &available, 1, CpuSortingStrategy::Packed, false);
    assert_eq!(packed.unwrap(), set("2"));
    // An odd request in groups of 2 falls back to packed.
    let fallback =
        take_by_topology_distributed(&index, &available, 1, 2, CpuSortingStrategy::Packed);
    assert_eq!(fallback.unwrap(), set("2"));
}

/// `topoUncoreSingleSocketSMT`: 8 cores × 2 threads, cores 0–3 on uncore 0, 4–7 on uncore 1.
fn uncore_single_socket_smt() -> Topology {
    topology((0..16).map(|i| cpu(i, i % 8, 0, i % 8 / 4)).collect())
}

#[test]
fn partial_uncore_drops_one_thread_for_an_odd_request() {
    let index = TopologyIndex::new(&uncore_single_socket_smt());
    // Uncore 1 has only CPU 4 free; uncore 0 is whole. ceil(3/2) = 2 cores of uncore 0 give
    // 0,1,8,9; the odd request drops 9 and fits exactly.
    let available = set("0-4,8-11");
    let with_uncore =
        take_by_topology_packed(&index, &available, 3, CpuSortingStrategy::Packed, true);
    assert_eq!(with_uncore.unwrap(), set("0-1,8"));
    let without = take_by_topology_packed(&index, &available, 3, CpuSortingStrategy::Packed, false);
    assert_eq!(without.unwrap(), set("0,4,8"));
}

#[test]
fn partial_uncore_drops_only_one_thread_on_four_way_smt() {
    // 4 cores × 4 threads, cores 0-1 on uncore 0 and 2-3 on uncore 1.
    let topo = topology((0..16).map(|i| cpu(i, i % 4, 0, i % 4 / 2)).collect());
    let index = TopologyIndex::new(&topo);
    // need 5: 2 cores give 8 threads, one dropped leaves 7 != 5, so no uncore fits and the
    // packed steps run: a whole core, then one thread of the next.
    let picked = take_by_topology_packed(&index, &set("0-15"), 5, CpuSortingStrategy::Packed, true);
    assert_eq!(picked.unwrap(), set("0-1,4,8,12"));
}

#[test]
fn reserved_count_is_taken_by_topology() {
    let topo = single_socket_ht();
    assert_eq!(
        policy(&topo, "", ReservedCpus::Count(1)).reserved(),
        &set("0")
    );
    assert_eq!(
        policy(&topo, "", ReservedCpus::Count(2)).reserved(),
        &set("0,4")
    );
    assert_eq!(
        policy(&topo, "", ReservedCpus::List(set("3"))).reserved(),
        &set("3")
    );
}

#[test]
fn reservation_errors_use_kubelets_texts() {
    let topo = single_socket_ht();
    let err = StaticPolicy::new(
        &topo,
        PolicyOptions::default(),
        ReservedCpus::ListWithCount {
            cpus: set("0-1"),
            count: 1,
        },
        false,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "[cpumanager] unable to reserve the required amount of CPUs (size of 0-1 did not equal 1)"
    );
    let err = StaticPolicy::new(
        &topo,
        PolicyOptions::default(),
        ReservedCpus::Count(9),
        false,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "[cpumanager] unable to reserve the required amount of CPUs (size of  did not equal 9)"
    );
    let err = StaticPolicy::new(
        &topo,
        PolicyOptions::default(),
        ReservedCpus::List(set("12")),
        false,
    )
    .unwrap_err();
    assert_eq!(err, PolicyError::UnknownReservedCpu { cpu: 12 });
}

#[test]
fn a_reservation_that_leaves_pods_no_cpu_is_refused() {
    // Found by fuzzing the planner: a strict reservation of every CPU left an empty shared pool.
    let topo = Topology::regular(RegularShape {
        sockets: 1,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 1,
        threads_per_core: 2,
    })
    .unwrap();
    let strict = PolicyOptions::parse("strict-cpu-reservation=true").unwrap();
    let err = StaticPolicy::new(&topo, strict, ReservedCpus::Count(2), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no cpu is left for pods: the reserved cpus 0-1 (kept out of the shared pool by \
         strict-cpu-reservation) cover every cpu"
    );
    // Without strict reservation the reserved CPUs stay in the shared pool.
    StaticPolicy::new(
        &topo,
        PolicyOptions::default(),
        ReservedCpus::Count(2),
        false,
    )
    .unwrap();
}

#[test]
fn full_pcpus_only_refuses_odd_requests_and_split_reservations() {
    let topo = dual_socket_ht();
    let strict_smt = policy(
        &topo,
        "full-pcpus-only=true",
        ReservedCpus::List(set("1,6")),
    );
    let shared = topo.all_cpus().clone();
    let err = strict_smt
        .allocate(3, &shared, None, &CpuSet::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"
    );
    // Reserved 1 and 6 sit on two different cores: only 8 CPUs remain on whole free cores.
    let err = strict_smt
        .allocate(10, &shared, None, &CpuSet::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, \
         requested CPUs = 10, CPUs per core = 2"
    );
    assert_eq!(
        strict_smt
            .allocate(8, &shared, None, &CpuSet::new())
            .unwrap(),
        set("2-5,8-11")
    );
}

#[test]
fn full_pcpus_only_uses_four_threads_per_core_on_four_way_smt() {
    let topo = Topology::regular(RegularShape {
        sockets: 1,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 18,
        threads_per_core: 4,
    })
    .unwrap();
    let p = policy(&topo, "full-pcpus-only=true", ReservedCpus::Count(4));
    let err = p
        .allocate(15, topo.all_cpus(), None, &CpuSet::new())
        .unwrap_err();
    assert_eq!(
        err,
        AllocationError::SmtNotMultipleOfCore {
            requested: 15,
            cpus_per_core: 4
        }
    );
}

#[test]
fn hint_takes_aligned_cpus_first_then_spills_over() {
    let topo = dual_socket_ht();
    let p = policy(&topo, "", ReservedCpus::Count(0));
    let all = topo.all_cpus().clone();
    let on_node_1 = p.allocate(8, &all, Some(&set("1")), &CpuSet::new());
    assert_eq!(on_node_1.unwrap(), set("0-1,3,5-7,9,11"));
    // A hint too small for the request is not a failure.
    let small = p
        .allocate(10, &all, Some(&set("0")), &CpuSet::new())
        .unwrap();
    assert!(set("0,2,4,6,8,10").is_subset(&small));
}

#[test]
fn align_by_socket_widens_the_hint_to_the_socket() {
    let topo = dual_socket_multi_numa_ht();
    // NUMA node 0 (CPUs 0-9,40-49) has 4 free CPUs, the rest of socket 0 (node 1) is free, and
    // socket 1 is mostly used. 6 CPUs are asked with a hint for node 0: the 2 that do not fit
    // spill to the fullest socket, unless the hint is widened to socket 0.
    let shared = set("8-23,48-63");
    let numa = policy(&topo, "", ReservedCpus::Count(0));
    let by_numa = numa
        .allocate(6, &shared, Some(&set("0")), &CpuSet::new())
        .unwrap();
    let by_socket = StaticPolicy::new(
        &topo,
        PolicyOptions::parse("align-by-socket=true").unwrap(),
        ReservedCpus::Count(0),
        false,
    )
    .unwrap()
    .allocate(6, &shared, Some(&set("0")), &CpuSet::new())
    .unwrap();
    assert_eq!(by_numa, set("8-9,20,48-49,60"));
    assert_eq!(by_socket, set("8-10,48-50"));
}

#[test]
fn align_by_socket_needs_as_many_numa_nodes_as_sockets() {
    let mut topo_cpus: Vec<CpuInfo> = (0..4).map(|i| cpu(i, i, i / 2, 0)).collect();
    for c in &mut topo_cpus {
        c.numa = 0;
    }
    let topo = topology(topo_cpus);
    let err = StaticPolicy::new(
        &topo,
        PolicyOptions::parse("align-by-socket=true").unwrap(),
        ReservedCpus::Count(1),
        false,
    )
    .unwrap_err();
    assert_eq!(
        err,
        PolicyError::Options(OptionsError::AlignBySocketUnsupported {
            sockets: 2,
            numa_nodes: 1
        })
    );
}

#[test]
fn init_container_cpus_are_reused_by_app_containers() {
    let topo = single_socket_ht();
    let p = policy(&topo, "", ReservedCpus::Count(0));
    let mut shared = topo.all_cpus().clone();
    let init = p.allocate(4, &shared, None, &CpuSet::new()).unwrap();
    assert_eq!(init, set("0-1,4-5"));
    shared.remove_all(&init);
    let app = p.allocate(2, &shared, None, &init).unwrap();
    assert_eq!(app, set("0,4"));
    shared.remove_all(&app);
    assert_eq!(shared, set("2-3,6-7"));
    // A sidecar's CPUs are not reusable: the app container gets fresh ones.
    let app = p.allocate(2, &shared, None, &CpuSet::new()).unwrap();
    assert_eq!(app, set("2,6"));
    shared.remove_all(&app);
    assert_eq!(shared, set("3,7"));
}

#[test]
fn strict_reservation_keeps_reserved_cpus_out_of_the_shared_pool() {
    let topo = dual_socket_ht();
    let p = policy(
        &topo,
        "strict-cpu-reservation=true",
        ReservedCpus::List(set("0-1")),
    );
    assert_eq!(p.initial_shared_pool(), set("2-11"));
    assert_eq!(
        p.validate_state(&CpuSet::new(), &Assignments::new())
            .unwrap(),
        set("2-11")
    );
    let lax = policy(&topo, "", ReservedCpus::List(set("0-1")));
    assert_eq!(lax.initial_shared_pool(), set("0-11"));
    assert_eq!(lax.allocatable(&set("0-11")), set("2-11"));
}

#[test]
fn the_shared_pool_is_never_emptied() {
    let topo = dual_socket_ht();
    let p = policy(
        &topo,
        "strict-cpu-reservation=true",
        ReservedCpus::List(set("0,6")),
    );
    let shared = p.initial_shared_pool();
    let err = p.allocate(10, &shared, None, &CpuSet::new()).unwrap_err();
    assert_eq!(
        err,
        AllocationError::WouldEmptySharedPool {
            requested: 10,
            cpus: set("1-5,7-11")
        }
    );
    assert!(err.to_string().contains("shared pool empty"), "{err}");
    assert_eq!(
        p.allocate(9, &shared, None, &CpuSet::new()).unwrap().len(),
        9
    );
}

#[test]
fn isolated_cpus_leave_the_allocatable_pool_after_the_reservation() {
    let base = single_socket_ht();
    let topo = Topology::new(
        base.cpus().to_vec(),
        CpuSet::new(),
        set("0,1,5"),
        base.memory_nodes().clone(),
    )
    .unwrap();
    let options = PolicyOptions::parse("full-pcpus-only=true").unwrap();
    let p = StaticPolicy::new(&topo, options, ReservedCpus::Count(2), true).unwrap();
    // The reservation is chosen from all CPUs, isolated ones included.
    assert_eq!(p.reserved(), &set("0,4"));
    assert_eq!(p.allocatable(topo.all_cpus()), set("2-3,6-7"));
    // Core 1 (1,5) is isolated: only cores 2 and 3 are whole and allowed.
    let err = p
        .allocate(6, topo.all_cpus(), None, &CpuSet::new())
        .unwrap_err();
    assert!(matches!(
        err,
        AllocationError::SmtNotEnoughPhysicalCpus {
            available_physical: 4,
            ..
        }
    ));
    assert_eq!(
        p.allocate(2, topo.all_cpus(), None, &CpuSet::new())
            .unwrap(),
        set("2,6")
    );
    let ignoring = StaticPolicy::new(&topo, options, ReservedCpus::Count(2), false).unwrap();
    assert_eq!(ignoring.allocatable(topo.all_cpus()), set("1-3,5-7"));
}

/// A hybrid part: 4 single-thread E-cores (0-3) and 4 two-thread P-cores (4-7 + 8-11).
fn hybrid() -> Topology {
    let mut cpus: Vec<CpuInfo> = (0..8).map(|i| cpu(i, i, 0, 0)).collect();
    cpus.extend((8..12).map(|i| cpu(i, i - 4, 0, 0)));
    topology(cpus)
}

#[test]
fn hybrid_cores_are_free_only_when_all_their_threads_are() {
    let topo = hybrid();
    let index = TopologyIndex::new(&topo);
    assert!(index.has_heterogeneous_cores());
    assert_eq!(index.cpus_per_core(), 1);
    // Core 4 has one busy thread (8): kubelet's 12/8 = 1 thread per core would call it free
    // and hand out 8 with it.
    let acc = CpuAccumulator::new(&index, &set("4-7,9-11"), 0, CpuSortingStrategy::Packed);
    assert_eq!(acc.free_cores(), vec![5, 6, 7]);
    let picked = packed(&topo, "4-7,9-11", 3).unwrap();
    assert!(picked.is_subset(&set("4-7,9-11")), "{picked}");
    assert_eq!(picked, set("4-5,9"));
}

#[test]
fn hybrid_full_pcpus_only_allocates_whole_cores_or_refuses() {
    let topo = hybrid();
    let p = policy(&topo, "full-pcpus-only=true", ReservedCpus::List(set("0")));
    let all = topo.all_cpus().clone();
    // E-cores first (fewest threads), then whole P-cores.
    assert_eq!(
        p.allocate(3, &all, None, &CpuSet::new()).unwrap(),
        set("1-3")
    );
    assert_eq!(
        p.allocate(5, &all, None, &CpuSet::new()).unwrap(),
        set("1-4,8")
    );
    // Only P-cores left, one of them half busy: 3 CPUs cannot be whole cores.
    let err = p
        .allocate(3, &set("0,4-7,9-11"), None, &CpuSet::new())
        .unwrap_err();
    assert!(
        matches!(err, AllocationError::SmtSplitsCore { requested: 3, .. }),
        "{err}"
    );
    assert!(err.to_string().starts_with("SMT Alignment Error:"), "{err}");
}

#[test]
fn validate_state_reports_kubelets_errors() {
    let topo = dual_socket_ht();
    let p = policy(&topo, "", ReservedCpus::Count(0));
    let mut assignments = Assignments::new();
    assignments
        .entry("pod".to_string())
        .or_default()
        .insert("c".to_string(), set("0-2"));
    assert_eq!(
        p.validate_state(&set("3-11"), &assignments).unwrap(),
        set("3-11")
    );
    assert_eq!(
        p.validate_state(&CpuSet::new(), &assignments).unwrap_err(),
        StateError::EmptySharedPoolWithAssignments
    );
    assert_eq!(
        p.validate_state(&set("3-10"), &assignments)
            .unwrap_err()
            .to_string(),
        "current set of available CPUs \"0-11\" doesn't match with CPUs in state \"0-10\""
    );
}

/// A random regular topology: 1-2 sockets, 1-2 NUMA nodes per socket, 1-2 uncore caches per
/// NUMA node, 1-4 cores per cache, 1, 2 or 4 threads per core.
fn regular_topology() -> impl Strategy<Value = Topology> {
    (
        1u32..=2,
        1u32..=2,
        1u32..=2,
        1u32..=4,
        prop_oneof![Just(1u32), Just(2), Just(4)],
    )
        .prop_map(|(sockets, numa, uncore, cores, threads)| {
            Topology::regular(RegularShape {
                sockets,
                numa_nodes_per_socket: numa,
                uncore_caches_per_numa_node: uncore,
                cores_per_uncore_cache: cores,
                threads_per_core: threads,
            })
            .unwrap()
        })
}

/// A topology, a random subset of its CPUs (plus a few ids it does not have) and a request.
fn scenario() -> impl Strategy<Value = (Topology, CpuSet, usize)> {
    regular_topology().prop_flat_map(|topo| {
        let n = topo.all_cpus().len();
        (
            Just(topo),
            proptest::collection::vec(any::<bool>(), n + 4),
            0..=n + 2,
        )
            .prop_map(|(topo, keep, request)| {
                let available = (0..keep.len() as u32)
                    .filter(|&id| keep[id as usize])
                    .collect();
                (topo, available, request)
            })
    })
}

fn policy_options() -> impl Strategy<Value = PolicyOptions> {
    (any::<[bool; 6]>()).prop_map(|f| PolicyOptions {
        full_pcpus_only: f[0],
        distribute_cpus_across_numa: f[1],
        distribute_cpus_across_cores: f[2],
        align_by_socket: f[3],
        strict_cpu_reservation: f[4],
        prefer_align_cpus_by_uncorecache: f[5],
    })
}

proptest! {
    #[test]
    fn packed_picks_exactly_the_request_from_the_available_cpus(
        (topo, available, request) in scenario(),
        spread in any::<bool>(),
        uncore in any::<bool>(),
    ) {
        let index = TopologyIndex::new(&topo);
        let strategy = if spread { CpuSortingStrategy::Spread } else { CpuSortingStrategy::Packed };
        let usable = available.intersection(topo.all_cpus());
        let first = take_by_topology_packed(&index, &available, request, strategy, uncore);
        let again = take_by_topology_packed(&index, &available, request, strategy, uncore);
        prop_assert_eq!(&first, &again);
        match first {
            Ok(cpus) => {
                prop_assert!(cpus.is_subset(&usable), "{} not in {}", cpus, usable);
                prop_assert_eq!(cpus.len(), request);
            }
            Err(err) => prop_assert!(request > usable.len(), "{}", err),
        }
    }

    #[test]
    fn distributed_picks_exactly_the_request_from_the_available_cpus(
        (topo, available, request) in scenario(),
        group_size in 1usize..=4,
    ) {
        let index = TopologyIndex::new(&topo);
        let usable = available.intersection(topo.all_cpus());
        let outcome = take_by_topology_distributed(
            &index, &available, request, group_size, CpuSortingStrategy::Packed);
        match outcome {
            Ok(cpus) => {
                prop_assert!(cpus.is_subset(&usable), "{} not in {}", cpus, usable);
                prop_assert_eq!(cpus.len(), request);
            }
            Err(err) => prop_assert!(request > usable.len(), "{}", err),
        }
    }

    #[test]
    fn policy_allocations_stay_in_the_allocatable_pool(
        (topo, shared, request) in scenario(),
        options in policy_options(),
        reserved in 0usize..3,
        hint in proptest::option::of(0u32..4),
    ) {
        let Ok(policy) = StaticPolicy::new(&topo, options, ReservedCpus::Count(reserved), false)
        else {
            return Ok(());
        };
        let hint: Option<CpuSet> = hint.map(|node| [node].into_iter().collect());
        let shared = shared.intersection(topo.all_cpus());
        if let Ok(cpus) = policy.allocate(request, &shared, hint.as_ref(), &CpuSet::new()) {
            prop_assert!(cpus.is_subset(&policy.allocatable(&shared)));
            prop_assert_eq!(cpus.len(), request);
            prop_assert!(request == 0 || !shared.difference(&cpus).is_empty());
        }
    }
}

/// `topo` with `isolated` as the kernel's isolated cpus.
fn with_isolated(topo: &Topology, isolated: &str) -> Topology {
    Topology::new(
        topo.cpus().to_vec(),
        CpuSet::new(),
        set(isolated),
        topo.memory_nodes().clone(),
    )
    .unwrap()
}

/// Issue 28, item 3: the isolated pool places a request as the policy in force places it over
/// the isolated cpus alone (kubelet's algorithm, `full-pcpus-only`, best fit), and the general
/// pool never hands one of them out.
#[test]
fn the_isolated_pool_places_with_the_policys_own_rules() {
    // Isolated: cores 2-4 of NUMA node 0 (cpus 2-4 + 42-44) and 20-22 of node 2 (one socket
    // further), with thread 45 of core 5 alone.
    let topo = with_isolated(&dual_socket_multi_numa_ht(), "2-4,20-22,42-45,60-62");
    let isolated = set("2-4,20-22,42-45,60-62");
    let none = CpuSet::new();
    let kubelet = StaticPolicy::new(
        &topo,
        PolicyOptions::default(),
        ReservedCpus::Count(2),
        true,
    )
    .unwrap();
    assert_eq!(kubelet.isolated_pool(), &isolated);
    for n in 1..=isolated.len() {
        let got = kubelet
            .allocate_in(
                CpuPool::Isolated,
                n,
                &isolated,
                None,
                &none,
                CoreType::Performance,
            )
            .unwrap();
        assert_eq!(got, kubelet.take_by_topology(&isolated, n).unwrap(), "{n}");
        let general = kubelet.allocate(n, topo.all_cpus(), None, &none).unwrap();
        assert!(general.is_disjoint(&isolated), "{n}: {general}");
    }
    let full = PolicyOptions::parse("full-pcpus-only=true").unwrap();
    let whole = StaticPolicy::new(&topo, full, ReservedCpus::Count(2), true).unwrap();
    let best = whole.clone().with_placement(Placement::BestFit).unwrap();
    let index = whole.topology_index();
    for p in [&whole, &best] {
        for n in (2..=12).step_by(2) {
            let got = p
                .allocate_in(
                    CpuPool::Isolated,
                    n,
                    &isolated,
                    None,
                    &none,
                    CoreType::Performance,
                )
                .unwrap();
            assert!(got.is_subset(&isolated), "{n}: {got}");
            // Whole cores only: 45's sibling 5 is not isolated, so 45 is never taken.
            assert_eq!(index.whole_core_cpus(&got), got, "{n}: {got}");
            assert!(!got.contains(45), "{n}: {got}");
        }
    }
    // Best fit keeps a request within one NUMA node where it can.
    let four = best
        .allocate_in(
            CpuPool::Isolated,
            4,
            &isolated,
            None,
            &none,
            CoreType::Performance,
        )
        .unwrap();
    assert_eq!(best.numa_nodes_of(&four).len(), 1, "{four}");
}

/// Issue 28, item 3: what the isolated pool cannot serve is refused with a reason of its own
/// (`IsolatedCPUsError`), never served from other cpus; a request that is not whole cores is
/// still kubelet's SMT alignment error.
#[test]
fn the_isolated_pool_refuses_what_it_cannot_hold() {
    let none = CpuSet::new();
    let topo = with_isolated(&single_socket_ht(), "1-2,5");
    let full = PolicyOptions::parse("full-pcpus-only=true").unwrap();
    let p = StaticPolicy::new(&topo, full, ReservedCpus::List(set("0")), true).unwrap();
    let pool = set("1-2,5");
    // Core 1 (1,5) is whole; core 2 (2,6) is not: 2 cpus fit, 4 do not.
    assert_eq!(
        p.allocate_in(
            CpuPool::Isolated,
            2,
            &pool,
            None,
            &none,
            CoreType::Performance
        ),
        Ok(set("1,5"))
    );
    let err = p
        .allocate_in(
            CpuPool::Isolated,
            4,
            &pool,
            None,
            &none,
            CoreType::Performance,
        )
        .unwrap_err();
    assert!(
        matches!(&err, AllocationError::IsolatedPoolTooSmall { requested: 4, pool: p, cause }
            if *p == set("1-2,5")
                && matches!(**cause, AllocationError::SmtNotEnoughPhysicalCpus { .. })),
        "{err:?}"
    );
    assert_eq!(
        err.admission_reason(),
        crate::state::AdmissionReason::IsolatedCpus
    );
    assert!(
        err.admission_message()
            .starts_with("the isolated cpus 1-2,5 cannot hold a request of 4 cpus"),
        "{err}"
    );
    assert!(!err.is_permanent());
    // With 1,5 taken, 2 more do not fit either (the free cpus are counted from `free`).
    assert!(matches!(
        p.allocate_in(
            CpuPool::Isolated,
            2,
            &set("2"),
            None,
            &none,
            CoreType::Performance
        ),
        Err(AllocationError::IsolatedPoolTooSmall { .. })
    ));
    let odd = p
        .allocate_in(
            CpuPool::Isolated,
            3,
            &pool,
            None,
            &none,
            CoreType::Performance,
        )
        .unwrap_err();
    assert!(
        matches!(odd, AllocationError::SmtNotMultipleOfCore { .. }),
        "{odd:?}"
    );

    // Without --respect-isolcpus, or without isolated cpus to give, the request is refused
    // outright.
    let off = StaticPolicy::new(&topo, full, ReservedCpus::List(set("0")), false).unwrap();
    let err = off
        .allocate_in(
            CpuPool::Isolated,
            2,
            topo.all_cpus(),
            None,
            &none,
            CoreType::Performance,
        )
        .unwrap_err();
    assert_eq!(err, AllocationError::IsolatedPoolOff);
    assert!(
        err.to_string().contains("without --respect-isolcpus"),
        "{err}"
    );
    let plain = StaticPolicy::new(&single_socket_ht(), full, ReservedCpus::Count(2), true).unwrap();
    let err = plain
        .allocate_in(
            CpuPool::Isolated,
            2,
            &none,
            None,
            &none,
            CoreType::Performance,
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("the kernel isolates no cpu"),
        "{err}"
    );
    let reserved = with_isolated(&single_socket_ht(), "0,4");
    let p = StaticPolicy::new(&reserved, full, ReservedCpus::List(set("0,4")), true).unwrap();
    let err = p
        .allocate_in(
            CpuPool::Isolated,
            2,
            &set("0,4"),
            None,
            &none,
            CoreType::Performance,
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("isolated cpus 0,4 are all reserved"),
        "{err}"
    );
    assert_eq!(
        err.admission_reason(),
        crate::state::AdmissionReason::IsolatedCpus
    );
}
