//! [`StaticPolicy`]: kubelet's static policy (`policy_static.go`) over cpusetd's pools.
//!
//! The policy owns the reserved CPUs and the options; the pools are the caller's and are passed
//! in. The shared pool is kubelet's "default" set (every CPU not exclusively assigned; without
//! the reserved CPUs under `strict-cpu-reservation`). Exclusive CPUs come from the shared pool
//! minus the reserved CPUs, and with `respect_isolcpus` minus the isolated CPUs as well (removed
//! after the reservation was chosen, so a count reservation may still land on isolated CPUs).
//! With `respect_isolcpus` the isolated CPUs (but the reserved ones) are a pool of their own,
//! [`CpuPool::Isolated`], for pods that ask for it (`cpusetd.io/isolated-cpus: require`): the
//! same alignment rules over those CPUs only, and a request they cannot hold is refused
//! ([`AdmissionReason::IsolatedCpus`](crate::state::AdmissionReason)), never served elsewhere.
//!
//! On top of kubelet, cpusetd refuses an allocation that would take the last CPUs of the shared
//! pool, and checks every result against the allocatable pool, so fixture-style topologies
//! whose counters disagree with their CPU map can never hand out a CPU twice.

use std::collections::BTreeMap;

use super::accumulator::{take_by_topology_packed, CpuSortingStrategy, TakeError};
use super::best_fit::{BestFit, Placement, PlacementError};
use super::distributed::take_by_topology_distributed;
use super::index::TopologyIndex;
use super::options::{OptionsError, PolicyOptions};
use crate::cpuset::CpuSet;
use crate::topology::{CoreType, Topology};

/// Which CPUs an exclusive allocation may come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuPool {
    /// Every CPU of the shared pool but the reserved ones, and the isolated ones under
    /// `--respect-isolcpus` (kubelet's pool).
    #[default]
    General,
    /// Only the kernel's isolated CPUs, without the reserved ones: a pod's
    /// `cpusetd.io/isolated-cpus: require` under `--respect-isolcpus`.
    Isolated,
}

/// How the reserved CPUs are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservedCpus {
    /// `--reserved-cpus LIST`: exactly these CPUs.
    List(CpuSet),
    /// `--reserved-cpu-count N`: N CPUs taken from all CPUs with the policy's own
    /// takeByTopology, as kubelet does from `kube-reserved + system-reserved`.
    Count(usize),
    /// kubelet's own pair: `reservedSystemCPUs` plus the count from `kube-reserved +
    /// system-reserved`; the list is used when non-empty and must hold exactly `count` CPUs.
    ListWithCount { cpus: CpuSet, count: usize },
}

/// Why a policy could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// kubelet's text, kept verbatim.
    #[error(
        "[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not \
         equal {count})"
    )]
    UnableToReserve { reserved: CpuSet, count: usize },
    /// kubelet's text, kept verbatim.
    #[error(
        "[cpumanager] unable to build the reserved physical CPUs from the reserved set: unknown \
         CPU ID: {cpu}"
    )]
    UnknownReservedCpu { cpu: u32 },
    /// Not a kubelet error: kubelet would run every pod on an empty shared pool.
    #[error("no cpu is left for pods: {}", cover_every_cpu(reserved, excluded, *strict))]
    NoCpusForPods {
        reserved: CpuSet,
        excluded: CpuSet,
        strict: bool,
    },
}

fn cover_every_cpu(reserved: &CpuSet, excluded: &CpuSet, strict: bool) -> String {
    let mut text = format!("the reserved cpus {reserved}");
    if strict {
        text.push_str(" (kept out of the shared pool by strict-cpu-reservation)");
    }
    if !excluded.is_empty() {
        text.push_str(&format!(
            " and the isolated cpus {excluded} (--respect-isolcpus)"
        ));
    }
    text + " cover every cpu"
}

/// Why a request for exclusive CPUs cannot be met. The kubelet variants carry kubelet's texts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// `full-pcpus-only`: the request is not a whole number of cores.
    #[error("SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {cpus_per_core}")]
    SmtNotMultipleOfCore {
        requested: usize,
        cpus_per_core: usize,
    },
    /// `full-pcpus-only`: fewer CPUs on free physical cores than requested.
    #[error(
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = \
         {available_physical}, requested CPUs = {requested}, CPUs per core = {cpus_per_core}"
    )]
    SmtNotEnoughPhysicalCpus {
        available_physical: usize,
        requested: usize,
        cpus_per_core: usize,
    },
    /// `full-pcpus-only` on a hybrid topology: the pick would split a core.
    #[error(
        "SMT Alignment Error: requested {requested} cpus cannot be made of whole free cores \
         (the allocator picked {cpus})"
    )]
    SmtSplitsCore { requested: usize, cpus: CpuSet },
    /// takeByTopology failed (`not enough cpus available to satisfy request: ...`).
    #[error(transparent)]
    Take(#[from] TakeError),
    /// cpusetd's rule: the shared pool is never emptied.
    #[error(
        "allocating {cpus} for a request of {requested} cpus would leave the shared pool empty"
    )]
    WouldEmptySharedPool { requested: usize, cpus: CpuSet },
    /// cpusetd's rule: no new exclusive CPUs while the scan stops at its limit (a container
    /// past it may hold any CPU).
    #[error(
        "the scan of the cgroup tree stopped at its limit: no new exclusive cpus are given until \
         a scan sees the whole tree (a container past the limit may hold them)"
    )]
    ScanIncomplete,
    /// The algorithm returned CPUs outside the allocatable pool or the wrong number of them,
    /// which only topologies whose counters disagree with their CPU map can cause.
    #[error(
        "allocator picked {cpus} for a request of {requested} cpus from {allocatable}: the \
         topology's counters do not match its cpu map"
    )]
    InconsistentTopology {
        requested: usize,
        cpus: CpuSet,
        allocatable: CpuSet,
    },
    /// `cpusetd.io/isolated-cpus` while isolated CPUs are ordinary CPUs.
    #[error(
        "the pod asks for isolated cpus ({}: require) but the agent runs without \
         --respect-isolcpus, so isolated cpus are ordinary cpus here: start it with \
         --respect-isolcpus or drop the annotation",
        crate::classify::ISOLATED_CPUS_ANNOTATION
    )]
    IsolatedPoolOff,
    /// `cpusetd.io/isolated-cpus` on a node with no isolated CPU left for pods.
    #[error(
        "the pod asks for isolated cpus ({}: require) but this node has none to give ({})",
        crate::classify::ISOLATED_CPUS_ANNOTATION,
        no_isolated_cpus(isolated)
    )]
    NoIsolatedCpus { isolated: CpuSet },
    /// `cpusetd.io/isolated-cpus`: the isolated pool cannot hold the request.
    #[error(
        "the isolated cpus {pool} cannot hold a request of {requested} cpus ({}: require; \
         never served from other cpus): {cause}",
        crate::classify::ISOLATED_CPUS_ANNOTATION
    )]
    IsolatedPoolTooSmall {
        requested: usize,
        pool: CpuSet,
        cause: Box<AllocationError>,
    },
}

fn no_isolated_cpus(isolated: &CpuSet) -> String {
    if isolated.is_empty() {
        "the kernel isolates no cpu: no isolcpus= domain cpus, sysfs isolated is empty".to_string()
    } else {
        format!("its isolated cpus {isolated} are all reserved")
    }
}

impl AllocationError {
    /// The cpus the reason says were available, where it counts them.
    pub fn available(&self) -> Option<usize> {
        match self {
            AllocationError::Take(TakeError::NotEnoughCpus { available, .. }) => Some(*available),
            AllocationError::SmtNotEnoughPhysicalCpus {
                available_physical, ..
            } => Some(*available_physical),
            AllocationError::IsolatedPoolTooSmall { cause, .. } => cause.available(),
            _ => None,
        }
    }
    /// The reason kubelet's pod admission gives for this error (`PodAdmitResult.Reason`): every
    /// allocation failure of any container rejects the whole pod.
    pub fn admission_reason(&self) -> crate::state::AdmissionReason {
        match self {
            AllocationError::SmtNotMultipleOfCore { .. }
            | AllocationError::SmtNotEnoughPhysicalCpus { .. }
            | AllocationError::SmtSplitsCore { .. } => crate::state::AdmissionReason::SmtAlignment,
            AllocationError::IsolatedPoolOff
            | AllocationError::NoIsolatedCpus { .. }
            | AllocationError::IsolatedPoolTooSmall { .. } => {
                crate::state::AdmissionReason::IsolatedCpus
            }
            _ => crate::state::AdmissionReason::Unexpected,
        }
    }

    /// kubelet's admission message (`PodAdmitResult.Message`): an SMT alignment error's own
    /// text; any other wrapped as `Allocate failed due to …, which is unexpected`.
    pub fn admission_message(&self) -> String {
        match self.admission_reason() {
            crate::state::AdmissionReason::SmtAlignment
            | crate::state::AdmissionReason::IsolatedCpus => self.to_string(),
            crate::state::AdmissionReason::Unexpected => {
                format!("Allocate failed due to {self}, which is unexpected")
            }
        }
    }

    /// Whether the request alone decides it (not a whole number of cores), whatever is free.
    pub fn is_permanent(&self) -> bool {
        matches!(self, AllocationError::SmtNotMultipleOfCore { .. })
    }
}

/// Exclusive assignments as kubelet's state holds them: pod → container → CPUs.
pub type Assignments = BTreeMap<String, BTreeMap<String, CpuSet>>;

/// Why a saved state does not fit the policy (kubelet's `validateState`; texts are kubelet's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("default cpuset cannot be empty")]
    EmptySharedPoolWithAssignments,
    #[error("some of strictly reserved cpus: \"{cpus}\" are present in defaultCpuSet: \"{shared_pool}\"")]
    StrictlyReservedInSharedPool { cpus: CpuSet, shared_pool: CpuSet },
    #[error(
        "not all reserved cpus: \"{reserved}\" are present in defaultCpuSet: \"{shared_pool}\""
    )]
    ReservedMissingFromSharedPool {
        reserved: CpuSet,
        shared_pool: CpuSet,
    },
    #[error(
        "pod: {pod}, container: {container} cpuset: \"{cpus}\" overlaps with default cpuset \
         \"{shared_pool}\""
    )]
    AssignmentOverlapsSharedPool {
        pod: Box<str>,
        container: Box<str>,
        cpus: CpuSet,
        shared_pool: CpuSet,
    },
    #[error("current set of available CPUs \"{expected}\" doesn't match with CPUs in state \"{in_state}\"")]
    CpusChanged { expected: CpuSet, in_state: CpuSet },
}

/// kubelet's static policy over one topology.
#[derive(Debug, Clone)]
pub struct StaticPolicy {
    index: TopologyIndex,
    options: PolicyOptions,
    reserved: CpuSet,
    /// CPUs never handed out exclusively besides the reserved ones (isolated CPUs when
    /// `respect_isolcpus`).
    excluded: CpuSet,
    /// Every thread of every core holding a reserved or excluded CPU (kubelet's
    /// `reservedPhysicalCPUs`, plus the excluded CPUs' cores).
    unavailable_physical: CpuSet,
    /// The isolated pool ([`CpuPool::Isolated`]): the excluded CPUs but the reserved ones.
    isolated_pool: CpuSet,
    /// Every thread of every core holding a CPU outside the isolated pool: the isolated pool's
    /// `unavailable_physical`.
    isolated_unavailable_physical: CpuSet,
    cpu_group_size: usize,
    /// The best-fit tables when `--placement best-fit` chose cpusetd's own placement; `None`
    /// for kubelet's.
    best_fit: Option<BestFit>,
    /// Built with `respect_isolcpus` (kept for [`Self::for_topology`]).
    respect_isolcpus: bool,
}

impl StaticPolicy {
    /// Builds the policy: checks the options against the topology, then picks the reserved CPUs
    /// as kubelet does. With `respect_isolcpus` the topology's isolated CPUs are never handed
    /// out exclusively.
    pub fn new(
        topology: &Topology,
        options: PolicyOptions,
        reserved: ReservedCpus,
        respect_isolcpus: bool,
    ) -> Result<Self, PolicyError> {
        options.validate_for(topology)?;
        let index = TopologyIndex::new(topology);
        let mut policy = StaticPolicy {
            cpu_group_size: index.cpus_per_core(),
            index,
            options,
            reserved: CpuSet::new(),
            excluded: CpuSet::new(),
            unavailable_physical: CpuSet::new(),
            isolated_pool: CpuSet::new(),
            isolated_unavailable_physical: CpuSet::new(),
            best_fit: None,
            respect_isolcpus,
        };
        let (explicit, count) = match reserved {
            ReservedCpus::List(cpus) => {
                let count = cpus.len();
                (cpus, count)
            }
            ReservedCpus::Count(count) => (CpuSet::new(), count),
            ReservedCpus::ListWithCount { cpus, count } => (cpus, count),
        };
        let reserved = if explicit.is_empty() {
            policy
                .take_by_topology(policy.index.all_cpus(), count)
                .unwrap_or_default()
        } else {
            explicit
        };
        if reserved.len() != count {
            return Err(PolicyError::UnableToReserve { reserved, count });
        }
        if let Some(cpu) = reserved
            .iter()
            .find(|&cpu| policy.index.core_index_of(cpu).is_none())
        {
            return Err(PolicyError::UnknownReservedCpu { cpu });
        }
        if respect_isolcpus {
            policy.excluded = topology.isolated().intersection(policy.index.all_cpus());
        }
        policy.unavailable_physical = policy
            .index
            .expand_to_cores(&reserved.union(&policy.excluded));
        policy.isolated_pool = policy.excluded.difference(&reserved);
        policy.isolated_unavailable_physical = policy
            .index
            .expand_to_cores(&policy.index.all_cpus().difference(&policy.isolated_pool));
        policy.reserved = reserved;
        let mut pod_cpus = policy.initial_shared_pool();
        pod_cpus.remove_all(&policy.excluded);
        if pod_cpus.is_empty() {
            return Err(PolicyError::NoCpusForPods {
                reserved: policy.reserved,
                excluded: policy.excluded,
                strict: policy.options.strict_cpu_reservation,
            });
        }
        Ok(policy)
    }

    /// The same policy on the node's topology after CPUs went offline or came online: the
    /// same options and isolcpus rule, and of `reserved` (the reserved cpus chosen at start)
    /// those that are online. None is chosen anew, so no pin ever sits on a newly reserved cpu;
    /// with none online the policy has no reserved cpu (the planner keeps the shared pool from
    /// emptying).
    pub fn for_topology(
        &self,
        topology: &Topology,
        reserved: &CpuSet,
    ) -> Result<StaticPolicy, PolicyError> {
        let policy = StaticPolicy::new(
            topology,
            self.options,
            ReservedCpus::List(reserved.intersection(topology.all_cpus())),
            self.respect_isolcpus,
        )?;
        // The same placement, its tables built for the new topology (the options were
        // accepted with it once already).
        Ok(match self.best_fit {
            Some(_) => policy
                .with_placement(Placement::BestFit)
                .expect("best fit was accepted with these options"),
            None => policy,
        })
    }

    pub fn options(&self) -> &PolicyOptions {
        &self.options
    }

    /// The same policy placing exclusive CPUs with `placement`. The reserved CPUs stay those
    /// kubelet's algorithm chose. Best fit is refused with the options that spread CPUs.
    pub fn with_placement(mut self, placement: Placement) -> Result<Self, PlacementError> {
        placement.check_options(&self.options)?;
        self.best_fit = match placement {
            Placement::Kubelet => None,
            Placement::BestFit => Some(BestFit::new(&self.index)),
        };
        Ok(self)
    }

    /// How exclusive CPUs are placed.
    pub fn placement(&self) -> Placement {
        if self.best_fit.is_some() {
            Placement::BestFit
        } else {
            Placement::Kubelet
        }
    }

    /// The reserved CPUs: never exclusive; kept out of the shared pool too when strict.
    pub fn reserved(&self) -> &CpuSet {
        &self.reserved
    }

    /// CPUs kept out of exclusive allocations besides the reserved ones (isolated CPUs when
    /// `respect_isolcpus`).
    pub fn excluded(&self) -> &CpuSet {
        &self.excluded
    }

    pub fn topology_index(&self) -> &TopologyIndex {
        &self.index
    }

    /// kubelet's `CPUsPerCore()`; the group size of `full-pcpus-only`.
    pub fn cpus_per_core(&self) -> usize {
        self.cpu_group_size
    }

    /// The shared pool of a fresh state: all CPUs, without the reserved ones when strict.
    pub fn initial_shared_pool(&self) -> CpuSet {
        if self.options.strict_cpu_reservation {
            self.index.all_cpus().difference(&self.reserved)
        } else {
            self.index.all_cpus().clone()
        }
    }

    /// CPUs of `shared_pool` that may be handed out exclusively.
    pub fn allocatable(&self, shared_pool: &CpuSet) -> CpuSet {
        let mut allocatable = shared_pool.difference(&self.reserved);
        allocatable.remove_all(&self.excluded);
        allocatable
    }

    /// The isolated pool: the isolated CPUs but the reserved ones under `respect_isolcpus`;
    /// empty without it.
    pub fn isolated_pool(&self) -> &CpuSet {
        &self.isolated_pool
    }

    /// CPUs of `free` that `pool` may hand out exclusively: [`Self::allocatable`] for the
    /// general pool, the isolated pool's share of `free` for the isolated one.
    pub fn allocatable_in(&self, pool: CpuPool, free: &CpuSet) -> CpuSet {
        match pool {
            CpuPool::General => self.allocatable(free),
            CpuPool::Isolated => free.intersection(&self.isolated_pool),
        }
    }

    /// kubelet's `policy.takeByTopology`: the option-selected algorithm on `available`.
    pub fn take_by_topology(&self, available: &CpuSet, count: usize) -> Result<CpuSet, TakeError> {
        let strategy = if self.options.distribute_cpus_across_cores {
            CpuSortingStrategy::Spread
        } else {
            CpuSortingStrategy::Packed
        };
        if self.options.distribute_cpus_across_numa {
            let group_size = if self.options.full_pcpus_only {
                self.cpu_group_size
            } else {
                1
            };
            return take_by_topology_distributed(
                &self.index,
                available,
                count,
                group_size,
                strategy,
            );
        }
        take_by_topology_packed(
            &self.index,
            available,
            count,
            strategy,
            self.options.prefer_align_cpus_by_uncorecache,
        )
    }

    /// kubelet's admission check that the request alone decides: under `full-pcpus-only` a
    /// request that is not a whole number of cores.
    pub fn request_error(&self, request: usize) -> Option<AllocationError> {
        let group_size = self.cpu_group_size.max(1);
        (self.options.full_pcpus_only && request % group_size != 0).then_some(
            AllocationError::SmtNotMultipleOfCore {
                requested: request,
                cpus_per_core: self.cpu_group_size,
            },
        )
    }

    /// Picks `request` exclusive CPUs (kubelet's `Allocate` + `allocateCPUs`).
    ///
    /// `shared_pool` is the current shared pool, `numa_hint` the NUMA node ids of a topology
    /// hint, `reusable` CPUs this pod's finished init containers may pass on (kubelet's
    /// `cpusToReuse`). The caller removes the result from the shared pool. A request of 0 is
    /// a shared-pool container: the result is empty.
    ///
    /// With best-fit placement, a best-fit result that fails any check is replaced by kubelet's
    /// result, so best fit never refuses what kubelet's algorithm grants.
    pub fn allocate(
        &self,
        request: usize,
        shared_pool: &CpuSet,
        numa_hint: Option<&CpuSet>,
        reusable: &CpuSet,
    ) -> Result<CpuSet, AllocationError> {
        self.allocate_preferring(
            request,
            shared_pool,
            numa_hint,
            reusable,
            CoreType::Performance,
        )
    }

    /// [`Self::allocate`], with best fit placing on `core_type` cores first on a hybrid part
    /// (the `cpusetd.io/core-type` annotation). kubelet's placement ignores `core_type`.
    pub fn allocate_preferring(
        &self,
        request: usize,
        shared_pool: &CpuSet,
        numa_hint: Option<&CpuSet>,
        reusable: &CpuSet,
        core_type: CoreType,
    ) -> Result<CpuSet, AllocationError> {
        self.allocate_in(
            CpuPool::General,
            request,
            shared_pool,
            numa_hint,
            reusable,
            core_type,
        )
    }

    /// [`Self::allocate_preferring`] from `pool`. For the isolated pool `free` holds the
    /// isolated CPUs no one holds; every failure but a request that is not whole cores (and the
    /// scan's limit) is [`AllocationError::IsolatedPoolTooSmall`], and without an isolated pool
    /// the request is refused outright: it is never served from other CPUs.
    pub fn allocate_in(
        &self,
        pool: CpuPool,
        request: usize,
        free: &CpuSet,
        numa_hint: Option<&CpuSet>,
        reusable: &CpuSet,
        core_type: CoreType,
    ) -> Result<CpuSet, AllocationError> {
        if request == 0 || pool == CpuPool::General {
            return self.allocate_from(pool, request, free, numa_hint, reusable, core_type);
        }
        if !self.respect_isolcpus {
            return Err(AllocationError::IsolatedPoolOff);
        }
        if self.isolated_pool.is_empty() {
            return Err(AllocationError::NoIsolatedCpus {
                isolated: self.excluded.clone(),
            });
        }
        self.allocate_from(pool, request, free, numa_hint, reusable, core_type)
            .map_err(|cause| match cause {
                AllocationError::SmtNotMultipleOfCore { .. } | AllocationError::ScanIncomplete => {
                    cause
                }
                cause => AllocationError::IsolatedPoolTooSmall {
                    requested: request,
                    pool: self.isolated_pool.clone(),
                    cause: Box::new(cause),
                },
            })
    }

    /// [`Self::allocate_in`] past the isolated pool's own checks.
    fn allocate_from(
        &self,
        pool: CpuPool,
        request: usize,
        shared_pool: &CpuSet,
        numa_hint: Option<&CpuSet>,
        reusable: &CpuSet,
        core_type: CoreType,
    ) -> Result<CpuSet, AllocationError> {
        if request == 0 {
            return Ok(CpuSet::new());
        }
        let unavailable_physical = match pool {
            CpuPool::General => &self.unavailable_physical,
            CpuPool::Isolated => &self.isolated_unavailable_physical,
        };
        if self.options.full_pcpus_only {
            let group_size = self.cpu_group_size.max(1);
            if request % group_size != 0 {
                return Err(AllocationError::SmtNotMultipleOfCore {
                    requested: request,
                    cpus_per_core: self.cpu_group_size,
                });
            }
            let available_physical = shared_pool.difference(unavailable_physical).len();
            if request > available_physical {
                return Err(AllocationError::SmtNotEnoughPhysicalCpus {
                    available_physical,
                    requested: request,
                    cpus_per_core: self.cpu_group_size,
                });
            }
        }
        if let Some(best_fit) = &self.best_fit {
            let take = |available: &CpuSet, count: usize| match best_fit.take_preferring(
                &self.index,
                available,
                count,
                self.options.full_pcpus_only,
                core_type,
            ) {
                Some(cpus) => Ok(cpus),
                None => self.take_by_topology(available, count),
            };
            let placed = self.place((pool, request), shared_pool, numa_hint, reusable, take);
            if placed.is_ok() {
                return placed;
            }
        }
        self.place(
            (pool, request),
            shared_pool,
            numa_hint,
            reusable,
            |available, count| self.take_by_topology(available, count),
        )
    }

    /// [`Self::allocate`] after the admission checks, with `take` choosing the CPUs.
    fn place(
        &self,
        (pool, request): (CpuPool, usize),
        shared_pool: &CpuSet,
        numa_hint: Option<&CpuSet>,
        reusable: &CpuSet,
        take: impl Fn(&CpuSet, usize) -> Result<CpuSet, TakeError>,
    ) -> Result<CpuSet, AllocationError> {
        let hybrid_full_cores =
            self.options.full_pcpus_only && self.index.has_heterogeneous_cores();
        let mut allocatable = self.allocatable_in(pool, shared_pool).union(reusable);
        if hybrid_full_cores {
            allocatable = self.index.whole_core_cpus(&allocatable);
        }
        let mut result = CpuSet::new();
        if let Some(nodes) = numa_hint {
            let mut aligned = self.aligned_cpus(nodes, &allocatable);
            let mut count = request.min(aligned.len());
            if self.options.full_pcpus_only {
                // Whole free cores of the hinted nodes only, and a whole number of them: a lone
                // thread taken there (a hint with too little room, as a device's node may be)
                // would share its core with a reserved or another container's cpu.
                aligned = self.index.whole_core_cpus(&aligned);
                let group_size = self.cpu_group_size.max(1);
                count = request.min(aligned.len()) / group_size * group_size;
            }
            result = take(&aligned, count)?;
        }
        let rest = take(
            &allocatable.difference(&result),
            request.saturating_sub(result.len()),
        )?;
        result.extend_from(&rest);

        if result.len() != request || !result.is_subset(&allocatable) {
            return Err(AllocationError::InconsistentTopology {
                requested: request,
                cpus: result,
                allocatable,
            });
        }
        if hybrid_full_cores && self.index.whole_core_cpus(&result) != result {
            return Err(AllocationError::SmtSplitsCore {
                requested: request,
                cpus: result,
            });
        }
        // The isolated pool may be emptied: no container but its own runs there.
        if pool == CpuPool::General && !shared_pool.is_empty() && shared_pool.is_subset(&result) {
            return Err(AllocationError::WouldEmptySharedPool {
                requested: request,
                cpus: result,
            });
        }
        Ok(result)
    }

    /// kubelet's `getAlignedCPUs`: the allocatable CPUs of the hinted NUMA nodes, widened to
    /// their whole sockets with `align-by-socket`.
    /// The NUMA hint kubelet's Topology Manager would hand the CPU manager for `request` cpus
    /// if the CPU manager were its only hint provider and the policy `best-effort`
    /// (`generateCPUTopologyHints`, then the narrowest preferred hint): every set of NUMA
    /// nodes holding `request` available (or reusable) cpus and every reusable one is a
    /// candidate; those spanning the fewest sockets that could hold the request are preferred
    /// (`align-by-socket`); the narrowest (fewest nodes, then lowest ids) wins. `None` with
    /// more than 8 NUMA nodes (kubelet's limit) or no candidate.
    pub fn socket_aligned_hint(
        &self,
        request: usize,
        shared_pool: &CpuSet,
        reusable: &CpuSet,
    ) -> Option<CpuSet> {
        self.socket_aligned_hint_in(CpuPool::General, request, shared_pool, reusable)
    }

    /// [`Self::socket_aligned_hint`] over the CPUs of `pool`.
    pub fn socket_aligned_hint_in(
        &self,
        pool: CpuPool,
        request: usize,
        shared_pool: &CpuSet,
        reusable: &CpuSet,
    ) -> Option<CpuSet> {
        let ids = self.index.numa_node_ids();
        if ids.is_empty() || ids.len() > 8 || request == 0 {
            return None;
        }
        let available = self.allocatable_in(pool, shared_pool).union(reusable);
        let min_sockets = self.index.min_sockets_for(request);
        let mut best: Option<(bool, usize, u32, CpuSet)> = None;
        for mask in 1u32..(1 << ids.len()) {
            let nodes: CpuSet = ids
                .iter()
                .enumerate()
                .filter(|(bit, _)| mask & (1 << bit) != 0)
                .map(|(_, &id)| id)
                .collect();
            let cpus = self.index.numa_node_cpus(&nodes);
            if cpus.intersection(&available).len() < request || !reusable.is_subset(&cpus) {
                continue;
            }
            let preferred = self.index.sockets_of_numa_nodes(&nodes) == min_sockets;
            let key = (preferred, nodes.len(), mask);
            let better = match &best {
                None => true,
                Some((p, n, m, _)) => (key.0 && !p) || (key.0 == *p && (key.1, key.2) < (*n, *m)),
            };
            if better {
                best = Some((key.0, key.1, key.2, nodes));
            }
        }
        best.map(|(_, _, _, nodes)| nodes)
    }

    /// The NUMA nodes holding any of `cpus`.
    pub fn numa_nodes_of(&self, cpus: &CpuSet) -> CpuSet {
        self.index
            .numa_node_ids()
            .iter()
            .copied()
            .filter(|&id| {
                !self
                    .index
                    .numa_node_cpus(&CpuSet::from_iter([id]))
                    .is_disjoint(cpus)
            })
            .collect()
    }

    /// Whether `align-by-socket` is on (then the planner asks for [`Self::socket_aligned_hint`]).
    pub fn aligns_by_socket(&self) -> bool {
        self.options.align_by_socket
    }

    fn aligned_cpus(&self, numa_nodes: &CpuSet, allocatable: &CpuSet) -> CpuSet {
        let domain = if self.options.align_by_socket {
            self.index.socket_cpus_of_numa_nodes(numa_nodes)
        } else {
            self.index.numa_node_cpus(numa_nodes)
        };
        allocatable.intersection(&domain)
    }

    /// kubelet's `validateState` at start: an empty shared pool with no assignments is a fresh
    /// state and gets [`Self::initial_shared_pool`]; otherwise the saved pool and assignments
    /// must fit the reserved CPUs and the online CPUs. Returns the shared pool to use.
    pub fn validate_state(
        &self,
        shared_pool: &CpuSet,
        assignments: &Assignments,
    ) -> Result<CpuSet, StateError> {
        let expected = self.initial_shared_pool();
        if shared_pool.is_empty() {
            if !assignments.is_empty() {
                return Err(StateError::EmptySharedPoolWithAssignments);
            }
            return Ok(expected);
        }
        if self.options.strict_cpu_reservation {
            let present = self.reserved.intersection(shared_pool);
            if !present.is_empty() {
                return Err(StateError::StrictlyReservedInSharedPool {
                    cpus: present,
                    shared_pool: shared_pool.clone(),
                });
            }
        } else if !self.reserved.is_subset(shared_pool) {
            return Err(StateError::ReservedMissingFromSharedPool {
                reserved: self.reserved.clone(),
                shared_pool: shared_pool.clone(),
            });
        }
        for (pod, containers) in assignments {
            for (container, cpus) in containers {
                if !cpus.is_disjoint(shared_pool) {
                    return Err(StateError::AssignmentOverlapsSharedPool {
                        pod: pod.as_str().into(),
                        container: container.as_str().into(),
                        cpus: cpus.clone(),
                        shared_pool: shared_pool.clone(),
                    });
                }
            }
        }
        let mut in_state = shared_pool.clone();
        for cpus in assignments
            .values()
            .flat_map(|containers| containers.values())
        {
            in_state.extend_from(cpus);
        }
        if in_state != expected {
            return Err(StateError::CpusChanged { expected, in_state });
        }
        Ok(shared_pool.clone())
    }
}
