//! Churn: replays seeded arrival/departure traces of 1–16-CPU containers against the static
//! policy, once with kubelet's placement and once with best fit, and prints side by side how
//! often each gave a NUMA-aligned set, an L3-aligned set and whole cores for even requests
//! (each counted only where such a set was possible at that moment), how many requests it
//! refused, and how long one allocation took. On a machine with several dies per socket also
//! die-aligned sets; on a hybrid part (1–4-CPU containers there) sets on performance cores only.
//!
//! Run with `cargo bench --bench churn` (or `scripts/bench.sh churn`). Knobs: `SEEDS` (traces
//! per machine, default 8, seeds 1..=SEEDS), `EVENTS` (arrivals + departures per trace, default
//! 20000), `LOAD` (the busy level in percent of the allocatable CPUs, default 90).
//!
//! A trace is made before any allocation and is the same for both placements: a container
//! arrives with 1–16 CPUs (uniform) or a random live one departs, arrivals being likelier while
//! the CPUs asked for stay under `LOAD` % of the allocatable CPUs and departures likelier above, so
//! the node stays busy and now and then full. A refused container's departure is a no-op. The
//! pool bookkeeping is the agent's: the result leaves the shared pool, a departure returns it.
//! Every grant is checked (count, inside the allocatable CPUs, disjoint from every live one).

use std::collections::HashMap;
use std::env;
use std::hint::black_box;
use std::time::{Duration, Instant};

use cpusetd::allocator::{Placement, PolicyOptions, ReservedCpus, StaticPolicy};
use cpusetd::cpuset::CpuSet;
use cpusetd::topology::{discover, CpuInfo, RegularShape, Topology};

const MAX_REQUEST: u64 = 16;
const RESERVED: usize = 2;

/// splitmix64: a small seeded generator, enough for traces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Arrive { id: usize, cpus: usize },
    Depart { id: usize },
}

fn trace(seed: u64, events: usize, busy: usize, max_request: u64) -> Vec<Event> {
    let mut rng = Rng(seed);
    let mut live: Vec<(usize, usize)> = Vec::new();
    let mut asked = 0;
    let mut out = Vec::with_capacity(events);
    for id in 0..events {
        let arrival_percent = if asked < busy { 65 } else { 35 };
        if live.is_empty() || rng.below(100) < arrival_percent {
            let cpus = 1 + rng.below(max_request) as usize;
            live.push((id, cpus));
            asked += cpus;
            out.push(Event::Arrive { id, cpus });
        } else {
            let (id, cpus) = live.swap_remove(rng.below(live.len() as u64) as usize);
            asked -= cpus;
            out.push(Event::Depart { id });
        }
    }
    out
}

struct Machine {
    name: String,
    topology: Topology,
    numa_nodes: Vec<CpuSet>,
    caches: Vec<CpuSet>,
    cores: Vec<CpuSet>,
    /// The dies (socket, die id); empty where every socket has one.
    dies: Vec<CpuSet>,
    /// Performance CPUs of a hybrid part; empty elsewhere.
    performance: CpuSet,
    max_request: u64,
}

impl Machine {
    fn new(name: &str, topology: Topology) -> Self {
        let group = |of: fn(&CpuInfo) -> u32| {
            let mut groups: HashMap<u32, CpuSet> = HashMap::new();
            for cpu in topology.cpus() {
                groups.entry(of(cpu)).or_default().insert(cpu.id);
            }
            groups.into_values().collect::<Vec<_>>()
        };
        let mut dies: HashMap<(u32, u32), CpuSet> = HashMap::new();
        for cpu in topology.cpus() {
            dies.entry((cpu.socket, cpu.die))
                .or_default()
                .insert(cpu.id);
        }
        let sockets = group(|c| c.socket).len();
        let dies: Vec<CpuSet> = if dies.len() > sockets {
            dies.into_values().collect()
        } else {
            Vec::new()
        };
        Machine {
            name: format!("{name} ({} cpus)", topology.all_cpus().len()),
            numa_nodes: group(|c| c.numa),
            caches: group(|c| c.uncore),
            cores: group(|c| c.core),
            dies,
            performance: topology.core_types().performance.clone(),
            max_request: MAX_REQUEST,
            topology,
        }
    }

    /// Several dies per socket sharing the socket's one L3 and NUMA node (Sapphire Rapids-like
    /// tiles), threads numbered last.
    fn dies(sockets: u32, dies: u32, cores_per_die: u32) -> Self {
        let cores = sockets * dies * cores_per_die;
        let mut cpus = Vec::new();
        for core in 0..cores {
            let socket = core / (dies * cores_per_die);
            for thread in 0..2 {
                cpus.push(CpuInfo {
                    id: core + thread * cores,
                    socket,
                    die: core / cores_per_die % dies,
                    numa: socket,
                    core,
                    uncore: socket,
                    cluster: None,
                });
            }
        }
        let memory = (0..sockets).collect();
        let topology = Topology::new(cpus, CpuSet::new(), CpuSet::new(), memory).expect("dies");
        Machine::new(
            &format!(
                "{sockets} sockets x {dies} dies (1 NUMA, 1 L3 per socket) x {cores_per_die} cores x 2"
            ),
            topology,
        )
    }

    /// The hybrid-pe fixture (8 P-cores x 2 threads + 8 E-cores), read as the agent reads it;
    /// containers of 1-4 cpus (a client part).
    fn hybrid() -> Self {
        let root =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/sysfs/hybrid-pe");
        let topology = discover(&root, &root.join("proc")).expect("hybrid-pe fixture");
        Machine {
            max_request: 4,
            ..Machine::new("hybrid-pe: 8 P-cores x 2 threads + 8 E-cores", topology)
        }
    }

    fn regular(name: &str, shape: RegularShape) -> Self {
        Machine::new(name, Topology::regular(shape).expect("regular topology"))
    }

    /// Sub-NUMA clustering: two NUMA nodes per socket sharing the socket's one L3.
    fn snc(sockets: u32, cores_per_numa: u32) -> Self {
        let cores = sockets * 2 * cores_per_numa;
        let mut cpus = Vec::new();
        for core in 0..cores {
            let numa = core / cores_per_numa;
            for thread in 0..2 {
                cpus.push(CpuInfo {
                    id: core + thread * cores,
                    socket: numa / 2,
                    die: 0,
                    numa,
                    core,
                    uncore: numa / 2,
                    cluster: None,
                });
            }
        }
        let memory = (0..sockets * 2).collect();
        let topology = Topology::new(cpus, CpuSet::new(), CpuSet::new(), memory).expect("snc");
        Machine::new(
            &format!(
                "{sockets} sockets x 2 NUMA (SNC2) x 1 L3 per socket x {cores_per_numa} cores x 2"
            ),
            topology,
        )
    }

    fn fits_one(domains: &[CpuSet], free: &CpuSet, n: usize) -> bool {
        domains.iter().any(|d| d.intersection_len(free) >= n)
    }

    fn in_one(domains: &[CpuSet], cpus: &CpuSet) -> bool {
        domains.iter().any(|d| cpus.is_subset(d))
    }

    /// Whether one NUMA node holds `n` cpus of `free` on whole cores.
    fn numa_node_fits_on_whole_cores(&self, free: &CpuSet, n: usize) -> bool {
        self.numa_nodes
            .iter()
            .any(|node| self.whole_core_cpus(&node.intersection(free)) >= n)
    }

    /// CPUs of `free` on cores all of whose threads are free.
    fn whole_core_cpus(&self, free: &CpuSet) -> usize {
        self.cores
            .iter()
            .filter(|core| core.is_subset(free))
            .map(CpuSet::len)
            .sum()
    }

    fn splits_no_core(&self, cpus: &CpuSet) -> bool {
        self.cores
            .iter()
            .all(|core| core.is_subset(cpus) || core.is_disjoint(cpus))
    }
}

/// An aligned outcome counted where it was possible.
#[derive(Debug, Default, Clone, Copy)]
struct Rate {
    possible: u64,
    achieved: u64,
}

impl Rate {
    fn count(&mut self, possible: bool, achieved: bool) {
        if possible {
            self.possible += 1;
            self.achieved += u64::from(achieved);
        }
    }

    fn percent(&self) -> f64 {
        if self.possible == 0 {
            100.0
        } else {
            100.0 * self.achieved as f64 / self.possible as f64
        }
    }

    fn add(&mut self, other: &Rate) {
        self.possible += other.possible;
        self.achieved += other.achieved;
    }
}

#[derive(Debug, Default)]
struct Outcome {
    arrivals: u64,
    refusals: u64,
    numa: Rate,
    cache: Rate,
    whole_possible: Rate,
    whole_in_numa_possible: Rate,
    whole_all: Rate,
    die: Rate,
    performance: Rate,
    /// Even requests for which a NUMA-aligned set and a whole-core set were each possible,
    /// but no NUMA-aligned whole-core set.
    conflicts: u64,
    times: Vec<Duration>,
}

fn replay(machine: &Machine, policy: &StaticPolicy, events: &[Event]) -> Outcome {
    let mut outcome = Outcome::default();
    let mut shared_pool = policy.initial_shared_pool();
    let mut live: HashMap<usize, CpuSet> = HashMap::new();
    let mut in_use = CpuSet::new();
    let none = CpuSet::new();
    for event in events {
        match *event {
            Event::Arrive { id, cpus: n } => {
                outcome.arrivals += 1;
                let allocatable = policy.allocatable(&shared_pool);
                let numa_possible = Machine::fits_one(&machine.numa_nodes, &allocatable, n);
                let cache_possible = Machine::fits_one(&machine.caches, &allocatable, n);
                let whole_possible = machine.whole_core_cpus(&allocatable) >= n;
                let die_possible = Machine::fits_one(&machine.dies, &allocatable, n);
                let performance_possible = !machine.performance.is_empty()
                    && machine.performance.intersection_len(&allocatable) >= n;
                let start = Instant::now();
                let result = policy.allocate(black_box(n), black_box(&shared_pool), None, &none);
                outcome.times.push(start.elapsed());
                let Ok(cpus) = result else {
                    outcome.refusals += 1;
                    continue;
                };
                assert_eq!(cpus.len(), n, "{}: a grant of the wrong size", machine.name);
                assert!(
                    cpus.is_subset(&allocatable),
                    "{}: not allocatable",
                    machine.name
                );
                assert!(cpus.is_disjoint(&in_use), "{}: given twice", machine.name);
                outcome
                    .numa
                    .count(numa_possible, Machine::in_one(&machine.numa_nodes, &cpus));
                outcome
                    .cache
                    .count(cache_possible, Machine::in_one(&machine.caches, &cpus));
                outcome
                    .die
                    .count(die_possible, Machine::in_one(&machine.dies, &cpus));
                outcome
                    .performance
                    .count(performance_possible, cpus.is_subset(&machine.performance));
                if n % 2 == 0 {
                    let whole = machine.splits_no_core(&cpus);
                    let numa_whole_possible =
                        machine.numa_node_fits_on_whole_cores(&allocatable, n);
                    outcome.whole_possible.count(whole_possible, whole);
                    outcome
                        .whole_in_numa_possible
                        .count(numa_whole_possible, whole);
                    outcome.conflicts +=
                        u64::from(numa_possible && whole_possible && !numa_whole_possible);
                    outcome.whole_all.count(true, whole);
                }
                shared_pool.remove_all(&cpus);
                in_use.extend_from(&cpus);
                live.insert(id, cpus);
            }
            Event::Depart { id } => {
                if let Some(cpus) = live.remove(&id) {
                    shared_pool.extend_from(&cpus);
                    in_use.remove_all(&cpus);
                }
            }
        }
    }
    outcome
}

/// Totals over the seeds, with the lowest and highest per-seed percentage of each rate.
#[derive(Debug, Default)]
struct Summary {
    total: Outcome,
    ranges: [(f64, f64); 7],
}

impl Summary {
    fn add(&mut self, outcome: Outcome) {
        let rates = [
            &outcome.numa,
            &outcome.cache,
            &outcome.whole_possible,
            &outcome.whole_in_numa_possible,
            &outcome.whole_all,
            &outcome.die,
            &outcome.performance,
        ];
        let first = self.total.arrivals == 0;
        for (range, rate) in self.ranges.iter_mut().zip(rates) {
            let p = rate.percent();
            *range = if first {
                (p, p)
            } else {
                (range.0.min(p), range.1.max(p))
            };
        }
        let t = &mut self.total;
        t.arrivals += outcome.arrivals;
        t.refusals += outcome.refusals;
        t.numa.add(&outcome.numa);
        t.cache.add(&outcome.cache);
        t.whole_possible.add(&outcome.whole_possible);
        t.whole_in_numa_possible
            .add(&outcome.whole_in_numa_possible);
        t.conflicts += outcome.conflicts;
        t.whole_all.add(&outcome.whole_all);
        t.die.add(&outcome.die);
        t.performance.add(&outcome.performance);
        t.times.extend(outcome.times);
    }

    fn rate_cell(&self, which: usize) -> String {
        let rate = [
            &self.total.numa,
            &self.total.cache,
            &self.total.whole_possible,
            &self.total.whole_in_numa_possible,
            &self.total.whole_all,
            &self.total.die,
            &self.total.performance,
        ][which];
        let (lo, hi) = self.ranges[which];
        format!("{:6.2} % ({lo:.1}–{hi:.1})", rate.percent())
    }

    fn micros(&mut self, fraction: f64) -> f64 {
        let times = &mut self.total.times;
        times.sort_unstable();
        let rank = ((times.len() - 1) as f64 * fraction).round() as usize;
        times[rank].as_secs_f64() * 1e6
    }
}

fn env_number(name: &str, default: usize) -> usize {
    env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let seeds = env_number("SEEDS", 8) as u64;
    let events = env_number("EVENTS", 20_000);
    let load = env_number("LOAD", 90);
    let shape = |sockets, numa, caches, cores| RegularShape {
        sockets,
        numa_nodes_per_socket: numa,
        uncore_caches_per_numa_node: caches,
        cores_per_uncore_cache: cores,
        threads_per_core: 2,
    };
    let machines = [
        Machine::regular(
            "2 sockets x 2 NUMA x 2 L3 x 8 cores x 2 threads",
            shape(2, 2, 2, 8),
        ),
        Machine::regular(
            "2 sockets x 1 NUMA x 8 L3 x 8 cores x 2 threads (EPYC-like)",
            shape(2, 1, 8, 8),
        ),
        Machine::snc(2, 12),
        Machine::regular(
            "2 sockets x 1 NUMA x 1 L3 x 64 cores x 2 threads",
            shape(2, 1, 1, 64),
        ),
        Machine::dies(2, 4, 14),
        Machine::hybrid(),
    ];
    println!(
        "churn: {seeds} seeds x {events} events per machine, requests 1-{MAX_REQUEST} cpus \
         (1-4 on the hybrid part), {RESERVED} reserved cpus, busy at {load} %; rates are over all \
         seeds (lowest-highest seed)"
    );
    for machine in &machines {
        let kubelet = StaticPolicy::new(
            &machine.topology,
            PolicyOptions::default(),
            ReservedCpus::Count(RESERVED),
            false,
        )
        .expect("policy");
        let best_fit = kubelet
            .clone()
            .with_placement(Placement::BestFit)
            .expect("best fit");
        let busy = kubelet.allocatable(&kubelet.initial_shared_pool()).len() * load / 100;
        let mut summaries = [Summary::default(), Summary::default()];
        for seed in 1..=seeds {
            let events = trace(seed, events, busy, machine.max_request);
            for (summary, policy) in summaries.iter_mut().zip([&kubelet, &best_fit]) {
                summary.add(replay(machine, policy, &events));
            }
        }
        println!();
        println!("{}", machine.name);
        println!("{:<36} {:>26} {:>26}", "", "kubelet", "best-fit");
        let rows = [
            "NUMA-aligned, where possible",
            "L3-aligned, where possible",
            "whole cores (even), where possible",
            "  where possible in one NUMA node",
            "whole cores (even), all",
            "die-aligned, where possible",
            "P-cores only, where possible",
        ];
        let shown = [
            true,
            true,
            true,
            true,
            true,
            !machine.dies.is_empty(),
            !machine.performance.is_empty(),
        ];
        for (which, row) in rows.iter().enumerate().filter(|(w, _)| shown[*w]) {
            println!(
                "{row:<36} {:>26} {:>26}",
                summaries[0].rate_cell(which),
                summaries[1].rate_cell(which)
            );
        }
        let conflicts = |s: &Summary| format!("{}", s.total.conflicts);
        println!(
            "{:<36} {:>26} {:>26}",
            "even: NUMA-aligned or whole, not both",
            conflicts(&summaries[0]),
            conflicts(&summaries[1])
        );
        let refusals = |s: &Summary| format!("{} of {}", s.total.refusals, s.total.arrivals);
        println!(
            "{:<36} {:>26} {:>26}",
            "refusals",
            refusals(&summaries[0]),
            refusals(&summaries[1])
        );
        let [k, b] = &mut summaries;
        println!(
            "{:<36} {:>26} {:>26}",
            "allocate median / p99 (µs)",
            format!("{:.2} / {:.2}", k.micros(0.5), k.micros(0.99)),
            format!("{:.2} / {:.2}", b.micros(0.5), b.micros(0.99))
        );
    }
}
