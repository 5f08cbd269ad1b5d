//! The human-readable tree of `cpusetd topology`: socket → NUMA node → L3 → core → threads.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::{CoreType, Topology};
use crate::cpuset::CpuSet;

/// Renders the topology as an indented tree. Isolated threads carry `(isolated)`; offline CPUs,
/// whose place in the topology the kernel no longer reports, are listed at the end.
pub fn render_tree(topo: &Topology) -> String {
    let mut out = String::new();
    summary(&mut out, topo);
    tree(&mut out, topo);
    special_cpus(&mut out, topo);
    out
}

/// The first lines: counts, threads per core and, on a hybrid part, the core types.
fn summary(out: &mut String, topo: &Topology) {
    let c = topo.counters();
    let mut threads_per_core: BTreeMap<u32, usize> = BTreeMap::new();
    for cpu in topo.cpus() {
        *threads_per_core.entry(cpu.core).or_default() += 1;
    }
    let min = threads_per_core.values().min().copied().unwrap_or(0);
    let max = threads_per_core.values().max().copied().unwrap_or(0);
    let smt = if min == max {
        format!("{max} thread(s) per core")
    } else {
        format!("{min}-{max} threads per core (heterogeneous cores)")
    };
    let _ = writeln!(
        out,
        "{} online cpus: {} socket(s), {} NUMA node(s), {} L3 cache(s), {} cores, {smt}",
        c.num_cpus, c.num_sockets, c.num_numa_nodes, c.num_uncore_caches, c.num_cores
    );
    let types = topo.core_types();
    if !types.is_empty() {
        let cores = |set: &CpuSet| {
            threads_per_core
                .keys()
                .filter(|&&core| set.contains(core))
                .count()
        };
        let _ = writeln!(
            out,
            "core types: performance cpus {} ({} cores), efficient cpus {} ({} cores)",
            types.performance,
            cores(&types.performance),
            types.efficient,
            cores(&types.efficient)
        );
    }
}

/// socket → numa → uncore → core → threads, all ordered by id.
fn tree(out: &mut String, topo: &Topology) {
    let types = topo.core_types();
    let type_of = |cpu: u32| {
        [CoreType::Performance, CoreType::Efficient]
            .into_iter()
            .find(|&t| types.of(t).contains(cpu))
    };
    type Tree = BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, Vec<u32>>>>>;
    let mut tree: Tree = BTreeMap::new();
    let mut dies: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for cpu in topo.cpus() {
        tree.entry(cpu.socket)
            .or_default()
            .entry(cpu.numa)
            .or_default()
            .entry(cpu.uncore)
            .or_default()
            .entry(cpu.core)
            .or_default()
            .push(cpu.id);
        dies.entry(cpu.socket).or_default().insert(cpu.die);
    }
    for (socket, numas) in &tree {
        let die_list: Vec<String> = dies[socket].iter().map(u32::to_string).collect();
        let _ = writeln!(out, "socket {socket} (die {})", die_list.join(","));
        for (numa, uncores) in numas {
            let memory = if topo.memory_nodes().contains(*numa) {
                ""
            } else {
                " (no memory)"
            };
            let _ = writeln!(out, "  numa {numa}{memory}");
            for (uncore, cores) in uncores {
                let cpus: CpuSet = cores.values().flatten().copied().collect();
                let _ = writeln!(out, "    L3 {uncore}: cpus {cpus}");
                for (core, threads) in cores {
                    let threads: Vec<String> = threads
                        .iter()
                        .map(|t| {
                            if topo.isolated().contains(*t) {
                                format!("{t} (isolated)")
                            } else {
                                t.to_string()
                            }
                        })
                        .collect();
                    let kind = type_of(*core).map_or(String::new(), |t| format!(" ({})", t.name()));
                    let _ = writeln!(out, "      core {core}{kind}: {}", threads.join(", "));
                }
            }
        }
    }
}

/// The offline, isolated, `nohz_full` CPUs and the memory nodes.
fn special_cpus(out: &mut String, topo: &Topology) {
    let none = |s: &CpuSet| {
        if s.is_empty() {
            "none".to_string()
        } else {
            s.to_string()
        }
    };
    let _ = writeln!(out, "offline: {}", none(topo.offline()));
    let _ = writeln!(out, "isolated: {}", none(topo.isolated()));
    if !topo.nohz_full().is_empty() {
        let _ = writeln!(
            out,
            "nohz_full: {} (scheduler tick off; allocatable)",
            topo.nohz_full()
        );
    }
    let _ = writeln!(out, "memory nodes: {}", none(topo.memory_nodes()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::CpuInfo;

    #[test]
    fn tree_marks_isolated_threads_and_offline_cpus() {
        let cpu = |id, core| CpuInfo {
            id,
            socket: 0,
            die: 0,
            numa: 0,
            core,
            uncore: 0,
            cluster: None,
        };
        let topo = Topology::new(
            vec![cpu(0, 0), cpu(1, 1), cpu(2, 0), cpu(3, 1)],
            CpuSet::parse("4-5").unwrap(),
            CpuSet::parse("3").unwrap(),
            CpuSet::parse("0").unwrap(),
        )
        .unwrap();
        let text = render_tree(&topo);
        assert_eq!(
            text,
            "4 online cpus: 1 socket(s), 1 NUMA node(s), 1 L3 cache(s), 2 cores, 2 thread(s) per core\n\
             socket 0 (die 0)\n  numa 0\n    L3 0: cpus 0-3\n      core 0: 0, 2\n      core 1: 1, 3 (isolated)\n\
             offline: 4-5\nisolated: 3\nmemory nodes: 0\n"
        );
    }
}
