//! [`TopologyIndex`]: the per-topology tables the allocator reads on every request, built once.
//!
//! kubelet answers questions such as "which cores of socket 1 still have a free CPU" by walking
//! its whole CPU map each time. Here every domain (NUMA node, socket, core, uncore cache) has its
//! CPUs precomputed as a [`CpuSet`], and every parent/child pair kubelet queries (sockets of a NUMA
//! node, cores of a socket, ...) is a list of children with the CPUs they share with the parent.
//! Counting free CPUs in a domain is then a bitmap AND + popcount.
//!
//! The relations are derived from the CPU records exactly as kubelet derives them, so fixture
//! oddities survive: a core id repeated on two sockets is one "core" spanning both, and a socket
//! spread over several NUMA nodes is listed under each of them.

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;
use crate::topology::{CoreTypes, Counters, CpuInfo, Topology};

/// One kind of domain: its ids ascending and the topology CPUs of each.
#[derive(Debug, Clone, Default)]
pub(crate) struct DomainTable {
    pub(crate) ids: Vec<u32>,
    pub(crate) cpus: Vec<CpuSet>,
}

impl DomainTable {
    fn build(cpus: &[CpuInfo], domain_of: fn(&CpuInfo) -> u32) -> Self {
        let mut by_id: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for cpu in cpus {
            by_id.entry(domain_of(cpu)).or_default().insert(cpu.id);
        }
        let (ids, cpus) = by_id.into_iter().unzip();
        DomainTable { ids, cpus }
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn position(&self, id: u32) -> Option<usize> {
        self.ids.binary_search(&id).ok()
    }
}

/// A child domain as seen from one parent: its table index and the CPUs it shares with the parent.
/// The child "is in" the parent for a set of available CPUs when `shared` meets that set.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) index: usize,
    pub(crate) shared: CpuSet,
}

/// `parent index -> children` for one parent/child pair of domain kinds.
fn members(
    cpus: &[CpuInfo],
    parents: &DomainTable,
    parent_of: fn(&CpuInfo) -> u32,
    children: &DomainTable,
    child_of: fn(&CpuInfo) -> u32,
) -> Vec<Vec<Member>> {
    let mut shared: Vec<BTreeMap<usize, CpuSet>> = vec![BTreeMap::new(); parents.len()];
    for cpu in cpus {
        let (Some(parent), Some(child)) = (
            parents.position(parent_of(cpu)),
            children.position(child_of(cpu)),
        ) else {
            continue;
        };
        shared[parent].entry(child).or_default().insert(cpu.id);
    }
    shared
        .into_iter()
        .map(|children| {
            children
                .into_iter()
                .map(|(index, shared)| Member { index, shared })
                .collect()
        })
        .collect()
}

/// Precomputed view of a [`Topology`] for the allocator. Build it once per topology.
#[derive(Debug, Clone)]
pub struct TopologyIndex {
    pub(crate) all: CpuSet,
    pub(crate) counters: Counters,
    pub(crate) sockets: DomainTable,
    pub(crate) numa_nodes: DomainTable,
    pub(crate) cores: DomainTable,
    pub(crate) uncore_caches: DomainTable,
    pub(crate) numa_sockets: Vec<Vec<Member>>,
    pub(crate) socket_numa_nodes: Vec<Vec<Member>>,
    pub(crate) socket_cores: Vec<Vec<Member>>,
    pub(crate) numa_cores: Vec<Vec<Member>>,
    pub(crate) numa_uncore_caches: Vec<Vec<Member>>,
    /// Table index of each CPU's core, by CPU id (`usize::MAX` for ids not in the topology).
    core_of_cpu: Vec<usize>,
    heterogeneous_cores: bool,
    /// The CPUs of each die, a die being the pair (socket, die id): kernels number dies per
    /// package (6.1) or across the machine (6.12), so a die id alone names nothing. Ordered by
    /// (socket, die id). kubelet does not know dies; only best fit reads them.
    pub(crate) dies: Vec<CpuSet>,
    /// Performance and efficient CPUs of a hybrid part (empty elsewhere); only best fit reads
    /// them.
    pub(crate) core_types: CoreTypes,
    /// Where cores differ in thread count only because CPUs are offline (an SMT sibling taken
    /// down), the thread count of a whole core: a core with fewer online threads is a broken
    /// one, never a free whole core (else a request for two takes it and splits a free core).
    whole_core_threads: Option<usize>,
}

impl TopologyIndex {
    pub fn new(topology: &Topology) -> Self {
        let cpus = topology.cpus();
        let sockets = DomainTable::build(cpus, |c| c.socket);
        let numa_nodes = DomainTable::build(cpus, |c| c.numa);
        let cores = DomainTable::build(cpus, |c| c.core);
        let uncore_caches = DomainTable::build(cpus, |c| c.uncore);
        let numa_sockets = members(cpus, &numa_nodes, |c| c.numa, &sockets, |c| c.socket);
        let socket_numa_nodes = members(cpus, &sockets, |c| c.socket, &numa_nodes, |c| c.numa);
        let socket_cores = members(cpus, &sockets, |c| c.socket, &cores, |c| c.core);
        let numa_cores = members(cpus, &numa_nodes, |c| c.numa, &cores, |c| c.core);
        let numa_uncore_caches =
            members(cpus, &numa_nodes, |c| c.numa, &uncore_caches, |c| c.uncore);
        let max_id = topology.all_cpus().last().map_or(0, |id| id as usize + 1);
        let mut core_of_cpu = vec![usize::MAX; max_id];
        for cpu in cpus {
            if let Some(core) = cores.position(cpu.core) {
                core_of_cpu[cpu.id as usize] = core;
            }
        }
        let heterogeneous_cores = !topology.is_homogeneous();
        let mut dies: BTreeMap<(u32, u32), CpuSet> = BTreeMap::new();
        for cpu in cpus {
            dies.entry((cpu.socket, cpu.die))
                .or_default()
                .insert(cpu.id);
        }
        let whole_core_threads = (heterogeneous_cores && !topology.offline().is_empty())
            .then(|| cores.cpus.iter().map(CpuSet::len).max())
            .flatten();
        TopologyIndex {
            all: topology.all_cpus().clone(),
            counters: topology.counters(),
            sockets,
            numa_nodes,
            cores,
            uncore_caches,
            numa_sockets,
            socket_numa_nodes,
            socket_cores,
            numa_cores,
            numa_uncore_caches,
            core_of_cpu,
            heterogeneous_cores,
            dies: dies.into_values().collect(),
            core_types: topology.core_types().clone(),
            whole_core_threads,
        }
    }

    /// All CPUs of the topology.
    pub fn all_cpus(&self) -> &CpuSet {
        &self.all
    }

    /// kubelet's `CPUsPerCore()`: `NumCPUs / NumCores` from the counters, 0 without cores.
    pub fn cpus_per_core(&self) -> usize {
        checked_div(self.counters.num_cpus, self.counters.num_cores)
    }

    /// kubelet's `CPUsPerSocket()`: `NumCPUs / NumSockets` from the counters.
    pub fn cpus_per_socket(&self) -> usize {
        checked_div(self.counters.num_cpus, self.counters.num_sockets)
    }

    /// kubelet's `CPUsPerUncore()`: `NumCPUs / NumUncoreCache` from the counters.
    pub fn cpus_per_uncore_cache(&self) -> usize {
        checked_div(self.counters.num_cpus, self.counters.num_uncore_caches)
    }

    /// kubelet's level order: NUMA nodes before sockets when `NumSockets >= NumNUMANodes`.
    pub fn numa_first(&self) -> bool {
        self.counters.num_sockets >= self.counters.num_numa_nodes
    }

    /// True when cores have different thread counts (hybrid P/E-core parts). The allocator then
    /// tests cores against their own thread count instead of `cpus_per_core()`.
    pub fn has_heterogeneous_cores(&self) -> bool {
        self.heterogeneous_cores
    }

    /// The largest thread count of a core (1 without cores).
    pub(crate) fn max_core_threads(&self) -> usize {
        self.cores.cpus.iter().map(CpuSet::len).max().unwrap_or(1)
    }

    /// How many free threads make core `core` (a table index) a free whole core: its own
    /// thread count, or, where offline CPUs made cores uneven, the whole-core thread count.
    pub(crate) fn whole_core_size(&self, core: usize) -> usize {
        self.whole_core_threads
            .unwrap_or_else(|| self.cores.cpus[core].len())
    }

    /// Table index of the core holding `cpu`.
    pub(crate) fn core_index_of(&self, cpu: u32) -> Option<usize> {
        self.core_of_cpu
            .get(cpu as usize)
            .copied()
            .filter(|&core| core != usize::MAX)
    }

    /// Every thread of every core that has a thread in `cpus` (kubelet's `CPUsInCores` of the
    /// cores of `cpus`). CPUs outside the topology are ignored.
    pub fn expand_to_cores(&self, cpus: &CpuSet) -> CpuSet {
        let mut expanded = CpuSet::new();
        for cpu in cpus {
            if let Some(core) = self.core_index_of(cpu) {
                expanded.extend_from(&self.cores.cpus[core]);
            }
        }
        expanded
    }

    /// The CPUs of `cpus` whose whole core is in `cpus`.
    pub fn whole_core_cpus(&self, cpus: &CpuSet) -> CpuSet {
        let mut whole = CpuSet::new();
        for cpu in cpus {
            if let Some(core) = self.core_index_of(cpu) {
                if self.cores.cpus[core].is_subset(cpus) {
                    whole.insert(cpu);
                }
            }
        }
        whole
    }

    /// CPUs of the given NUMA node ids (unknown ids contribute nothing).
    pub fn numa_node_cpus(&self, nodes: &CpuSet) -> CpuSet {
        let mut cpus = CpuSet::new();
        for node in nodes {
            if let Some(index) = self.numa_nodes.position(node) {
                cpus.extend_from(&self.numa_nodes.cpus[index]);
            }
        }
        cpus
    }

    /// The NUMA node ids, ascending.
    pub fn numa_node_ids(&self) -> &[u32] {
        &self.numa_nodes.ids
    }

    /// How many sockets the given NUMA node ids touch.
    pub fn sockets_of_numa_nodes(&self, nodes: &CpuSet) -> usize {
        let mut sockets = std::collections::BTreeSet::new();
        for node in nodes {
            if let Some(index) = self.numa_nodes.position(node) {
                sockets.extend(self.numa_sockets[index].iter().map(|s| s.index));
            }
        }
        sockets.len()
    }

    /// The fewest sockets whose CPUs together reach `n` (0 when none do).
    pub fn min_sockets_for(&self, n: usize) -> usize {
        let mut sizes: Vec<usize> = self.sockets.cpus.iter().map(CpuSet::len).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut total = 0;
        for (i, size) in sizes.iter().enumerate() {
            total += size;
            if total >= n {
                return i + 1;
            }
        }
        0
    }

    /// CPUs of every socket that has a CPU on one of the given NUMA node ids.
    pub fn socket_cpus_of_numa_nodes(&self, nodes: &CpuSet) -> CpuSet {
        let mut cpus = CpuSet::new();
        for node in nodes {
            if let Some(index) = self.numa_nodes.position(node) {
                for socket in &self.numa_sockets[index] {
                    cpus.extend_from(&self.sockets.cpus[socket.index]);
                }
            }
        }
        cpus
    }

    /// The uncore cache ids that `cpus` touch, ascending.
    pub fn uncore_cache_ids_of(&self, cpus: &CpuSet) -> Vec<u32> {
        self.uncore_caches
            .ids
            .iter()
            .zip(&self.uncore_caches.cpus)
            .filter(|(_, members)| !members.is_disjoint(cpus))
            .map(|(&id, _)| id)
            .collect()
    }
}

fn checked_div(a: usize, b: usize) -> usize {
    a.checked_div(b).unwrap_or(0)
}
