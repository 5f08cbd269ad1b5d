//! The desired `cpuset.cpus` / `cpuset.mems` of every scanned cgroup (DESIGN.md §5).
//!
//! * kubepods root: every CPU any pod may use; QoS directories: the shared pool;
//! * a container: its exclusive set or the shared pool (both, for a `cpu-shared.crio.io/<name>`
//!   container that holds exclusive CPUs); a sandbox: the shared pool;
//! * a pod: the union of its children (the shared pool while it has none);
//! * a cgroup a container made itself (or anything below an unknown directory): its current set
//!   ∩ its parent's new set, or the parent's new set where that is empty;
//! * any other unknown directory: the shared pool;
//! * `cpuset.mems`: all memory nodes, or with `--align-memory` the memory nodes of an exclusive
//!   set's NUMA nodes.
//!
//! A last pass clamps every value into its parent's, so the tree nests whatever the input.
//! A cgroup without the interface file is left alone (`None`).
//!
//! On cgroup v2 a cgroup whose `cpuset.cpus` (`cpuset.mems`) is empty follows its parent's
//! effective set (cgroup-v2.rst, "cpuset.cpus.effective"), and runtimes leave it empty when
//! kubelet sets none. Such a cgroup stays empty where what it would follow is what it is to
//! have ([`DesiredCgroup::cpus_inherited`]): the shared pool is then written on the QoS
//! directories (and the kubepods root where it differs from its parent's) and on the shared
//! members of Guaranteed pods, not on every shared container. A pod whose file is empty always
//! follows its parent: on v2 a parent bounds only its children's effective sets, never their
//! own, and every pod's parent holds all its children hold. v1 has no such inheritance (an
//! empty v1 cpuset is one not set up yet): nothing changes there.

use std::borrow::Borrow;
use std::collections::HashMap;

use crate::cgroupfs::{FileValue, Scan};
use crate::classify::{CgroupKind, Classification, UnknownReason};
use crate::cpuset::CpuSet;
use crate::state::Assignments;
use crate::topology::Topology;

/// The pools the desired tree is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    /// Every CPU pods may use: the kubepods root.
    pub pod_cpus: CpuSet,
    /// `pod_cpus` minus every exclusive assignment.
    pub shared: CpuSet,
    /// Every memory node.
    pub memory_nodes: CpuSet,
}

/// Desired values of one cgroup; `None` = leave the file alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DesiredCgroup {
    /// The cpus it is to run on: written, or (`cpus_inherited`) followed from its parent.
    pub cpus: Option<CpuSet>,
    pub mems: Option<CpuSet>,
    /// cgroup v2 only: its `cpuset.cpus` is empty and stays so; the kernel gives it `cpus`,
    /// its parent's effective set (read in `cpuset.cpus.effective`). Nothing is written.
    pub cpus_inherited: bool,
    /// The same for `cpuset.mems` and `mems`.
    pub mems_inherited: bool,
}

impl DesiredCgroup {
    /// The `cpuset.cpus` to write: `cpus` unless it is inherited.
    pub fn cpus_to_write(&self) -> Option<&CpuSet> {
        self.cpus.as_ref().filter(|_| !self.cpus_inherited)
    }

    /// The `cpuset.mems` to write: `mems` unless it is inherited.
    pub fn mems_to_write(&self) -> Option<&CpuSet> {
        self.mems.as_ref().filter(|_| !self.mems_inherited)
    }
}

/// The index of each cgroup's parent in the scan (parents come first in a scan).
pub fn parent_indexes(scan: &Scan) -> Vec<Option<usize>> {
    let index: HashMap<&[u8], usize> = scan
        .cgroups
        .iter()
        .enumerate()
        .map(|(i, c)| (c.relative.as_bytes(), i))
        .collect();
    scan.cgroups
        .iter()
        .map(|c| {
            c.relative
                .parent_bytes()
                .and_then(|p| index.get(p).copied())
        })
        .collect()
}

/// What the desired sets are made of besides the tree.
struct Sources<'a> {
    assignments: &'a Assignments,
    pools: &'a Pools,
    topology: &'a Topology,
    align_memory: bool,
}

/// Computes the desired tree. `classes[i]` classifies `scan.cgroups[i]`.
pub fn desired_tree<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    parents: &[Option<usize>],
    assignments: &Assignments,
    pools: &Pools,
    topology: &Topology,
    align_memory: bool,
) -> Vec<DesiredCgroup> {
    let n = scan.cgroups.len();
    let sources = Sources {
        assignments,
        pools,
        topology,
        align_memory,
    };
    let (mut cpus, mut mems) = forward_pass(scan, classes, parents, &sources);
    pod_unions(classes, parents, pools, &mut cpus, &mut mems);

    // Clamp into the parent, in pre-order, so the tree nests whatever the classification said.
    for i in 0..n {
        if let Some(p) = parents[i] {
            cpus[i] = clamp(cpus[i].take(), cpus[p].as_ref());
            mems[i] = clamp(mems[i].take(), mems[p].as_ref());
        }
    }

    // A cgroup without the interface file is not a cpuset cgroup: leave it alone.
    let mut desired: Vec<DesiredCgroup> = (0..n)
        .map(|i| DesiredCgroup {
            cpus: cpus[i]
                .take()
                .filter(|_| !scan.cgroups[i].cpus.is_missing()),
            mems: mems[i]
                .take()
                .filter(|_| !scan.cgroups[i].mems.is_missing()),
            cpus_inherited: false,
            mems_inherited: false,
        })
        .collect();
    if scan.inherits {
        mark_inherited(scan, classes, parents, &mut desired);
    }
    desired
}

/// cgroup v2: marks the cgroups that follow their parent's effective set (see the module's
/// documentation), in pre-order, so a cgroup's parent is decided first. What a cgroup follows
/// is its parent's desired set (written or itself followed); for the kubepods root, whose
/// parent the scan does not hold, what it shows in force now (an empty cgroup's effective set
/// is its parent's). A pod that follows takes that set as its desired one.
fn mark_inherited<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    parents: &[Option<usize>],
    desired: &mut [DesiredCgroup],
) {
    for i in 0..desired.len() {
        let cgroup = &scan.cgroups[i];
        let pod = classes[i].borrow().kind == CgroupKind::Pod;
        let followed_cpus = match parents[i] {
            Some(p) => desired[p].cpus.clone(),
            None => cgroup.effective_cpus.value().cloned(),
        };
        let followed_mems = parents[i].and_then(|p| desired[p].mems.clone());
        let d = &mut desired[i];
        if let Some(followed) = followed_cpus.filter(|f| !f.is_empty()) {
            if empty(&cgroup.cpus) && (pod || d.cpus.as_ref() == Some(&followed)) {
                d.cpus = d.cpus.as_ref().map(|_| followed);
                d.cpus_inherited = d.cpus.is_some();
            }
        }
        if let Some(followed) = followed_mems.filter(|f| !f.is_empty()) {
            if empty(&cgroup.mems) && (pod || d.mems.as_ref() == Some(&followed)) {
                d.mems = d.mems.as_ref().map(|_| followed);
                d.mems_inherited = d.mems.is_some();
            }
        }
    }
}

/// The file was read and is empty (v2: the cgroup follows its parent).
fn empty(value: &FileValue<CpuSet>) -> bool {
    value.value().is_some_and(CpuSet::is_empty)
}

/// Forward pass: every cgroup but pods (parents are computed before children).
fn forward_pass<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    parents: &[Option<usize>],
    sources: &Sources<'_>,
) -> (Vec<Option<CpuSet>>, Vec<Option<CpuSet>>) {
    let n = scan.cgroups.len();
    let mut cpus: Vec<Option<CpuSet>> = vec![None; n];
    let mut mems: Vec<Option<CpuSet>> = vec![None; n];
    for i in 0..n {
        let parent_cpus = parents[i].and_then(|p| cpus[p].clone());
        let parent_mems = parents[i].and_then(|p| mems[p].clone());
        let parent_now = parents[i].map(|p| &scan.cgroups[p]);
        let (c, m) = match &classes[i].borrow().kind {
            CgroupKind::ContainerChild
            | CgroupKind::Unknown {
                reason: UnknownReason::BelowUnknown { .. },
            } => {
                let cgroup = &scan.cgroups[i];
                (
                    inherit(
                        &cgroup.cpus,
                        parent_now.map(|p| &p.cpus),
                        parent_cpus.as_ref(),
                    ),
                    inherit(
                        &cgroup.mems,
                        parent_now.map(|p| &p.mems),
                        parent_mems.as_ref(),
                    ),
                )
            }
            _ => own_sets(classes[i].borrow(), sources),
        };
        cpus[i] = c;
        mems[i] = m;
    }
    (cpus, mems)
}

/// The sets of a cgroup that does not take them from its parent (a pod's come later).
fn own_sets(class: &Classification, sources: &Sources<'_>) -> (Option<CpuSet>, Option<CpuSet>) {
    let pools = sources.pools;
    let shared = || (Some(pools.shared.clone()), Some(pools.memory_nodes.clone()));
    match &class.kind {
        CgroupKind::KubepodsRoot => (
            Some(pools.pod_cpus.clone()),
            Some(pools.memory_nodes.clone()),
        ),
        CgroupKind::Pod => (None, None),
        CgroupKind::Container => {
            let exclusive = class
                .assignment_key()
                .and_then(|k| sources.assignments.get(&k))
                .map(|a| a.cpus.clone());
            match exclusive {
                // `cpu-shared.crio.io/<name>`: the shared pool besides its own CPUs (the
                // pool's memory nodes too, as a shared container has).
                Some(set) if class.cpu_shared => (
                    Some(set.union(&pools.shared)),
                    Some(pools.memory_nodes.clone()),
                ),
                Some(set) => {
                    let m = if sources.align_memory {
                        aligned_mems(&set, sources.topology, &pools.memory_nodes)
                    } else {
                        pools.memory_nodes.clone()
                    };
                    (Some(set), Some(m))
                }
                None => shared(),
            }
        }
        // Any other unknown directory, a QoS directory, a sandbox: the shared pool.
        _ => shared(),
    }
}

/// Pods: the union of their children (as the forward pass left them: all unions are taken
/// before any pod is set); the shared pool while they have none. One walk over the cgroups,
/// not one per pod.
fn pod_unions<C: Borrow<Classification>>(
    classes: &[C],
    parents: &[Option<usize>],
    pools: &Pools,
    cpus: &mut [Option<CpuSet>],
    mems: &mut [Option<CpuSet>],
) {
    let n = classes.len();
    let mut unions: Vec<Option<(CpuSet, CpuSet)>> = vec![None; n];
    for j in 0..n {
        let Some(i) = parents[j].filter(|&i| i < j && classes[i].borrow().kind == CgroupKind::Pod)
        else {
            continue;
        };
        let (c, m) = unions[i].get_or_insert_with(Default::default);
        c.extend_from(cpus[j].as_ref().unwrap_or(&pools.shared));
        m.extend_from(mems[j].as_ref().unwrap_or(&pools.memory_nodes));
    }
    for i in 0..n {
        if classes[i].borrow().kind != CgroupKind::Pod {
            continue;
        }
        let (c, m) = unions[i].take().unwrap_or_default();
        cpus[i] = Some(if c.is_empty() {
            pools.shared.clone()
        } else {
            c
        });
        mems[i] = Some(if m.is_empty() {
            pools.memory_nodes.clone()
        } else {
            m
        });
    }
}

/// `current ∩ parent`, or the parent's value where that is empty or unknown.
/// What a cgroup below a container gets: a cgroup that holds exactly what its parent holds
/// now follows its parent (narrowed and widened with it: a container's own sub-cgroups, which
/// runtimes create with the parent's set); one with a set of its own keeps the part of it
/// inside the parent's new set (all of the parent's when nothing is left).
fn inherit(
    current: &FileValue<CpuSet>,
    parent_now: Option<&FileValue<CpuSet>>,
    parent: Option<&CpuSet>,
) -> Option<CpuSet> {
    let parent = parent?;
    let current = current.configured();
    if current.is_some() && current == parent_now.and_then(FileValue::configured) {
        return Some(parent.clone());
    }
    let kept = current
        .map(|c| c.intersection(parent))
        .filter(|c| !c.is_empty());
    Some(kept.unwrap_or_else(|| parent.clone()))
}

fn clamp(value: Option<CpuSet>, parent: Option<&CpuSet>) -> Option<CpuSet> {
    match (value, parent) {
        (Some(v), Some(p)) => {
            let within = v.intersection(p);
            Some(if within.is_empty() { p.clone() } else { within })
        }
        (v, _) => v,
    }
}

/// The memory nodes of the NUMA nodes an exclusive set spans; all nodes if none has memory.
fn aligned_mems(cpus: &CpuSet, topology: &Topology, memory_nodes: &CpuSet) -> CpuSet {
    let nodes: CpuSet = cpus
        .iter()
        .filter_map(|id| topology.cpu(id).map(|c| c.numa))
        .collect();
    let with_memory = nodes.intersection(memory_nodes);
    if with_memory.is_empty() {
        memory_nodes.clone()
    } else {
        with_memory
    }
}
