//! The allocator: which CPUs a container gets, reproducing kubelet's CPU Manager `static` policy
//! (v1.32–v1.34, with the uncore-cache rule of kubernetes PR #131850).
//!
//! Everything here is pure: a topology, the pools and a request go in, a CPU set or an error
//! comes out, with no I/O and no panics. [`TopologyIndex`] precomputes the per-topology tables
//! once; [`take_by_topology_packed`] and [`take_by_topology_distributed`] are kubelet's two
//! algorithms, with [`CpuAccumulator`] exposing the orderings they use; [`PolicyOptions`] parses
//! and checks `--cpu-manager-policy-options`; [`StaticPolicy`] holds the reserved CPUs and runs
//! kubelet's admission checks, hint handling and start-up state validation.
//!
//! Homogeneous topologies behave exactly like kubelet, which derives CPUs per core, socket and
//! uncore cache from the topology counters. On hybrid (P/E-core) topologies a core is "free"
//! only when all of its own threads are, and `full-pcpus-only` keeps allocations to whole cores.

mod accumulator;
mod best_fit;
mod distributed;
mod index;
mod options;
mod policy;
#[allow(clippy::too_many_lines)]
#[cfg(test)]
mod tests;

pub use accumulator::{take_by_topology_packed, CpuAccumulator, CpuSortingStrategy, TakeError};
pub use best_fit::{BestFit, Placement, PlacementError, PLACEMENT_NAMES};
pub use distributed::take_by_topology_distributed;
pub use index::TopologyIndex;
pub use options::{
    OptionsError, PolicyOptions, ALIGN_BY_SOCKET, DISTRIBUTE_CPUS_ACROSS_CORES,
    DISTRIBUTE_CPUS_ACROSS_NUMA, FULL_PCPUS_ONLY, OPTION_NAMES, PREFER_ALIGN_CPUS_BY_UNCORECACHE,
    STRICT_CPU_RESERVATION,
};
pub use policy::{
    AllocationError, Assignments, CpuPool, PolicyError, ReservedCpus, StateError, StaticPolicy,
};
