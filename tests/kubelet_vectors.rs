//! Runs the cases of `testdata/kubelet_vectors.json` (taken from kubelet's own unit tests)
//! through the public allocator API and checks kubelet's exact answers: CPU sets, orderings,
//! error texts and uncore cache ids.
//!
//! Every case that can be expressed through the API runs; the rest are listed with the reason
//! they are skipped. The test prints `kubelet vectors: N ran, M skipped`.

use std::collections::BTreeMap;

use cpusetd::allocator::{
    take_by_topology_distributed, take_by_topology_packed, AllocationError, Assignments,
    CpuAccumulator, CpuSortingStrategy, PolicyOptions, ReservedCpus, StaticPolicy, TopologyIndex,
};
use cpusetd::cpuset::CpuSet;
use cpusetd::topology::{Counters, CpuInfo, Topology};
use serde_json::Value;

const VECTORS: &str = include_str!("../testdata/kubelet_vectors.json");

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap_or_else(|e| panic!("vector cpu list: {e}"))
}

fn field_set(case: &Value, key: &str) -> CpuSet {
    set(case[key].as_str().unwrap_or(""))
}

fn usize_field(case: &Value, key: &str) -> usize {
    case[key].as_u64().unwrap_or(0) as usize
}

fn flag(value: &Value, key: &str) -> bool {
    value[key].as_bool().unwrap_or(false)
}

/// A kubelet fixture: its CPU map plus its literal counters.
fn topology(vectors: &Value, name: &str) -> Topology {
    let fixture = &vectors["topologies"][name];
    let as_u32 = |cpu: &Value, key: &str| cpu[key].as_u64().unwrap_or(0) as u32;
    let cpus: Vec<CpuInfo> = fixture["cpus"]
        .as_array()
        .unwrap_or_else(|| panic!("topology {name} has no cpus"))
        .iter()
        .map(|cpu| CpuInfo {
            id: as_u32(cpu, "id"),
            socket: as_u32(cpu, "socket"),
            die: 0,
            numa: as_u32(cpu, "numa"),
            core: as_u32(cpu, "core"),
            uncore: as_u32(cpu, "uncore"),
            cluster: None,
        })
        .collect();
    let memory_nodes: CpuSet = cpus.iter().map(|cpu| cpu.numa).collect();
    let counters = Counters {
        num_cpus: usize_field(fixture, "num_cpus"),
        num_cores: usize_field(fixture, "num_cores"),
        num_sockets: usize_field(fixture, "num_sockets"),
        num_numa_nodes: usize_field(fixture, "num_numa_nodes"),
        num_uncore_caches: usize_field(fixture, "num_uncore_cache"),
    };
    Topology::new(cpus, CpuSet::new(), CpuSet::new(), memory_nodes)
        .unwrap_or_else(|e| panic!("topology {name}: {e}"))
        .with_counters(counters)
}

fn options(case: &Value) -> PolicyOptions {
    let o = &case["options"];
    PolicyOptions {
        full_pcpus_only: flag(o, "full_pcpus_only"),
        distribute_cpus_across_numa: flag(o, "distribute_cpus_across_numa"),
        distribute_cpus_across_cores: flag(o, "distribute_cpus_across_cores"),
        align_by_socket: flag(o, "align_by_socket"),
        strict_cpu_reservation: flag(o, "strict_cpu_reservation"),
        prefer_align_cpus_by_uncorecache: flag(o, "prefer_align_cpus_by_uncorecache"),
    }
}

fn strategy(options: &PolicyOptions) -> CpuSortingStrategy {
    if options.distribute_cpus_across_cores {
        CpuSortingStrategy::Spread
    } else {
        CpuSortingStrategy::Packed
    }
}

/// The reservation as the Go test configures it: an explicit `reservedSystemCPUs` list checked
/// against the count, or a count the policy picks itself.
fn reservation(case: &Value) -> ReservedCpus {
    let count = usize_field(case, "num_reserved");
    if flag(case, "reserved_explicit") {
        ReservedCpus::ListWithCount {
            cpus: field_set(case, "reserved"),
            count,
        }
    } else {
        ReservedCpus::Count(count)
    }
}

/// Compares an outcome with the case's `expect` / `expect_error_message`.
fn check_outcome<E: std::fmt::Display + std::fmt::Debug>(
    case: &Value,
    outcome: Result<CpuSet, E>,
) -> Result<(), String> {
    match (outcome, case["expect_error_message"].as_str()) {
        (Ok(got), None) => {
            let want = field_set(case, "expect");
            if got == want {
                Ok(())
            } else {
                Err(format!("got {got}, want {want}"))
            }
        }
        (Err(err), Some(want)) if err.to_string() == want => Ok(()),
        (Ok(got), Some(want)) => Err(format!("got {got}, want error {want:?}")),
        (Err(err), None) => Err(format!("got error {err:?}, want {}", case["expect"])),
        (Err(err), Some(want)) => Err(format!(
            "got error {:?}, want error {want:?}",
            err.to_string()
        )),
    }
}

/// Builds the policy of a staticPolicy case and checks a computed reservation against the one
/// the reference recorded.
fn policy(vectors: &Value, case: &Value, options: PolicyOptions) -> Result<StaticPolicy, String> {
    let topo = topology(vectors, case["topology"].as_str().unwrap_or(""));
    let policy = StaticPolicy::new(&topo, options, reservation(case), false)
        .map_err(|e| format!("policy: {e}"))?;
    let want = field_set(case, "reserved");
    if policy.reserved() != &want {
        return Err(format!("reserved {}, want {want}", policy.reserved()));
    }
    Ok(policy)
}

/// kubelet hands out the last CPUs of its default set; cpusetd refuses to. A refusal naming
/// exactly kubelet's answer counts as agreeing with kubelet.
fn kubelet_choice(outcome: Result<CpuSet, AllocationError>) -> Result<CpuSet, AllocationError> {
    match outcome {
        Err(AllocationError::WouldEmptySharedPool { cpus, .. }) => Ok(cpus),
        other => other,
    }
}

fn run_case(vectors: &Value, case: &Value) -> Result<(), String> {
    let entry = case["entry_point"].as_str().unwrap_or("");
    let options = options(case);
    let available = field_set(case, "available");
    let request = usize_field(case, "request");
    match entry {
        "takeByTopologyNUMAPacked" => {
            let index =
                TopologyIndex::new(&topology(vectors, case["topology"].as_str().unwrap_or("")));
            let outcome = take_by_topology_packed(
                &index,
                &available,
                request,
                strategy(&options),
                options.prefer_align_cpus_by_uncorecache,
            );
            check_outcome(case, outcome)
        }
        "takeByTopologyNUMADistributed" => {
            let index =
                TopologyIndex::new(&topology(vectors, case["topology"].as_str().unwrap_or("")));
            let outcome = take_by_topology_distributed(
                &index,
                &available,
                request,
                usize_field(case, "cpu_group_size"),
                strategy(&options),
            );
            check_outcome(case, outcome)
        }
        "staticPolicy.Allocate" | "staticPolicy.allocateCPUs" => {
            let policy = policy(vectors, case, options)?;
            let hint: Option<CpuSet> = case["numa_affinity"].as_array().map(|nodes| {
                nodes
                    .iter()
                    .filter_map(|n| n.as_u64())
                    .map(|n| n as u32)
                    .collect()
            });
            let outcome = policy.allocate(request, &available, hint.as_ref(), &CpuSet::new());
            check_outcome(case, kubelet_choice(outcome))
        }
        "staticPolicy.Allocate(sequential containers)" => {
            let policy = policy(vectors, case, options)?;
            let mut shared_pool = available;
            let mut picks = Vec::new();
            for request in case["requests"].as_array().into_iter().flatten() {
                let request = request.as_u64().unwrap_or(0) as usize;
                let cpus =
                    kubelet_choice(policy.allocate(request, &shared_pool, None, &CpuSet::new()))
                        .map_err(|e| format!("request {request}: {e}"))?;
                shared_pool.remove_all(&cpus);
                picks.push(cpus);
            }
            let all = picks
                .iter()
                .fold(CpuSet::new(), |all, cpus| all.union(cpus));
            let uncore_ids: CpuSet = policy
                .topology_index()
                .uncore_cache_ids_of(&all)
                .into_iter()
                .collect();
            let want_uncore = field_set(case, "expect_uncore_cache_ids");
            if uncore_ids != want_uncore {
                return Err(format!(
                    "uncore caches {uncore_ids} (cpus {all}), want {want_uncore}"
                ));
            }
            if let Some(want) = case["expect"].as_str() {
                if all != set(want) {
                    return Err(format!("got {all}, want {want}"));
                }
            }
            if let Some(simulated) = case["simulated_allocations_informative"].as_array() {
                let simulated: Vec<CpuSet> = simulated
                    .iter()
                    .map(|s| set(s.as_str().unwrap_or("")))
                    .collect();
                if simulated != picks {
                    return Err(format!(
                        "per-container picks {picks:?} differ from the reference's {simulated:?}"
                    ));
                }
            }
            Ok(())
        }
        other => Err(format!("unknown entry point {other:?}")),
    }
}

/// Why a case cannot be expressed through the allocator API, if it cannot.
fn skip_reason(case: &Value) -> Option<&'static str> {
    if case.get("existing_assignment").is_some() {
        return Some(
            "the container already has an assignment in kubelet's state; returning it unchanged \
             is the caller's state lookup, not an allocator input",
        );
    }
    None
}

fn run_accumulator_case(vectors: &Value, case: &Value) -> Result<(), String> {
    let index = TopologyIndex::new(&topology(vectors, case["topology"].as_str().unwrap_or("")));
    let acc = CpuAccumulator::new(
        &index,
        &field_set(case, "available"),
        0,
        CpuSortingStrategy::Packed,
    );
    let mut got = match case["method"].as_str().unwrap_or("") {
        "freeSockets" => acc.free_sockets(),
        "freeNUMANodes" => acc.free_numa_nodes(),
        "freeCores" => acc.free_cores(),
        "freeCPUs" => acc.free_cpus(),
        "freeUncoreCache" => acc.free_uncore_caches(),
        other => return Err(format!("unknown method {other:?}")),
    };
    let mut want: Vec<u32> = case["expect_order"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_u64())
        .map(|v| v as u32)
        .collect();
    if !flag(case, "order_sensitive") {
        got.sort_unstable();
        want.sort_unstable();
    }
    if got == want {
        Ok(())
    } else {
        Err(format!("got {got:?}, want {want:?}"))
    }
}

fn run_start_case(vectors: &Value, case: &Value) -> Result<(), String> {
    let topo = topology(vectors, case["topology"].as_str().unwrap_or(""));
    let options = PolicyOptions {
        strict_cpu_reservation: flag(case, "strict_cpu_reservation"),
        ..PolicyOptions::default()
    };
    let policy = match StaticPolicy::new(&topo, options, reservation(case), false) {
        Ok(policy) => policy,
        Err(err) => {
            return match case["expect_new_policy_error"].as_str() {
                Some(want) if err.to_string() == want => Ok(()),
                want => Err(format!("policy error {:?}, want {want:?}", err.to_string())),
            };
        }
    };
    if let Some(want) = case["expect_new_policy_error"].as_str() {
        return Err(format!("policy built, want error {want:?}"));
    }
    if policy.reserved() != &field_set(case, "reserved") {
        return Err(format!(
            "reserved {}, want {}",
            policy.reserved(),
            case["reserved"]
        ));
    }
    let mut assignments = Assignments::new();
    for (pod, containers) in case["state_assignments"].as_object().into_iter().flatten() {
        let containers: BTreeMap<String, CpuSet> = containers
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, cpus)| (name.clone(), set(cpus.as_str().unwrap_or(""))))
            .collect();
        assignments.insert(pod.clone(), containers);
    }
    let outcome = policy.validate_state(&field_set(case, "state_default_cpuset"), &assignments);
    match (outcome, case["expect_start_error"].as_str()) {
        (Ok(pool), None) => {
            let want = field_set(case, "expect_default_cpuset");
            if pool == want {
                Ok(())
            } else {
                Err(format!("shared pool {pool}, want {want}"))
            }
        }
        (Err(err), Some(want)) if err.to_string() == want => Ok(()),
        (outcome, want) => Err(format!("got {outcome:?}, want error {want:?}")),
    }
}

#[test]
fn kubelet_vectors_pass() {
    let vectors: Value = serde_json::from_str(VECTORS).expect("vectors parse");
    let mut ran = 0;
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut record = |source: &Value, outcome: Result<(), String>| {
        ran += 1;
        if let Err(why) = outcome {
            failures.push(format!("{}: {why}", source.as_str().unwrap_or("?")));
        }
    };

    for case in vectors["cases"].as_array().expect("cases") {
        match skip_reason(case) {
            Some(reason) => skipped.push((case["source"].to_string(), reason.to_string())),
            None => record(&case["source"], run_case(&vectors, case)),
        }
    }
    for case in vectors["accumulator_cases"]
        .as_array()
        .expect("accumulator_cases")
    {
        record(&case["source"], run_accumulator_case(&vectors, case));
    }
    for case in vectors["start_cases"].as_array().expect("start_cases") {
        record(&case["source"], run_start_case(&vectors, case));
    }
    let checkpoint = &vectors["checkpoint_checksums"];
    for vector in checkpoint["vectors"]
        .as_array()
        .expect("checkpoint vectors")
    {
        skipped.push((
            format!(
                "{} ({} checksum {})",
                checkpoint["source"], vector["format"], vector["checksum"]
            ),
            "not an allocator case: tests/checkpoint.rs runs it through kubelet_state::parse"
                .to_string(),
        ));
    }

    println!("kubelet vectors: {ran} ran, {} skipped", skipped.len());
    for (source, reason) in &skipped {
        println!("  skipped {source}: {reason}");
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} kubelet vectors failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `topoSingleSocketSingleNumaPerSocketPCoreHTMonolithicUncore` is a hybrid part (8 single-thread
/// cores, 8 two-thread cores; kubelet's 24/16 gives 1 CPU per core). cpusetd runs it as hybrid:
/// cores are free only when all their threads are, and its vector still gets kubelet's answer.
#[test]
fn pcore_fixture_is_handled_as_a_hybrid_part() {
    let vectors: Value = serde_json::from_str(VECTORS).expect("vectors parse");
    let topo = topology(
        &vectors,
        "topoSingleSocketSingleNumaPerSocketPCoreHTMonolithicUncore",
    );
    let index = TopologyIndex::new(&topo);
    assert!(index.has_heterogeneous_cores());
    assert_eq!(index.cpus_per_core(), 1);
    let options =
        PolicyOptions::parse("full-pcpus-only=true,prefer-align-cpus-by-uncorecache=true")
            .expect("options");
    let policy =
        StaticPolicy::new(&topo, options, ReservedCpus::List(set("0-1")), false).expect("policy");
    let cpus = policy
        .allocate(6, &set("2-3,8-23"), None, &CpuSet::new())
        .expect("allocation");
    assert_eq!(cpus, set("2-3,8-9,16-17"));
}
