//! cpusetd's own placement, opt-in with `--placement best-fit`: a best fit over the cache /
//! NUMA node / socket hierarchy, so that a busy node keeps its free CPUs in large aligned blocks.
//!
//! kubelet's packed algorithm takes whole NUMA nodes and sockets, then whole cores and single
//! threads in "fewest free first" order *inside the order of the levels*, never asking whether
//! the request would fit in one last-level cache or one NUMA node. On a node where containers
//! come and go this scatters a request over several caches or NUMA nodes although one of them
//! had room. [`BestFit::take`] asks that question first:
//!
//! 1. Domains are tried in tiers, most aligned first: a last-level (uncore) cache inside one NUMA
//!    node, a NUMA node, then (after every NUMA-aligned choice) a cache spanning NUMA nodes, a
//!    socket, the whole machine. At each level a domain may fit *cleanly* (the even part of the
//!    request on fully free cores, an odd remainder on threads of half-used cores), on *whole
//!    cores* (an odd remainder may break one more core), or just *have enough* free CPUs. The
//!    order is: cache clean, cache whole, NUMA clean, NUMA whole, cache any, NUMA any, then the
//!    clean and whole fits of the wider levels, then their "any" fits. So NUMA alignment comes
//!    before whole cores, whole cores before cache alignment, and socket alignment last.
//! 2. Within a tier, the domain that fits most tightly wins: fewest free CPUs that still hold the
//!    request, then the fewest free CPUs in its NUMA node and socket, then the lowest id.
//! 3. Inside the chosen domain: an odd remainder first takes threads of half-used cores (no new
//!    core is broken), then whole cores, then whatever is left; cores in the fullest caches, NUMA
//!    nodes and sockets first, so the emptiest blocks stay whole.
//!
//! With `full-pcpus-only` only fully free cores are taken. `None` means "nothing better than
//! kubelet's algorithm": the policy then runs kubelet's algorithm, and it also retries with
//! kubelet's algorithm whenever a best-fit result fails one of its checks, so best fit never
//! refuses a request kubelet's algorithm would grant.

use std::fmt;
use std::str::FromStr;

use super::index::TopologyIndex;
use super::options::{PolicyOptions, DISTRIBUTE_CPUS_ACROSS_CORES, DISTRIBUTE_CPUS_ACROSS_NUMA};
use crate::cpuset::CpuSet;
use crate::topology::CoreType;

/// Which algorithm picks a container's exclusive CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// kubelet's `takeByTopology`, reproduced exactly (the default).
    #[default]
    Kubelet,
    /// cpusetd's best fit ([`BestFit`]), falling back to kubelet's algorithm.
    BestFit,
}

/// The placement names, as `--placement` takes them.
pub const PLACEMENT_NAMES: [&str; 2] = ["kubelet", "best-fit"];

/// Why a placement name or combination was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("unknown placement {name:?}: expected kubelet or best-fit")]
    Unknown { name: String },
    #[error(
        "placement best-fit packs each container into the tightest cache, NUMA node or socket; \
         it cannot be used with policy option {option}, which spreads cpus"
    )]
    SpreadingOption { option: &'static str },
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Kubelet => PLACEMENT_NAMES[0],
            Placement::BestFit => PLACEMENT_NAMES[1],
        }
    }

    /// Best fit packs; the options that ask kubelet to spread contradict it and are refused
    /// rather than silently ignored.
    pub fn check_options(self, options: &PolicyOptions) -> Result<(), PlacementError> {
        if self == Placement::Kubelet {
            return Ok(());
        }
        let spreading = [
            (
                options.distribute_cpus_across_numa,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
            ),
            (
                options.distribute_cpus_across_cores,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
        ];
        match spreading.into_iter().find(|(on, _)| *on) {
            Some((_, option)) => Err(PlacementError::SpreadingOption { option }),
            None => Ok(()),
        }
    }
}

impl FromStr for Placement {
    type Err = PlacementError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "kubelet" => Ok(Placement::Kubelet),
            "best-fit" => Ok(Placement::BestFit),
            _ => Err(PlacementError::Unknown {
                name: text.to_string(),
            }),
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

const NONE: u32 = u32::MAX;

/// Free CPUs of a core's socket, NUMA node, outer and inner of die and cache, then the core's
/// table index: cores sort fullest block first.
type Fullness = (usize, usize, usize, usize, usize);

/// The domain tables best fit walks, built once per topology next to the [`TopologyIndex`].
#[derive(Debug, Clone)]
pub struct BestFit {
    /// Table indices of each CPU's uncore cache, NUMA node and socket, by CPU id (`NONE` for
    /// ids outside the topology).
    cpu_uncore: Vec<u32>,
    cpu_numa: Vec<u32>,
    cpu_socket: Vec<u32>,
    /// The NUMA node of each uncore cache (of its lowest CPU), and whether all of the cache
    /// lies in that node.
    uncore_numa: Vec<usize>,
    uncore_in_one_numa: Vec<bool>,
    /// The socket of each NUMA node (of its lowest CPU).
    numa_socket: Vec<usize>,
    /// Table index of each CPU's die (a die is a socket and a die id together), the NUMA
    /// node of each die and whether all of the die lies in it. Empty where no socket has
    /// several dies: the die levels are then left out.
    cpu_die: Vec<u32>,
    die_numa: Vec<usize>,
    die_in_one_numa: Vec<bool>,
    /// Threads per core (kubelet's `CPUsPerCore`, at least 1; on a hybrid part the largest
    /// core's thread count): the unit of "whole cores".
    threads_per_core: usize,
    /// The tiers in the order they are tried ([`tiers`]).
    tiers: Vec<(Level, Fit)>,
    /// Dies lie inside caches and are smaller: the die comes before the cache, as the
    /// tighter domain, in the tiers and in the order cores are taken.
    die_first: bool,
}

/// Free CPUs of one domain: all of them, and those on fully free cores.
#[derive(Debug, Clone, Copy, Default)]
struct Free {
    cpus: usize,
    whole: usize,
}

/// The free counts of every domain for one request.
#[derive(Debug)]
struct FreeMap {
    core_threads: Vec<u16>,
    uncore: Vec<Free>,
    die: Vec<Free>,
    numa: Vec<Free>,
    socket: Vec<Free>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// Uncore caches lying inside one NUMA node.
    CacheInNuma,
    /// Dies lying inside one NUMA node.
    DieInNuma,
    Numa,
    /// Uncore caches spanning NUMA nodes (sub-NUMA clustering).
    CacheAcrossNuma,
    /// Dies spanning NUMA nodes.
    DieAcrossNuma,
    Socket,
    Machine,
}

/// How well a domain holds a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// The even part on fully free cores, an odd remainder on threads of half-used cores: no
    /// core is newly split.
    Clean,
    /// The even part on fully free cores (an odd remainder may split one more core).
    WholeCores,
    /// Enough free CPUs.
    Any,
}

/// Tiers in order: NUMA alignment first, then whole cores, then cache (and die) alignment;
/// socket alignment last (it is the least of them, and the machine-wide pick fills the fullest
/// sockets first anyway). Without dies:
///
/// cache clean, cache whole, NUMA clean, NUMA whole, cache any, NUMA any, spanning cache
/// clean and whole, socket clean and whole, machine clean and whole, spanning cache any,
/// socket any, machine any.
///
/// Dies (where a socket has several) come next to caches, the smaller of the two first:
/// a die inside one NUMA node beside a cache inside one, a die spanning nodes beside a cache
/// spanning them.
fn tiers(dies: bool, die_first: bool) -> Vec<(Level, Fit)> {
    let pair = |cache: Level, die: Level| match (dies, die_first) {
        (false, _) => vec![cache],
        (true, false) => vec![cache, die],
        (true, true) => vec![die, cache],
    };
    let inside = pair(Level::CacheInNuma, Level::DieInNuma);
    let across = pair(Level::CacheAcrossNuma, Level::DieAcrossNuma);
    let fits = |levels: &[Level], fits: &[Fit]| -> Vec<(Level, Fit)> {
        levels
            .iter()
            .flat_map(|&l| fits.iter().map(move |&f| (l, f)))
            .collect()
    };
    let tight = [Fit::Clean, Fit::WholeCores];
    let mut out = fits(&inside, &tight);
    out.extend(fits(&[Level::Numa], &tight));
    out.extend(fits(&inside, &[Fit::Any]));
    out.push((Level::Numa, Fit::Any));
    out.extend(fits(&across, &tight));
    out.extend(fits(&[Level::Socket, Level::Machine], &tight));
    out.extend(fits(&across, &[Fit::Any]));
    out.extend(fits(&[Level::Socket, Level::Machine], &[Fit::Any]));
    out
}

fn table_of_cpus(max_id: usize, domains: &[CpuSet]) -> Vec<u32> {
    let mut of_cpu = vec![NONE; max_id];
    for (domain, cpus) in domains.iter().enumerate() {
        for cpu in cpus {
            of_cpu[cpu as usize] = domain as u32;
        }
    }
    of_cpu
}

/// For each group of CPUs (uncore caches, dies): the NUMA node of its first CPU, and whether
/// the whole group lies in that node.
fn numa_of_groups(
    groups: &[CpuSet],
    cpu_numa: &[u32],
    numas: &[CpuSet],
) -> (Vec<usize>, Vec<bool>) {
    let numa: Vec<usize> = groups
        .iter()
        .map(|cpus| {
            cpus.first()
                .map_or(0, |cpu| cpu_numa[cpu as usize] as usize)
        })
        .collect();
    let in_one = groups
        .iter()
        .zip(&numa)
        .map(|(cpus, &numa)| cpus.is_subset(&numas[numa]))
        .collect();
    (numa, in_one)
}

impl BestFit {
    pub fn new(index: &TopologyIndex) -> Self {
        let max_id = index.all_cpus().last().map_or(0, |id| id as usize + 1);
        let cpu_uncore = table_of_cpus(max_id, &index.uncore_caches.cpus);
        let cpu_numa = table_of_cpus(max_id, &index.numa_nodes.cpus);
        let cpu_socket = table_of_cpus(max_id, &index.sockets.cpus);
        let parent = |cpus: &CpuSet, of_cpu: &[u32]| {
            cpus.first().map_or(0, |cpu| of_cpu[cpu as usize] as usize)
        };
        let numas = &index.numa_nodes.cpus;
        let (uncore_numa, uncore_in_one_numa) =
            numa_of_groups(&index.uncore_caches.cpus, &cpu_numa, numas);
        let numa_socket = index
            .numa_nodes
            .cpus
            .iter()
            .map(|cpus| parent(cpus, &cpu_socket))
            .collect();
        let has_dies = index.dies.len() > index.sockets.len();
        let dies: &[CpuSet] = if has_dies { &index.dies } else { &[] };
        let cpu_die = if has_dies {
            table_of_cpus(max_id, dies)
        } else {
            Vec::new()
        };
        let (die_numa, die_in_one_numa) = numa_of_groups(dies, &cpu_numa, numas);
        // Dies are the tighter domain when each lies in its cache and some is smaller.
        let cache_of = |die: &CpuSet| &index.uncore_caches.cpus[parent(die, &cpu_uncore)];
        let die_first = has_dies
            && dies.iter().all(|d| d.is_subset(cache_of(d)))
            && dies.iter().any(|d| d.len() < cache_of(d).len());
        let threads_per_core = if index.has_heterogeneous_cores() {
            index.max_core_threads()
        } else {
            index.cpus_per_core()
        };
        BestFit {
            cpu_uncore,
            cpu_numa,
            cpu_socket,
            uncore_numa,
            uncore_in_one_numa,
            numa_socket,
            cpu_die,
            die_numa,
            die_in_one_numa,
            threads_per_core: threads_per_core.max(1),
            tiers: tiers(has_dies, die_first),
            die_first,
        }
    }

    fn is_whole(index: &TopologyIndex, map: &FreeMap, core: usize) -> bool {
        usize::from(map.core_threads[core]) == index.whole_core_size(core)
    }

    fn free_map(&self, index: &TopologyIndex, free: &CpuSet) -> FreeMap {
        let mut map = FreeMap {
            core_threads: vec![0; index.cores.len()],
            uncore: vec![Free::default(); index.uncore_caches.len()],
            die: vec![Free::default(); self.die_numa.len()],
            numa: vec![Free::default(); index.numa_nodes.len()],
            socket: vec![Free::default(); index.sockets.len()],
        };
        for cpu in free {
            if let Some(core) = index.core_index_of(cpu) {
                map.core_threads[core] = map.core_threads[core].saturating_add(1);
            }
        }
        for cpu in free {
            let whole = index
                .core_index_of(cpu)
                .is_some_and(|core| Self::is_whole(index, &map, core));
            let id = cpu as usize;
            for (table, counts) in [
                (&self.cpu_uncore, &mut map.uncore),
                (&self.cpu_die, &mut map.die),
                (&self.cpu_numa, &mut map.numa),
                (&self.cpu_socket, &mut map.socket),
            ] {
                if let Some(free) = table.get(id).and_then(|&d| counts.get_mut(d as usize)) {
                    free.cpus += 1;
                    free.whole += usize::from(whole);
                }
            }
        }
        map
    }

    /// `count` CPUs of `available`, or `None` when best fit has nothing better to offer than
    /// kubelet's algorithm. `whole_cores_only`: take fully free cores only (`full-pcpus-only`).
    pub fn take(
        &self,
        index: &TopologyIndex,
        available: &CpuSet,
        count: usize,
        whole_cores_only: bool,
    ) -> Option<CpuSet> {
        if count == 0 {
            return Some(CpuSet::new());
        }
        let free = available.intersection(index.all_cpus());
        if free.len() < count {
            return None;
        }
        let map = self.free_map(index, &free);
        // CPUs that must come from whole cores for the request to be "whole cores": all of them
        // under full-pcpus-only, else all but the odd remainder.
        let remainder = if whole_cores_only {
            0
        } else {
            count % self.threads_per_core
        };
        let on_whole_cores = count - remainder;
        let fits = |free: &Free, fit: Fit| {
            free.cpus >= count
                && match fit {
                    Fit::Clean => {
                        free.whole >= on_whole_cores && free.cpus - free.whole >= remainder
                    }
                    Fit::WholeCores => free.whole >= on_whole_cores,
                    Fit::Any => true,
                }
        };
        for &(level, fit) in &self.tiers {
            // Without a remainder a whole-cores fit is a clean one; under full-pcpus-only only
            // whole cores will do.
            if (fit == Fit::WholeCores && remainder == 0) || (whole_cores_only && fit == Fit::Any) {
                continue;
            }
            let domain_cpus = match level {
                Level::Machine => {
                    let all = Free {
                        cpus: free.len(),
                        whole: map.socket.iter().map(|s| s.whole).sum(),
                    };
                    fits(&all, fit).then(|| free.clone())
                }
                _ => self
                    .tightest(index, &map, level, |f| fits(f, fit))
                    .map(|cpus| cpus.intersection(&free)),
            };
            let Some(domain_free) = domain_cpus else {
                continue;
            };
            if let Some(cpus) = self.pick(index, &map, &domain_free, count, whole_cores_only) {
                return Some(cpus);
            }
        }
        None
    }

    /// [`Self::take`] from the `core_type` cores of a hybrid part first: where the free CPUs of
    /// that type hold the request, from them alone; otherwise from every free CPU.
    pub fn take_preferring(
        &self,
        index: &TopologyIndex,
        available: &CpuSet,
        count: usize,
        whole_cores_only: bool,
        core_type: CoreType,
    ) -> Option<CpuSet> {
        let preferred = index.core_types.of(core_type);
        if !preferred.is_empty() {
            let within = available.intersection(preferred);
            if within.len() >= count {
                if let Some(cpus) = self.take(index, &within, count, whole_cores_only) {
                    return Some(cpus);
                }
            }
        }
        self.take(index, available, count, whole_cores_only)
    }

    /// The CPUs of the domain of `level` that fits most tightly: fewest free CPUs, then fewest
    /// free in its NUMA node, then in its socket, then the lowest table index (lowest id).
    fn tightest<'a>(
        &self,
        index: &'a TopologyIndex,
        map: &FreeMap,
        level: Level,
        fits: impl Fn(&Free) -> bool,
    ) -> Option<&'a CpuSet> {
        let numa_key = |numa: usize| {
            let socket = self.numa_socket[numa];
            (map.numa[numa].cpus, map.socket[socket].cpus)
        };
        match level {
            Level::CacheInNuma | Level::CacheAcrossNuma => {
                let inside = level == Level::CacheInNuma;
                (0..map.uncore.len())
                    .filter(|&u| self.uncore_in_one_numa[u] == inside && fits(&map.uncore[u]))
                    .min_by_key(|&u| {
                        let (numa, socket) = numa_key(self.uncore_numa[u]);
                        (map.uncore[u].cpus, numa, socket, u)
                    })
                    .map(|u| &index.uncore_caches.cpus[u])
            }
            Level::DieInNuma | Level::DieAcrossNuma => {
                let inside = level == Level::DieInNuma;
                (0..map.die.len())
                    .filter(|&d| self.die_in_one_numa[d] == inside && fits(&map.die[d]))
                    .min_by_key(|&d| {
                        let (numa, socket) = numa_key(self.die_numa[d]);
                        (map.die[d].cpus, numa, socket, d)
                    })
                    .map(|d| &index.dies[d])
            }
            Level::Numa => (0..map.numa.len())
                .filter(|&n| fits(&map.numa[n]))
                .min_by_key(|&n| (numa_key(n), n))
                .map(|n| &index.numa_nodes.cpus[n]),
            Level::Socket => (0..map.socket.len())
                .filter(|&s| fits(&map.socket[s]))
                .min_by_key(|&s| (map.socket[s].cpus, s))
                .map(|s| &index.sockets.cpus[s]),
            Level::Machine => None,
        }
    }

    /// The cores with free CPUs in `domain_free`, those in the fullest socket, NUMA node, die
    /// and cache first (die and cache in the order they nest).
    fn cores_fullest_first(
        &self,
        index: &TopologyIndex,
        map: &FreeMap,
        domain_free: &CpuSet,
    ) -> Vec<usize> {
        // (fullness key, core)
        let mut cores: Vec<(Fullness, usize)> = Vec::new();
        let mut seen = vec![false; index.cores.len()];
        for cpu in domain_free {
            let Some(core) = index.core_index_of(cpu) else {
                continue;
            };
            if std::mem::replace(&mut seen[core], true) {
                continue;
            }
            let id = cpu as usize;
            let free_of = |table: &[u32], counts: &[Free]| {
                table
                    .get(id)
                    .and_then(|&d| counts.get(d as usize))
                    .map_or(0, |f| f.cpus)
            };
            let (die, cache) = (
                free_of(&self.cpu_die, &map.die),
                free_of(&self.cpu_uncore, &map.uncore),
            );
            let (outer, inner) = if self.die_first {
                (cache, die)
            } else {
                (die, cache)
            };
            let key = (
                free_of(&self.cpu_socket, &map.socket),
                free_of(&self.cpu_numa, &map.numa),
                outer,
                inner,
                core,
            );
            cores.push((key, core));
        }
        cores.sort_unstable();
        cores.into_iter().map(|(_, core)| core).collect()
    }

    /// `count` CPUs of `domain_free` (the free CPUs of the chosen domain): an odd remainder from
    /// half-used cores, then whole cores, then anything, each in "fullest block first" order.
    fn pick(
        &self,
        index: &TopologyIndex,
        map: &FreeMap,
        domain_free: &CpuSet,
        count: usize,
        whole_cores_only: bool,
    ) -> Option<CpuSet> {
        let (whole, mut partial): (Vec<usize>, Vec<usize>) = self
            .cores_fullest_first(index, map, domain_free)
            .into_iter()
            .partition(|&core| Self::is_whole(index, map, core));
        // Half-used cores with the fewest free threads first: they are used up first.
        partial.sort_by_key(|&core| map.core_threads[core]);

        let mut result = CpuSet::new();
        let mut need = count;
        let threads = |core: usize| index.cores.cpus[core].intersection(domain_free);
        let mut taken_whole = vec![false; whole.len()];
        if !whole_cores_only {
            let mut remainder = count % self.threads_per_core;
            for &core in &partial {
                if remainder == 0 {
                    break;
                }
                for cpu in threads(core).iter().take(remainder) {
                    result.insert(cpu);
                    remainder -= 1;
                    need -= 1;
                }
            }
        }
        for (i, &core) in whole.iter().enumerate() {
            let cpus = threads(core);
            if cpus.len() <= need {
                need -= cpus.len();
                result.extend_from(&cpus);
                taken_whole[i] = true;
            }
            if need == 0 {
                return Some(result);
            }
        }
        if whole_cores_only {
            return None;
        }
        let rest = partial.iter().copied().chain(
            whole
                .iter()
                .zip(&taken_whole)
                .filter(|(_, &taken)| !taken)
                .map(|(&core, _)| core),
        );
        for core in rest {
            for cpu in threads(core).iter() {
                if need == 0 {
                    return Some(result);
                }
                if result.contains(cpu) {
                    continue;
                }
                result.insert(cpu);
                need -= 1;
            }
        }
        (need == 0).then_some(result)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::allocator::{ReservedCpus, StaticPolicy};
    use crate::topology::{RegularShape, Topology};

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    fn shape(numa: u32, caches: u32, cores: u32, threads: u32) -> Topology {
        Topology::regular(RegularShape {
            sockets: 1,
            numa_nodes_per_socket: numa,
            uncore_caches_per_numa_node: caches,
            cores_per_uncore_cache: cores,
            threads_per_core: threads,
        })
        .unwrap()
    }

    fn best_fit(topo: &Topology, available: &CpuSet, count: usize) -> Option<CpuSet> {
        let index = TopologyIndex::new(topo);
        BestFit::new(&index).take(&index, available, count, false)
    }

    fn policies(topo: &Topology, options: &str, reserved: usize) -> (StaticPolicy, StaticPolicy) {
        let kubelet = StaticPolicy::new(
            topo,
            PolicyOptions::parse(options).unwrap(),
            ReservedCpus::Count(reserved),
            false,
        )
        .unwrap();
        let best_fit = kubelet.clone().with_placement(Placement::BestFit).unwrap();
        (kubelet, best_fit)
    }

    /// One socket, 4 NUMA nodes of 4 cores, 2 threads: core c is CPUs c and c + 16, NUMA node
    /// k holds cores 4k..4k+3. Free: node 0 whole (8), node 1 three cores (6), node 2 one core
    /// (2), node 3 nothing.
    fn four_numa_nodes() -> (Topology, CpuSet) {
        (shape(4, 1, 4, 2), set("0-3,16-19,4-6,20-22,8,24"))
    }

    #[test]
    fn takes_the_numa_node_that_fits_most_tightly() {
        let (topo, free) = four_numa_nodes();
        assert_eq!(best_fit(&topo, &free, 2).unwrap(), set("8,24"));
        assert_eq!(best_fit(&topo, &free, 4).unwrap(), set("4-5,20-21"));
        assert_eq!(best_fit(&topo, &free, 6).unwrap(), set("4-6,20-22"));
        assert_eq!(best_fit(&topo, &free, 7).unwrap(), set("0-3,16-18"));
        // Nothing holds 9 in one node: the fullest nodes are used up first.
        let nine = best_fit(&topo, &free, 9).unwrap();
        assert_eq!(nine, set("4-6,8,20-22,24").union(&set("0")));
    }

    #[test]
    fn a_request_kubelet_would_split_over_numa_nodes_stays_in_one() {
        // Node 1 has two free cores, node 0 four: kubelet fills node 1 first and spills over.
        let topo = shape(2, 1, 4, 2);
        let free = set("0-3,8-11,4-5,12-13");
        let (kubelet, best) = policies(&topo, "", 0);
        let pool = free.clone();
        let by_kubelet = kubelet.allocate(6, &pool, None, &CpuSet::new()).unwrap();
        assert!(!by_kubelet.is_subset(&set("0-3,8-11")), "{by_kubelet}");
        let by_best_fit = best.allocate(6, &pool, None, &CpuSet::new()).unwrap();
        assert_eq!(by_best_fit, set("0-2,8-10"));
    }

    /// One NUMA node, 3 L3 caches of 4 cores, 2 threads: core c is CPUs c and c + 12, cache k
    /// holds cores 4k..4k+3. Free: cache 0 whole (8), cache 1 three cores (6), cache 2 two
    /// cores and one thread of a third (5).
    fn three_caches() -> (Topology, CpuSet) {
        (shape(1, 3, 4, 2), set("0-3,12-15,4-6,16-18,8-10,20-21"))
    }

    #[test]
    fn takes_the_cache_that_fits_most_tightly_and_whole_cores_first() {
        let (topo, free) = three_caches();
        // Two whole cores of cache 2, not its half-used core.
        assert_eq!(best_fit(&topo, &free, 4).unwrap(), set("8-9,20-21"));
        // An odd request takes the half-used core's thread first.
        assert_eq!(best_fit(&topo, &free, 1).unwrap(), set("10"));
        assert_eq!(best_fit(&topo, &free, 5).unwrap(), set("8-10,20-21"));
        assert_eq!(best_fit(&topo, &free, 3).unwrap(), set("8,10,20"));
        // Cache 2 holds 5 cpus but only two whole cores: 6 go to cache 1.
        assert_eq!(best_fit(&topo, &free, 6).unwrap(), set("4-6,16-18"));
        assert_eq!(best_fit(&topo, &free, 8).unwrap(), set("0-3,12-15"));
    }

    #[test]
    fn whole_cores_come_before_the_tightest_cache() {
        // Cache 0: four half-used cores (4 free); cache 1: all free. Two cpus: a whole core of
        // cache 1 rather than two half cores of cache 0.
        let topo = shape(1, 2, 4, 2);
        let free = set("0-3,4-7,12-15");
        assert_eq!(best_fit(&topo, &free, 2).unwrap(), set("4,12"));
        // One cpu: a half-used core's thread.
        assert_eq!(best_fit(&topo, &free, 1).unwrap(), set("0"));
    }

    #[test]
    fn an_odd_request_pairs_with_a_half_used_core_before_breaking_a_new_one() {
        // Cache 0: cores 0 and 1 free (4 cpus). Cache 1: cores 4 and 5 free and one thread of
        // core 6 (5 cpus). Three cpus: the tighter cache 0 would break a core; cache 1 holds
        // them with the half-used core's thread.
        let topo = shape(1, 2, 4, 2);
        let free = set("0-1,8-9,4-6,12-13");
        assert_eq!(best_fit(&topo, &free, 3).unwrap(), set("4,6,12"));
        // Four cpus: no remainder, the tightest cache wins.
        assert_eq!(best_fit(&topo, &free, 4).unwrap(), set("0-1,8-9"));
    }

    #[test]
    fn full_pcpus_only_gets_whole_cores() {
        // Cache 0 has 6 free cpus but only one whole core; cache 1 has two whole cores.
        let topo = shape(1, 2, 4, 2);
        let (_, best) = policies(&topo, "full-pcpus-only=true", 0);
        let pool = set("0-3,8,4-5,12-13");
        let cpus = best.allocate(4, &pool, None, &CpuSet::new()).unwrap();
        assert_eq!(cpus, set("4-5,12-13"));
    }

    #[test]
    fn reserved_cpus_are_never_given() {
        let topo = shape(2, 2, 4, 2);
        let (kubelet, best) = policies(&topo, "", 4);
        let reserved = kubelet.reserved().clone();
        assert_eq!(best.reserved(), &reserved);
        let pool = best.initial_shared_pool();
        for n in 1..=pool.len() - reserved.len() {
            if let Ok(cpus) = best.allocate(n, &pool, None, &CpuSet::new()) {
                assert!(cpus.is_disjoint(&reserved), "{n}: {cpus}");
                assert_eq!(cpus.len(), n);
            }
        }
    }

    #[test]
    fn spreading_options_and_unknown_names_are_refused() {
        let topo = shape(1, 1, 4, 2);
        for option in [DISTRIBUTE_CPUS_ACROSS_NUMA, DISTRIBUTE_CPUS_ACROSS_CORES] {
            let (kubelet, _) = {
                let options = PolicyOptions::parse(&format!("{option}=true")).unwrap();
                let p = StaticPolicy::new(&topo, options, ReservedCpus::Count(1), false).unwrap();
                (p, ())
            };
            let err = kubelet.with_placement(Placement::BestFit).unwrap_err();
            assert_eq!(err, PlacementError::SpreadingOption { option });
            assert!(err.to_string().contains(option), "{err}");
        }
        assert_eq!("best-fit".parse::<Placement>(), Ok(Placement::BestFit));
        assert_eq!("kubelet".parse::<Placement>(), Ok(Placement::Kubelet));
        let err = "bestfit".parse::<Placement>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown placement \"bestfit\": expected kubelet or best-fit"
        );
        for name in PLACEMENT_NAMES {
            assert_eq!(name.parse::<Placement>().unwrap().to_string(), name);
        }
    }

    fn any_topology() -> impl Strategy<Value = Topology> {
        (
            1u32..=2,
            1u32..=2,
            1u32..=3,
            1u32..=4,
            prop_oneof![Just(1u32), Just(2), Just(4)],
        )
            .prop_map(|(sockets, numa, caches, cores, threads)| {
                Topology::regular(RegularShape {
                    sockets,
                    numa_nodes_per_socket: numa,
                    uncore_caches_per_numa_node: caches,
                    cores_per_uncore_cache: cores,
                    threads_per_core: threads,
                })
                .unwrap()
            })
    }

    /// Options best fit accepts (the spreading ones are refused).
    fn packing_options() -> impl Strategy<Value = PolicyOptions> {
        any::<[bool; 3]>().prop_map(|f| PolicyOptions {
            full_pcpus_only: f[0],
            strict_cpu_reservation: f[1],
            prefer_align_cpus_by_uncorecache: f[2],
            ..PolicyOptions::default()
        })
    }

    /// An arrival (`Some(request)`) or the departure of the `n`-th live container.
    fn trace() -> impl Strategy<Value = Vec<(Option<usize>, usize)>> {
        proptest::collection::vec(
            (proptest::option::weighted(0.6, 1usize..=12), any::<usize>()),
            1..60,
        )
    }

    /// CPUs of `free` on cores all of whose threads are in `free`, per NUMA node.
    fn whole_core_cpus_per_node(topo: &Topology, free: &CpuSet) -> Vec<CpuSet> {
        let whole = TopologyIndex::new(topo).whole_core_cpus(free);
        topo.memory_nodes()
            .iter()
            .map(|n| {
                topo.numa_cpus(&[n].into_iter().collect())
                    .intersection(&whole)
            })
            .collect()
    }

    proptest! {
        /// Issue 28, item 5: whenever one NUMA node holds a request that is a whole number of
        /// cores on its fully free cores, best fit gives it NUMA-aligned *and* on whole cores,
        /// on random traces (the churn bench's misses, as a property).
        #[test]
        fn numa_alignment_and_whole_cores_together_whenever_both_can_be_had(
            topo in any_topology(),
            options in packing_options(),
            reserved in 1usize..=2,
            events in trace(),
        ) {
            let Ok(kubelet) = StaticPolicy::new(
                &topo, options, ReservedCpus::Count(reserved), false,
            ) else {
                return Ok(());
            };
            let best = kubelet.with_placement(Placement::BestFit).unwrap();
            let threads = TopologyIndex::new(&topo).cpus_per_core().max(1);
            let mut pool = best.initial_shared_pool();
            let mut live: Vec<CpuSet> = Vec::new();
            let none = CpuSet::new();
            for (arrival, pick) in events {
                let Some(n) = arrival else {
                    if !live.is_empty() {
                        pool.extend_from(&live.swap_remove(pick % live.len()));
                    }
                    continue;
                };
                let free = best.allocatable(&pool);
                let Ok(cpus) = best.allocate(n, &pool, None, &none) else {
                    continue;
                };
                let both = n % threads == 0
                    && whole_core_cpus_per_node(&topo, &free).iter().any(|w| w.len() >= n);
                if both {
                    let aligned = whole_core_cpus_per_node(&topo, &free)
                        .iter()
                        .any(|w| cpus.is_subset(w));
                    prop_assert!(
                        aligned,
                        "{} cpus from {}: {} is not on whole cores of one NUMA node",
                        n, free, cpus
                    );
                }
                pool.remove_all(&cpus);
                live.push(cpus);
            }
        }
    }

    /// `sockets` sockets of `dies` dies of `cores` cores of 2 threads (threads numbered last),
    /// one NUMA node and one L3 per socket; die ids restart in every socket (Linux 6.1) or run
    /// across the machine (6.12).
    fn with_dies(sockets: u32, dies: u32, cores: u32, global_ids: bool) -> Topology {
        let all = sockets * dies * cores;
        let mut cpus = Vec::new();
        for core in 0..all {
            let socket = core / (dies * cores);
            let local = core / cores % dies;
            for thread in 0..2 {
                cpus.push(crate::topology::CpuInfo {
                    id: core + thread * all,
                    socket,
                    die: if global_ids {
                        socket * dies + local
                    } else {
                        local
                    },
                    numa: socket,
                    core,
                    uncore: socket,
                    cluster: None,
                });
            }
        }
        Topology::new(cpus, CpuSet::new(), CpuSet::new(), (0..sockets).collect()).unwrap()
    }

    /// `p` performance cores of 2 threads (siblings adjacent, cpus 0..2p) and `e` efficient
    /// cores of one thread after them, one socket, cache and node.
    fn hybrid(p: u32, e: u32) -> Topology {
        let mut cpus = Vec::new();
        for id in 0..2 * p + e {
            let core = if id < 2 * p { id / 2 * 2 } else { id };
            cpus.push(crate::topology::CpuInfo {
                id,
                socket: 0,
                die: 0,
                numa: 0,
                core,
                uncore: 0,
                cluster: None,
            });
        }
        let topo = Topology::new(cpus, CpuSet::new(), CpuSet::new(), set("0")).unwrap();
        topo.with_core_types(crate::topology::CoreTypes {
            performance: CpuSet::range(0, 2 * p - 1),
            efficient: CpuSet::range(2 * p, 2 * p + e - 1),
        })
    }

    #[test]
    fn a_request_stays_in_one_die_whichever_way_dies_are_numbered() {
        for global in [false, true] {
            // 2 sockets x 2 dies x 2 cores: die (0,0) = cores 0-1 (0-1,8-9), die (0,1) =
            // cores 2-3 (2-3,10-11). Cpu 0 used: 4 cpus fit on die (0,1) only.
            let topo = with_dies(2, 2, 2, global);
            let free = set("1-7,8-15");
            assert_eq!(
                best_fit(&topo, &free, 4).unwrap(),
                set("2-3,10-11"),
                "{global}"
            );
            // Two cpus: the half-used die's whole core, not the other die's.
            assert_eq!(best_fit(&topo, &free, 2).unwrap(), set("1,9"), "{global}");
        }
    }

    #[test]
    fn hybrid_parts_take_performance_cores_first_unless_asked() {
        let topo = hybrid(4, 4);
        let index = TopologyIndex::new(&topo);
        let fit = BestFit::new(&index);
        let take = |free: &str, n: usize, t: CoreType| {
            fit.take_preferring(&index, &set(free), n, false, t)
                .unwrap()
        };
        assert_eq!(take("0-11", 1, CoreType::Performance), set("0"));
        assert_eq!(take("0-11", 3, CoreType::Performance), set("0-2"));
        assert_eq!(take("1-11", 3, CoreType::Performance), set("1-3"));
        assert_eq!(take("0-11", 2, CoreType::Efficient), set("8-9"));
        // The preferred type cannot hold it: from every free cpu.
        assert_eq!(take("0-1,8-11", 6, CoreType::Performance).len(), 6);
        assert_eq!(take("0-11", 5, CoreType::Efficient).len(), 5);
    }

    proptest! {
        /// On random hybrid parts and traces: whenever the free cpus of the asked core type
        /// hold the request, best fit gives cpus of that type only.
        #[test]
        fn best_fit_keeps_to_the_asked_core_type_whenever_it_can(
            p in 1u32..=4,
            e in 1u32..=8,
            efficient in any::<bool>(),
            events in trace(),
        ) {
            let topo = hybrid(p, e);
            let core_type = if efficient { CoreType::Efficient } else { CoreType::Performance };
            let wanted = topo.core_types().of(core_type).clone();
            let best = StaticPolicy::new(&topo, PolicyOptions::default(), ReservedCpus::Count(1), false)
                .unwrap()
                .with_placement(Placement::BestFit)
                .unwrap();
            let mut pool = best.initial_shared_pool();
            let mut live: Vec<CpuSet> = Vec::new();
            let none = CpuSet::new();
            for (arrival, pick) in events {
                let Some(n) = arrival else {
                    if !live.is_empty() {
                        pool.extend_from(&live.swap_remove(pick % live.len()));
                    }
                    continue;
                };
                let free = best.allocatable(&pool);
                let Ok(cpus) = best.allocate_preferring(n, &pool, None, &none, core_type) else {
                    continue;
                };
                prop_assert_eq!(cpus.len(), n);
                if free.intersection_len(&wanted) >= n {
                    prop_assert!(cpus.is_subset(&wanted), "{} from {}: {}", n, free, cpus);
                }
                pool.remove_all(&cpus);
                live.push(cpus);
            }
        }

        /// On random multi-die machines: whenever one die holds an even request on its whole
        /// cores, best fit gives whole cores of one die.
        #[test]
        fn best_fit_keeps_to_one_die_on_whole_cores_whenever_it_can(
            sockets in 1u32..=2,
            dies in 2u32..=3,
            cores in 1u32..=4,
            global in any::<bool>(),
            events in trace(),
        ) {
            let topo = with_dies(sockets, dies, cores, global);
            let index = TopologyIndex::new(&topo);
            let best = StaticPolicy::new(&topo, PolicyOptions::default(), ReservedCpus::Count(1), false)
                .unwrap()
                .with_placement(Placement::BestFit)
                .unwrap();
            let mut pool = best.initial_shared_pool();
            let mut live: Vec<CpuSet> = Vec::new();
            let none = CpuSet::new();
            for (arrival, pick) in events {
                let Some(n) = arrival else {
                    if !live.is_empty() {
                        pool.extend_from(&live.swap_remove(pick % live.len()));
                    }
                    continue;
                };
                let free = best.allocatable(&pool);
                let Ok(cpus) = best.allocate(n, &pool, None, &none) else {
                    continue;
                };
                let whole = index.whole_core_cpus(&free);
                let per_die: Vec<CpuSet> =
                    index.dies.iter().map(|d| d.intersection(&whole)).collect();
                if n % 2 == 0 && per_die.iter().any(|d| d.len() >= n) {
                    prop_assert!(
                        per_die.iter().any(|d| cpus.is_subset(d)),
                        "{} from {}: {}", n, free, cpus
                    );
                }
                pool.remove_all(&cpus);
                live.push(cpus);
            }
        }
    }

    proptest! {
        /// Replays a random trace under best fit; at every arrival kubelet's algorithm is asked
        /// too, on the same pool: whatever it grants, best fit grants, with exactly the count,
        /// from free non-reserved cpus, in one NUMA node whenever one node could hold it.
        #[test]
        fn best_fit_grants_whatever_kubelet_grants_on_random_traces(
            topo in any_topology(),
            options in packing_options(),
            reserved in 1usize..=2,
            events in trace(),
        ) {
            let Ok(kubelet) =
                StaticPolicy::new(&topo, options, ReservedCpus::Count(reserved), false)
            else {
                return Ok(());
            };
            let best = kubelet.clone().with_placement(Placement::BestFit).unwrap();
            let numa_nodes: Vec<CpuSet> = topo
                .memory_nodes()
                .iter()
                .map(|n| topo.numa_cpus(&[n].into_iter().collect()))
                .collect();
            let mut pool = best.initial_shared_pool();
            let mut live: Vec<CpuSet> = Vec::new();
            let none = CpuSet::new();
            for (arrival, pick) in events {
                let Some(n) = arrival else {
                    if !live.is_empty() {
                        let cpus = live.swap_remove(pick % live.len());
                        pool.extend_from(&cpus);
                    }
                    continue;
                };
                let free = best.allocatable(&pool);
                let by_kubelet = kubelet.allocate(n, &pool, None, &none);
                match best.allocate(n, &pool, None, &none) {
                    Ok(cpus) => {
                        prop_assert_eq!(cpus.len(), n);
                        prop_assert!(cpus.is_subset(&free), "{} not in {}", cpus, free);
                        prop_assert!(cpus.is_disjoint(best.reserved()));
                        let one_node_fits = numa_nodes.iter().any(|d| d.intersection_len(&free) >= n);
                        let in_one_node = numa_nodes.iter().any(|d| cpus.is_subset(d));
                        prop_assert!(!one_node_fits || in_one_node, "{} for {} from {}", cpus, n, free);
                        if options.full_pcpus_only && by_kubelet.as_ref().is_ok_and(|k| {
                            topo.expand_to_cores(k) == *k
                        }) {
                            prop_assert_eq!(topo.expand_to_cores(&cpus), cpus.clone());
                        }
                        pool.remove_all(&cpus);
                        live.push(cpus);
                    }
                    Err(err) => prop_assert!(by_kubelet.is_err(), "kubelet grants, best fit: {}", err),
                }
            }
        }
    }
}
