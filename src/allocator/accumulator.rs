//! kubelet's `cpuAccumulator` and `takeByTopologyNUMAPacked`: the default, "packed" choice of
//! which free CPUs satisfy a request.
//!
//! The accumulator holds the CPUs still free (kubelet's `details`), the CPUs taken so far and how
//! many are still needed. Each step takes whole domains in kubelet's order (whole NUMA nodes and
//! sockets in the level order, whole uncore caches when preferred, whole cores, then single
//! threads), re-sorting the candidates by "fewest free CPUs first, then lowest id" from the
//! current free set. The orderings (`sort_available_*`, `free_*`) are public so the kubelet
//! accumulator vectors can check them directly.
//!
//! Fixture quirks are reproduced, not fixed: domains listed twice in an order (a socket spanning
//! NUMA nodes in NUMA-first mode) are taken twice, and the "free" tests compare against the
//! topology counters. [`super::StaticPolicy`] checks every result, so such quirks can never hand
//! out a CPU that is not available.

use super::index::{DomainTable, Member, TopologyIndex};
use crate::cpuset::CpuSet;

/// How single CPUs are ordered once whole domains have been taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuSortingStrategy {
    /// Fill cores: sibling threads next to each other (kubelet's default).
    #[default]
    Packed,
    /// Spread over cores: all free CPUs of each socket in id order, and no whole-core step
    /// (`distribute-cpus-across-cores`).
    Spread,
}

/// Why `take_by_topology_*` could not satisfy a request. Texts are kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TakeError {
    #[error(
        "not enough cpus available to satisfy request: requested={requested}, available={available}"
    )]
    NotEnoughCpus { requested: usize, available: usize },
    #[error("failed to allocate cpus")]
    Failed,
    #[error("accounting error, not enough CPUs allocated, remaining: {remaining}")]
    TooFewAllocated { remaining: i64 },
    #[error("accounting error, too many CPUs allocated, remaining: {remaining}")]
    TooManyAllocated { remaining: i64 },
}

/// kubelet's `cpuAccumulator`.
#[derive(Debug, Clone)]
pub struct CpuAccumulator<'a> {
    index: &'a TopologyIndex,
    free: CpuSet,
    result: CpuSet,
    needed: i64,
    strategy: CpuSortingStrategy,
}

impl<'a> CpuAccumulator<'a> {
    /// An accumulator needing `needed` CPUs out of `available` (restricted to the topology).
    pub fn new(
        index: &'a TopologyIndex,
        available: &CpuSet,
        needed: usize,
        strategy: CpuSortingStrategy,
    ) -> Self {
        CpuAccumulator {
            index,
            free: available.intersection(index.all_cpus()),
            result: CpuSet::new(),
            needed: i64::try_from(needed).unwrap_or(i64::MAX),
            strategy,
        }
    }

    /// CPUs taken so far.
    pub fn result(&self) -> &CpuSet {
        &self.result
    }

    /// CPUs still free.
    pub fn free(&self) -> &CpuSet {
        &self.free
    }

    /// CPUs still needed (negative when a step over-took, which kubelet reports as an error).
    pub fn needed(&self) -> i64 {
        self.needed
    }

    pub(crate) fn is_satisfied(&self) -> bool {
        self.needed < 1
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.needed > self.free.len() as i64
    }

    fn needs_at_least(&self, count: usize) -> bool {
        self.needed >= count as i64
    }

    /// kubelet's `take`: the whole set counts against the need, even CPUs already taken.
    pub(crate) fn take(&mut self, cpus: &CpuSet) {
        self.result.extend_from(cpus);
        self.free.remove_all(cpus);
        self.needed -= cpus.len() as i64;
    }

    fn take_cpu(&mut self, cpu: u32) {
        self.result.insert(cpu);
        self.free.remove(cpu);
        self.needed -= 1;
    }

    fn free_count(&self, table: &DomainTable, domain: usize) -> usize {
        table.cpus[domain].intersection_len(&self.free)
    }

    /// kubelet's `sort`: fewest free CPUs first, then lowest id. `domains` must not repeat.
    fn sorted(&self, table: &DomainTable, domains: impl Iterator<Item = usize>) -> Vec<usize> {
        let mut keyed: Vec<(usize, u32, usize)> = domains
            .map(|domain| (self.free_count(table, domain), table.ids[domain], domain))
            .collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, _, domain)| domain).collect()
    }

    /// Every domain of `table` with a free CPU, sorted.
    fn sorted_with_free_cpus(&self, table: &DomainTable) -> Vec<usize> {
        let mut keyed: Vec<(usize, u32, usize)> = (0..table.len())
            .map(|domain| (self.free_count(table, domain), table.ids[domain], domain))
            .filter(|&(free, _, _)| free > 0)
            .collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, _, domain)| domain).collect()
    }

    /// The children of one parent that still have a free CPU inside that parent, sorted.
    fn sorted_children(&self, table: &DomainTable, children: &[Member]) -> Vec<usize> {
        self.sorted(
            table,
            children
                .iter()
                .filter(|child| !child.shared.is_disjoint(&self.free))
                .map(|child| child.index),
        )
    }

    /// [`Self::sort_available_numa_nodes`] as indices into the NUMA node table.
    pub(crate) fn sort_available_numa_indices(&self) -> Vec<usize> {
        let index = self.index;
        if index.numa_first() {
            return self.sorted_with_free_cpus(&index.numa_nodes);
        }
        let mut order = Vec::new();
        for socket in self.sort_available_socket_indices() {
            order.extend(self.sorted_children(&index.numa_nodes, &index.socket_numa_nodes[socket]));
        }
        order
    }

    fn sort_available_socket_indices(&self) -> Vec<usize> {
        let index = self.index;
        if !index.numa_first() {
            return self.sorted_with_free_cpus(&index.sockets);
        }
        let mut order = Vec::new();
        for numa in self.sort_available_numa_indices() {
            order.extend(self.sorted_children(&index.sockets, &index.numa_sockets[numa]));
        }
        order
    }

    fn sort_available_core_indices(&self) -> Vec<usize> {
        let index = self.index;
        let mut order = Vec::new();
        if index.numa_first() {
            for socket in self.sort_available_socket_indices() {
                order.extend(self.sorted_children(&index.cores, &index.socket_cores[socket]));
            }
        } else {
            for numa in self.sort_available_numa_indices() {
                order.extend(self.sorted_children(&index.cores, &index.numa_cores[numa]));
            }
        }
        order
    }

    fn sort_available_uncore_indices(&self) -> Vec<usize> {
        let index = self.index;
        let mut order = Vec::new();
        for numa in self.sort_available_numa_indices() {
            order.extend(
                self.sorted_children(&index.uncore_caches, &index.numa_uncore_caches[numa]),
            );
        }
        order
    }

    /// kubelet's `sortAvailableNUMANodes`, as NUMA node ids.
    pub fn sort_available_numa_nodes(&self) -> Vec<u32> {
        ids(&self.index.numa_nodes, self.sort_available_numa_indices())
    }

    /// kubelet's `sortAvailableSockets`, as socket ids.
    pub fn sort_available_sockets(&self) -> Vec<u32> {
        ids(&self.index.sockets, self.sort_available_socket_indices())
    }

    /// kubelet's `sortAvailableCores`, as core ids.
    pub fn sort_available_cores(&self) -> Vec<u32> {
        ids(&self.index.cores, self.sort_available_core_indices())
    }

    /// kubelet's `sortAvailableUncoreCaches`, as uncore cache ids.
    pub fn sort_available_uncore_caches(&self) -> Vec<u32> {
        ids(
            &self.index.uncore_caches,
            self.sort_available_uncore_indices(),
        )
    }

    fn is_numa_node_free(&self, numa: usize) -> bool {
        let table = &self.index.numa_nodes;
        self.free_count(table, numa) == table.cpus[numa].len()
    }

    fn is_socket_free(&self, socket: usize) -> bool {
        self.free_count(&self.index.sockets, socket) == self.index.cpus_per_socket()
    }

    /// On homogeneous topologies kubelet's test (free threads == `CPUsPerCore` from the
    /// counters); on hybrid ones every thread of the core must be free.
    fn is_core_free(&self, core: usize) -> bool {
        let table = &self.index.cores;
        let free = self.free_count(table, core);
        if self.index.has_heterogeneous_cores() {
            free == self.index.whole_core_size(core)
        } else {
            free == self.index.cpus_per_core()
        }
    }

    fn is_uncore_cache_free(&self, uncore: usize) -> bool {
        let table = &self.index.uncore_caches;
        self.free_count(table, uncore) == table.cpus[uncore].len()
    }

    fn free_numa_indices(&self) -> Vec<usize> {
        let mut order = self.sort_available_numa_indices();
        order.retain(|&numa| self.is_numa_node_free(numa));
        order
    }

    fn free_socket_indices(&self) -> Vec<usize> {
        let mut order = self.sort_available_socket_indices();
        order.retain(|&socket| self.is_socket_free(socket));
        order
    }

    fn free_core_indices(&self) -> Vec<usize> {
        let mut order = self.sort_available_core_indices();
        order.retain(|&core| self.is_core_free(core));
        order
    }

    fn free_uncore_indices(&self) -> Vec<usize> {
        let mut order = self.sort_available_uncore_indices();
        order.retain(|&uncore| self.is_uncore_cache_free(uncore));
        order
    }

    /// kubelet's `freeNUMANodes`: NUMA nodes all of whose CPUs are free, in sorted order.
    pub fn free_numa_nodes(&self) -> Vec<u32> {
        ids(&self.index.numa_nodes, self.free_numa_indices())
    }

    /// kubelet's `freeSockets`: sockets with `CPUsPerSocket` free CPUs, in sorted order.
    pub fn free_sockets(&self) -> Vec<u32> {
        ids(&self.index.sockets, self.free_socket_indices())
    }

    /// kubelet's `freeCores`: cores with all threads free, in sorted order.
    pub fn free_cores(&self) -> Vec<u32> {
        ids(&self.index.cores, self.free_core_indices())
    }

    /// kubelet's `freeUncoreCache`: uncore caches all of whose CPUs are free, in sorted order.
    pub fn free_uncore_caches(&self) -> Vec<u32> {
        ids(&self.index.uncore_caches, self.free_uncore_indices())
    }

    /// kubelet's `freeCPUs`: every free CPU in the strategy's order (packed: by sorted core,
    /// threads ascending; spread: by sorted socket, CPUs ascending).
    pub fn free_cpus(&self) -> Vec<u32> {
        let index = self.index;
        let mut order = Vec::with_capacity(self.free.len());
        match self.strategy {
            CpuSortingStrategy::Packed => {
                for core in self.sort_available_core_indices() {
                    order.extend(index.cores.cpus[core].iter_intersection(&self.free));
                }
            }
            CpuSortingStrategy::Spread => {
                for socket in self.sort_available_socket_indices() {
                    order.extend(index.sockets.cpus[socket].iter_intersection(&self.free));
                }
            }
        }
        order
    }

    /// Takes each listed domain whole while the need is at least its size (kubelet's
    /// `takeFull*`: the list is computed once, larger domains are skipped, smaller ones later
    /// in the list are still considered).
    fn take_whole_domains(&mut self, table: &'a DomainTable, domains: Vec<usize>) {
        for domain in domains {
            let cpus = &table.cpus[domain];
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    fn take_full_numa_nodes(&mut self) {
        let domains = self.free_numa_indices();
        self.take_whole_domains(&self.index.numa_nodes, domains);
    }

    fn take_full_sockets(&mut self) {
        let domains = self.free_socket_indices();
        self.take_whole_domains(&self.index.sockets, domains);
    }

    fn take_full_cores(&mut self) {
        let domains = self.free_core_indices();
        self.take_whole_domains(&self.index.cores, domains);
    }

    fn take_full_uncore_caches(&mut self) {
        let domains = self.free_uncore_indices();
        self.take_whole_domains(&self.index.uncore_caches, domains);
    }

    /// kubelet's `takePartialUncore` with the PR #131850 rule: the first
    /// `ceil(need / CPUsPerCore)` cores (by id) with free CPUs in the cache; for an odd need on
    /// SMT, the highest CPU is dropped once; taken only on an exact fit.
    fn take_partial_uncore_cache(&mut self, uncore: usize) {
        let index = self.index;
        let cpus_per_core = index.cpus_per_core();
        let divisor = cpus_per_core.max(1) as i64;
        let cores_needed = usize::try_from((self.needed + divisor - 1) / divisor).unwrap_or(0);
        let mut cores: Vec<usize> = index.uncore_caches.cpus[uncore]
            .iter_intersection(&self.free)
            .filter_map(|cpu| index.core_index_of(cpu))
            .collect();
        cores.sort_unstable();
        cores.dedup();
        cores.truncate(cores_needed);
        let mut cpus = CpuSet::new();
        for core in cores {
            cpus.extend(index.cores.cpus[core].iter_intersection(&self.free));
        }
        if self.needed % 2 != 0 && cpus_per_core > 1 && cpus.len() as i64 > self.needed {
            if let Some(highest) = cpus.last() {
                cpus.remove(highest);
            }
        }
        if cpus.len() as i64 == self.needed {
            self.take(&cpus);
        }
    }

    /// kubelet's `takeUncoreCache`.
    fn take_uncore_caches(&mut self) {
        let cpus_per_uncore = self.index.cpus_per_uncore_cache();
        for uncore in self.sort_available_uncore_indices() {
            if self.needs_at_least(cpus_per_uncore) {
                self.take_full_uncore_caches();
            }
            if self.is_satisfied() {
                return;
            }
            self.take_partial_uncore_cache(uncore);
            if self.is_satisfied() {
                return;
            }
        }
    }

    fn take_remaining_cpus(&mut self) {
        for cpu in self.free_cpus() {
            self.take_cpu(cpu);
            if self.is_satisfied() {
                return;
            }
        }
    }
}

fn ids(table: &DomainTable, domains: Vec<usize>) -> Vec<u32> {
    domains
        .into_iter()
        .map(|domain| table.ids[domain])
        .collect()
}

/// kubelet's `takeByTopologyNUMAPacked`: `count` CPUs out of `available`.
pub fn take_by_topology_packed(
    index: &TopologyIndex,
    available: &CpuSet,
    count: usize,
    strategy: CpuSortingStrategy,
    prefer_uncore_cache: bool,
) -> Result<CpuSet, TakeError> {
    let mut acc = CpuAccumulator::new(index, available, count, strategy);
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    if acc.is_failed() {
        return Err(TakeError::NotEnoughCpus {
            requested: count,
            available: available.len(),
        });
    }
    if index.numa_first() {
        acc.take_full_numa_nodes();
    } else {
        acc.take_full_sockets();
    }
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    if index.numa_first() {
        acc.take_full_sockets();
    } else {
        acc.take_full_numa_nodes();
    }
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    if prefer_uncore_cache {
        acc.take_uncore_caches();
        if acc.is_satisfied() {
            return Ok(acc.result);
        }
    }
    if strategy != CpuSortingStrategy::Spread {
        acc.take_full_cores();
        if acc.is_satisfied() {
            return Ok(acc.result);
        }
    }
    acc.take_remaining_cpus();
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    Err(TakeError::Failed)
}
