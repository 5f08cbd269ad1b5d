//! Times one exclusive allocation (`StaticPolicy::allocate`) on large machines, fresh and
//! half-full, with kubelet's placement and with best fit, and prints the median and 99th
//! percentile per scenario.
//!
//! Run with `cargo bench --bench allocate`. No harness: each scenario is warmed up, then timed
//! call by call with `Instant`, so the figures are per allocation, not per batch.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpusetd::allocator::{Placement, PolicyOptions, ReservedCpus, StaticPolicy};
use cpusetd::cpuset::CpuSet;
use cpusetd::topology::{RegularShape, Topology};

const WARMUP: usize = 2_000;
const SAMPLES: usize = 20_000;

struct Machine {
    name: &'static str,
    topology: Topology,
}

fn machines() -> Vec<Machine> {
    let shape = |sockets, cores, threads| RegularShape {
        sockets,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: cores,
        threads_per_core: threads,
    };
    vec![
        Machine {
            name: "2 sockets x 64 cores x 2 threads (256)",
            topology: Topology::regular(shape(2, 64, 2)).expect("256-thread topology"),
        },
        Machine {
            name: "4 sockets x 18 cores x 4 threads (288)",
            topology: Topology::regular(shape(4, 18, 4)).expect("288-thread topology"),
        },
    ]
}

/// The shared pool with every other core taken by earlier containers.
fn half_full(topology: &Topology) -> CpuSet {
    let mut pool = topology.all_cpus().clone();
    for cpu in topology.cpus() {
        if cpu.core % 2 == 1 {
            pool.remove(cpu.id);
        }
    }
    pool
}

fn percentile(sorted: &[Duration], fraction: f64) -> f64 {
    let rank = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[rank].as_secs_f64() * 1e6
}

fn time(policy: &StaticPolicy, pool: &CpuSet, request: usize) -> (f64, f64) {
    let empty = CpuSet::new();
    let once = || {
        let start = Instant::now();
        let cpus = policy.allocate(black_box(request), black_box(pool), None, &empty);
        let elapsed = start.elapsed();
        assert_eq!(cpus.map(|c| c.len()).ok(), Some(request));
        elapsed
    };
    for _ in 0..WARMUP {
        once();
    }
    let mut samples: Vec<Duration> = (0..SAMPLES).map(|_| once()).collect();
    samples.sort_unstable();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn main() {
    println!("one allocation, {SAMPLES} samples each (µs)");
    println!(
        "{:<42} {:<10} {:<10} {:<8} {:>8} {:>8}",
        "topology", "placement", "pool", "request", "median", "p99"
    );
    for machine in machines() {
        let kubelet = StaticPolicy::new(
            &machine.topology,
            PolicyOptions::default(),
            ReservedCpus::Count(2),
            false,
        )
        .expect("policy");
        let best_fit = kubelet
            .clone()
            .with_placement(Placement::BestFit)
            .expect("best fit");
        for policy in [&kubelet, &best_fit] {
            let pools = [
                ("fresh", policy.initial_shared_pool()),
                ("half-full", half_full(&machine.topology)),
            ];
            for (pool_name, pool) in &pools {
                for request in [4, 16] {
                    let (median, p99) = time(policy, pool, request);
                    println!(
                        "{:<42} {:<10} {:<10} {:<8} {:>8.2} {:>8.2}",
                        machine.name,
                        policy.placement(),
                        pool_name,
                        request,
                        median,
                        p99
                    );
                }
            }
        }
    }
}
