//! The CPU topology of a node: which logical CPUs exist and how they group into cores, last-level
//! caches ("uncore"), NUMA nodes and sockets, plus isolated CPUs and memory nodes.
//!
//! This module owns the [`Topology`] value and its JSON document (DESIGN.md §2). Reading it from
//! sysfs and `/proc/cmdline` lives in [`discover()`]; rendering for people in [`render_tree`].
//! A `Topology` is plain data: the allocator and planner take it by reference and never do I/O.

mod discover;
mod fake_sysfs;
mod map;
mod render;

pub use discover::{
    discover, parse_cmdline, parse_kernel_cpulist, CmdlineIsolation, DiscoverError,
};
pub use fake_sysfs::write_fake_sysfs;
pub use map::{owner_key, render_map, MapStyle, Mark};
pub use render::render_tree;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

/// One online logical CPU and the ids of the domains it belongs to.
///
/// `core` is the lowest CPU id among the core's hardware threads, which makes core ids unique
/// across the node (kubelet does the same). `uncore` is the id of the last-level cache shared by
/// the CPU when that cache is an L3 or deeper, else the socket id (kubelet's fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub id: u32,
    pub socket: u32,
    #[serde(default)]
    pub die: u32,
    pub numa: u32,
    pub core: u32,
    pub uncore: u32,
    /// Lowest CPU id of the CPU's cluster (`cluster_cpus_list`); the core id where the kernel has
    /// no cluster information.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<u32>,
}

/// The core types of a hybrid part (Intel P-cores and E-cores, arm big.LITTLE): which online
/// CPUs are performance and which efficient CPUs. Both empty on a machine with one core type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoreTypes {
    pub performance: CpuSet,
    pub efficient: CpuSet,
}

impl CoreTypes {
    /// True on a machine with one core type (nothing to choose between).
    pub fn is_empty(&self) -> bool {
        self.performance.is_empty() || self.efficient.is_empty()
    }

    /// The CPUs of one type.
    pub fn of(&self, core_type: CoreType) -> &CpuSet {
        match core_type {
            CoreType::Performance => &self.performance,
            CoreType::Efficient => &self.efficient,
        }
    }
}

/// A core type of a hybrid part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CoreType {
    /// Intel's P-cores (`cpu_core`), arm's big cores: the fastest.
    #[default]
    Performance,
    /// Intel's E-cores (`cpu_atom`), arm's LITTLE cores.
    Efficient,
}

impl CoreType {
    /// The name annotations and documents use.
    pub fn name(self) -> &'static str {
        match self {
            CoreType::Performance => "performance",
            CoreType::Efficient => "efficient",
        }
    }

    /// Parses `performance` or `efficient`; `None` for anything else.
    pub fn parse(text: &str) -> Option<CoreType> {
        match text {
            "performance" => Some(CoreType::Performance),
            "efficient" => Some(CoreType::Efficient),
            _ => None,
        }
    }
}

/// The counters kubelet's `CPUTopology` carries. kubelet derives CPUs per core, socket and uncore
/// cache from these by integer division, not from the CPU map, so they are kept explicitly: a
/// discovered topology computes them from its CPUs, a kubelet test fixture sets them literally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub num_cpus: usize,
    pub num_cores: usize,
    pub num_sockets: usize,
    pub num_numa_nodes: usize,
    pub num_uncore_caches: usize,
}

/// Why a set of CPU records is not a usable topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("topology has no online cpus")]
    Empty,
    #[error("cpu {id} is listed twice")]
    DuplicateCpu { id: u32 },
    #[error("cpu {id} is larger than the largest supported cpu id {max}")]
    CpuIdTooLarge { id: u32, max: u32 },
    #[error("numa node {id} is larger than the largest supported id {max}")]
    NumaIdTooLarge { id: u32, max: u32 },
    #[error("cpu {id} names core {core}, which is not one of the listed cpus")]
    UnknownCore { id: u32, core: u32 },
    #[error("invalid topology document: {reason}")]
    Document { reason: String },
}

/// The shape of a regular machine for [`Topology::regular`]: every socket, NUMA node, uncore
/// cache and core alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegularShape {
    pub sockets: u32,
    pub numa_nodes_per_socket: u32,
    pub uncore_caches_per_numa_node: u32,
    pub cores_per_uncore_cache: u32,
    pub threads_per_core: u32,
}

/// The node's CPUs and their grouping. CPUs are sorted by id; only online CPUs are in `cpus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    cpus: Vec<CpuInfo>,
    all: CpuSet,
    offline: CpuSet,
    isolated: CpuSet,
    /// CPUs with the scheduler tick off (`nohz_full=`): shown, still allocatable.
    nohz_full: CpuSet,
    memory_nodes: CpuSet,
    counters: Counters,
    /// Performance and efficient CPUs on a hybrid part (empty elsewhere).
    core_types: CoreTypes,
}

/// The JSON document printed by `cpusetd topology --json` and read by `cpusetd allocate
/// --topology FILE` (DESIGN.md §2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyDocument {
    pub cpus: Vec<CpuInfo>,
    #[serde(default)]
    pub offline: CpuSet,
    #[serde(default)]
    pub isolated: CpuSet,
    pub memory_nodes: CpuSet,
    /// CPUs with the scheduler tick off (`nohz_full=`); left out when there are none.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub nohz_full: CpuSet,
    /// The core types of a hybrid part; left out on a machine with one core type.
    #[serde(default, skip_serializing_if = "CoreTypes::is_empty")]
    pub core_types: CoreTypes,
}

impl TopologyDocument {
    /// The document as JSON with one CPU per line: compact, diff-friendly, still valid JSON.
    pub fn to_json_lines(&self) -> String {
        let cpus: Vec<String> = self
            .cpus
            .iter()
            .map(|c| serde_json::to_string(c).unwrap_or_default())
            .collect();
        let quoted = |s: &CpuSet| serde_json::Value::String(s.to_string()).to_string();
        let nohz_full = if self.nohz_full.is_empty() {
            String::new()
        } else {
            format!(",\n  \"nohz_full\": {}", quoted(&self.nohz_full))
        };
        let core_types = if self.core_types.is_empty() {
            String::new()
        } else {
            format!(
                ",\n  \"core_types\": {{\"performance\": {}, \"efficient\": {}}}",
                quoted(&self.core_types.performance),
                quoted(&self.core_types.efficient)
            )
        };
        format!(
            "{{\n  \"cpus\": [\n    {}\n  ],\n  \"offline\": {},\n  \"isolated\": {},\n  \"memory_nodes\": {}{nohz_full}{core_types}\n}}",
            cpus.join(",\n    "),
            quoted(&self.offline),
            quoted(&self.isolated),
            quoted(&self.memory_nodes)
        )
    }
}

impl Topology {
    /// Builds a topology from online CPU records; counters are derived from the records.
    pub fn new(
        mut cpus: Vec<CpuInfo>,
        offline: CpuSet,
        isolated: CpuSet,
        memory_nodes: CpuSet,
    ) -> Result<Self, TopologyError> {
        if cpus.is_empty() {
            return Err(TopologyError::Empty);
        }
        cpus.sort_by_key(|c| c.id);
        let mut all = CpuSet::new();
        for cpu in &cpus {
            if cpu.id > crate::cpuset::MAX_CPU_ID {
                return Err(TopologyError::CpuIdTooLarge {
                    id: cpu.id,
                    max: crate::cpuset::MAX_CPU_ID,
                });
            }
            if cpu.numa > crate::cpuset::MAX_CPU_ID {
                return Err(TopologyError::NumaIdTooLarge {
                    id: cpu.numa,
                    max: crate::cpuset::MAX_CPU_ID,
                });
            }
            if all.contains(cpu.id) {
                return Err(TopologyError::DuplicateCpu { id: cpu.id });
            }
            all.insert(cpu.id);
        }
        let distinct = |f: fn(&CpuInfo) -> u32| cpus.iter().map(f).collect::<BTreeSet<_>>().len();
        let counters = Counters {
            num_cpus: cpus.len(),
            num_cores: distinct(|c| c.core),
            num_sockets: distinct(|c| c.socket),
            num_numa_nodes: distinct(|c| c.numa),
            num_uncore_caches: distinct(|c| c.uncore),
        };
        Ok(Topology {
            cpus,
            all,
            offline,
            isolated,
            nohz_full: CpuSet::new(),
            memory_nodes,
            counters,
            core_types: CoreTypes::default(),
        })
    }

    /// A regular machine numbered the way Linux numbers x86 parts: cores are numbered socket by
    /// socket, and thread `t` of core `c` is CPU `c + t * cores`, so sibling threads are far
    /// apart. One memory node per NUMA node. For tests, benchmarks and demos.
    pub fn regular(shape: RegularShape) -> Result<Self, TopologyError> {
        let numa_nodes = shape.sockets * shape.numa_nodes_per_socket;
        let uncore_caches = numa_nodes * shape.uncore_caches_per_numa_node;
        let cores = uncore_caches * shape.cores_per_uncore_cache;
        let mut cpus = Vec::new();
        for core in 0..cores {
            let uncore = core / shape.cores_per_uncore_cache.max(1);
            let numa = uncore / shape.uncore_caches_per_numa_node.max(1);
            let socket = numa / shape.numa_nodes_per_socket.max(1);
            for thread in 0..shape.threads_per_core {
                cpus.push(CpuInfo {
                    id: core + thread * cores,
                    socket,
                    die: 0,
                    numa,
                    core,
                    uncore,
                    cluster: None,
                });
            }
        }
        let memory_nodes = (0..numa_nodes).collect();
        Topology::new(cpus, CpuSet::new(), CpuSet::new(), memory_nodes)
    }

    /// The CPUs whose scheduler tick is off (`nohz_full=`). They stay allocatable: the
    /// isolcpus KEP is about `isolcpus=` (domain isolation) only.
    pub fn with_nohz_full(mut self, cpus: CpuSet) -> Self {
        self.nohz_full = cpus.intersection(&self.all);
        self
    }

    /// The core types of a hybrid part, kept to online CPUs; none at all when either type has
    /// no online CPU (nothing to choose between).
    pub fn with_core_types(mut self, types: CoreTypes) -> Self {
        let types = CoreTypes {
            performance: types.performance.intersection(&self.all),
            efficient: types.efficient.intersection(&self.all),
        };
        self.core_types = if types.is_empty() {
            CoreTypes::default()
        } else {
            types
        };
        self
    }

    /// Performance and efficient CPUs (both empty unless this is a hybrid part).
    pub fn core_types(&self) -> &CoreTypes {
        &self.core_types
    }

    /// CPUs whose scheduler tick is off (`nohz_full=`, `isolcpus=nohz,…`).
    pub fn nohz_full(&self) -> &CpuSet {
        &self.nohz_full
    }

    /// Replaces the derived counters with literal ones (kubelet test fixtures set them by hand,
    /// sometimes inconsistently with the CPU map, and kubelet's arithmetic follows the counters).
    pub fn with_counters(mut self, counters: Counters) -> Self {
        self.counters = counters;
        self
    }

    pub fn from_document(doc: TopologyDocument) -> Result<Self, TopologyError> {
        Topology::new(doc.cpus, doc.offline, doc.isolated, doc.memory_nodes).map(|t| {
            t.with_nohz_full(doc.nohz_full)
                .with_core_types(doc.core_types)
        })
    }

    pub fn to_document(&self) -> TopologyDocument {
        TopologyDocument {
            cpus: self.cpus.clone(),
            offline: self.offline.clone(),
            isolated: self.isolated.clone(),
            memory_nodes: self.memory_nodes.clone(),
            nohz_full: self.nohz_full.clone(),
            core_types: self.core_types.clone(),
        }
    }

    /// Parses the JSON document of `cpusetd topology --json`.
    pub fn from_json(text: &str) -> Result<Self, TopologyError> {
        let doc: TopologyDocument =
            serde_json::from_str(text).map_err(|e| TopologyError::Document {
                reason: e.to_string(),
            })?;
        Topology::from_document(doc)
    }

    /// Online CPUs, ascending by id.
    pub fn cpus(&self) -> &[CpuInfo] {
        &self.cpus
    }

    /// The record of an online CPU.
    pub fn cpu(&self, id: u32) -> Option<&CpuInfo> {
        self.cpus
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.cpus[i])
    }

    /// All online CPUs.
    pub fn all_cpus(&self) -> &CpuSet {
        &self.all
    }

    /// CPUs the kernel knows as present but offline. Never allocatable.
    pub fn offline(&self) -> &CpuSet {
        &self.offline
    }

    /// CPUs isolated from the scheduler's domains (`isolcpus=` with the `domain` flag or none,
    /// sysfs `isolated`). `nohz_full=` CPUs are not among them (see [`Topology::nohz_full`]).
    pub fn isolated(&self) -> &CpuSet {
        &self.isolated
    }

    /// NUMA nodes that have memory (what `cpuset.mems` may hold).
    pub fn memory_nodes(&self) -> &CpuSet {
        &self.memory_nodes
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// CPUs matching a predicate on their record.
    pub fn cpus_where(&self, pred: impl Fn(&CpuInfo) -> bool) -> CpuSet {
        self.cpus.iter().filter(|c| pred(c)).map(|c| c.id).collect()
    }

    /// Hardware threads of a core (by core id).
    pub fn core_threads(&self, core: u32) -> CpuSet {
        self.cpus_where(|c| c.core == core)
    }

    /// The cpus of `cpus` that `irq-load-balancing.crio.io: "housekeeping"` leaves device
    /// interrupts on, as CRI-O picks them: the first cpu and its SMT siblings in `cpus`.
    pub fn housekeeping_cpus(&self, cpus: &CpuSet) -> CpuSet {
        let Some(first) = cpus.iter().next() else {
            return CpuSet::new();
        };
        let mut kept = match self.cpu(first) {
            Some(info) => self.core_threads(info.core).intersection(cpus),
            None => CpuSet::new(),
        };
        kept.insert(first);
        kept
    }

    /// All threads of every core that has a thread in `cpus` (kubelet's "physical CPUs").
    pub fn expand_to_cores(&self, cpus: &CpuSet) -> CpuSet {
        let cores: BTreeSet<u32> = cpus
            .iter()
            .filter_map(|id| self.cpu(id).map(|c| c.core))
            .collect();
        self.cpus_where(|c| cores.contains(&c.core))
    }

    /// CPUs of the given NUMA nodes.
    pub fn numa_cpus(&self, nodes: &CpuSet) -> CpuSet {
        self.cpus_where(|c| nodes.contains(c.numa))
    }

    /// Whether every core has the same number of threads (false on hybrid P/E-core parts).
    pub fn is_homogeneous(&self) -> bool {
        let mut per_core: BTreeMap<u32, usize> = BTreeMap::new();
        for cpu in &self.cpus {
            *per_core.entry(cpu.core).or_default() += 1;
        }
        let mut counts = per_core.values();
        let first = counts.next().copied();
        counts.all(|&n| Some(n) == first)
    }

    /// Checks that every CPU's core id names one of the listed CPUs (true of discovered
    /// topologies; kubelet fixtures may violate it, so this is a separate check).
    pub fn validate_core_ids(&self) -> Result<(), TopologyError> {
        for cpu in &self.cpus {
            if !self.all.contains(cpu.core) {
                return Err(TopologyError::UnknownCore {
                    id: cpu.id,
                    core: cpu.core,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(id: u32, core: u32, socket: u32, numa: u32) -> CpuInfo {
        CpuInfo {
            id,
            socket,
            die: 0,
            numa,
            core,
            uncore: socket,
            cluster: None,
        }
    }

    #[test]
    fn counters_are_derived_from_the_cpu_map() {
        let topo = Topology::new(
            vec![
                cpu(0, 0, 0, 0),
                cpu(1, 1, 0, 0),
                cpu(2, 0, 0, 0),
                cpu(3, 1, 0, 0),
            ],
            CpuSet::new(),
            CpuSet::new(),
            CpuSet::range(0, 0),
        )
        .unwrap();
        let c = topo.counters();
        assert_eq!((c.num_cpus, c.num_cores, c.num_sockets), (4, 2, 1));
        assert_eq!(topo.core_threads(1).to_string(), "1,3");
        assert!(topo.is_homogeneous());
    }

    #[test]
    fn regular_shapes_number_siblings_far_apart() {
        let topo = Topology::regular(RegularShape {
            sockets: 2,
            numa_nodes_per_socket: 1,
            uncore_caches_per_numa_node: 2,
            cores_per_uncore_cache: 2,
            threads_per_core: 2,
        })
        .unwrap();
        let c = topo.counters();
        assert_eq!((c.num_cpus, c.num_cores, c.num_sockets), (16, 8, 2));
        assert_eq!((c.num_numa_nodes, c.num_uncore_caches), (2, 4));
        assert_eq!(topo.core_threads(5).to_string(), "5,13");
        assert_eq!(topo.cpu(13).map(|c| (c.socket, c.uncore)), Some((1, 2)));
        assert_eq!(topo.memory_nodes().to_string(), "0-1");
    }

    #[test]
    fn housekeeping_is_the_first_cpu_and_its_siblings_in_the_set() {
        let topo = Topology::regular(RegularShape {
            sockets: 2,
            numa_nodes_per_socket: 1,
            uncore_caches_per_numa_node: 2,
            cores_per_uncore_cache: 2,
            threads_per_core: 2,
        })
        .unwrap();
        let set = |s: &str| CpuSet::parse(s).unwrap();
        // Cores {1,9} and {2,10}: interrupts stay on the first.
        assert_eq!(topo.housekeeping_cpus(&set("1-2,9-10")).to_string(), "1,9");
        // A sibling outside the set is not taken.
        assert_eq!(topo.housekeeping_cpus(&set("1-2")).to_string(), "1");
        assert!(topo.housekeeping_cpus(&CpuSet::new()).is_empty());
    }

    #[test]
    fn duplicate_cpu_is_rejected() {
        let err = Topology::new(
            vec![cpu(0, 0, 0, 0), cpu(0, 0, 0, 0)],
            CpuSet::new(),
            CpuSet::new(),
            CpuSet::new(),
        )
        .unwrap_err();
        assert_eq!(err, TopologyError::DuplicateCpu { id: 0 });
    }

    #[test]
    fn document_round_trips() {
        let text = r#"{"cpus":[{"id":0,"socket":0,"die":0,"numa":0,"core":0,"uncore":0},
            {"id":1,"socket":0,"die":0,"numa":0,"core":0,"uncore":0}],
            "isolated":"1","memory_nodes":"0"}"#;
        let topo = Topology::from_json(text).unwrap();
        assert_eq!(topo.isolated().to_string(), "1");
        let again = serde_json::to_string(&topo.to_document()).unwrap();
        assert_eq!(Topology::from_json(&again).unwrap(), topo);
    }

    #[test]
    fn bad_document_names_the_problem() {
        let err = Topology::from_json(r#"{"cpus":[],"memory_nodes":"0"}"#).unwrap_err();
        assert_eq!(err, TopologyError::Empty);
        let err = Topology::from_json(r#"{"cpus":[{"id":0}],"memory_nodes":"0"}"#).unwrap_err();
        assert!(err.to_string().contains("missing field"), "{err}");
    }
}
