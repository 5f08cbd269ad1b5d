//! The nesting-safe order of cpuset writes (DESIGN.md §5).
//!
//! cgroup v1 refuses a child cpuset that is not a subset of its parent, and a parent that would
//! drop CPUs a child still uses (EBUSY). Given every cgroup's current and desired set, a plan is
//! two phases: **widen** top-down, writing `current ∪ desired` where that differs from current,
//! then **narrow** bottom-up, writing `desired` where the widened value differs from it. After
//! every single write, every child is a subset of its parent. Nothing is written where nothing
//! changes, and an empty set is never written.
//!
//! The order the writer makes a plan's [`Step`]s in is decided here too, and only here: plan
//! order ([`order_writes`] per file, then the quota steps), or the urgent steps first with what
//! they depend on ([`urgent_first`]). The writer executes a prefix of a [`WritePlan`] as it is.

use std::collections::{HashMap, HashSet};

use super::{Plan, Step, WriteStep};
use crate::cgroupfs::{CgroupPath, InterfaceFile, Scan};
use crate::cpuset::CpuSet;

/// Which of the two phases a write belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Widen,
    Narrow,
}

/// One cgroup of a tree to order writes for. `parent` is the index of the parent node, which
/// must come before this node in the slice (parents before children).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetNode {
    pub parent: Option<usize>,
    /// The value in the file now. Empty on cgroup v1 means "not yet initialised".
    pub current: CpuSet,
    /// The value the planner wants. Empty means "leave alone".
    pub desired: CpuSet,
}

/// One ordered write: set node `node` to `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetWrite {
    pub node: usize,
    pub value: CpuSet,
    pub phase: Phase,
}

/// Orders the writes that take every node from `current` to `desired` without breaking the
/// nesting rule at any step. Nodes with an empty `desired` are not written.
///
/// # Panics
/// In debug builds, when a node's parent index is not smaller than its own.
pub fn order_writes(nodes: &[SetNode]) -> Vec<SetWrite> {
    let mut writes = Vec::new();
    // Value of each node after the widen phase.
    let mut widened: Vec<CpuSet> = Vec::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        debug_assert!(node.parent.is_none_or(|p| p < index), "parent after child");
        if node.desired.is_empty() || node.desired == node.current {
            widened.push(node.current.clone());
            continue;
        }
        let wide = node.current.union(&node.desired);
        if wide != node.current {
            writes.push(SetWrite {
                node: index,
                value: wide.clone(),
                phase: Phase::Widen,
            });
        }
        widened.push(wide);
    }
    for (index, node) in nodes.iter().enumerate().rev() {
        if !node.desired.is_empty() && widened[index] != node.desired {
            writes.push(SetWrite {
                node: index,
                value: node.desired.clone(),
                phase: Phase::Narrow,
            });
        }
    }
    writes
}

/// The ordered steps of one pass: the first [`WritePlan::urgent_len`] of them are the urgent
/// ones (with what they depend on), the writer's smallest budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WritePlan {
    steps: Vec<Step>,
    urgent: usize,
}

impl WritePlan {
    pub fn with_capacity(capacity: usize) -> WritePlan {
        WritePlan {
            steps: Vec::with_capacity(capacity),
            urgent: 0,
        }
    }

    /// How many of the first steps are urgent.
    pub fn urgent_len(&self) -> usize {
        self.urgent
    }

    /// Appends a step after every other (a valid order stays valid: the step is the last).
    pub fn push(&mut self, step: Step) {
        self.steps.push(step);
    }

    /// Keeps the steps `keep` says, in their order (a subset of a valid order keeps the
    /// nesting rules when what it leaves out is left out with everything it depends on: the
    /// caller's promise, see the incremental pass).
    pub fn retain(&mut self, mut keep: impl FnMut(&Step) -> bool) {
        self.steps.retain(|s| keep(s));
        self.urgent = self.steps.iter().take_while(|s| s.urgent).count();
    }

    /// The steps, in order.
    pub fn into_steps(self) -> Vec<Step> {
        self.steps
    }
}

impl std::ops::Deref for WritePlan {
    type Target = [Step];
    fn deref(&self) -> &[Step] {
        &self.steps
    }
}

impl Extend<Step> for WritePlan {
    fn extend<I: IntoIterator<Item = Step>>(&mut self, steps: I) {
        self.steps.extend(steps);
    }
}

impl<'p> IntoIterator for &'p WritePlan {
    type Item = &'p Step;
    type IntoIter = std::slice::Iter<'p, Step>;
    fn into_iter(self) -> Self::IntoIter {
        self.steps.iter()
    }
}

impl From<Vec<Step>> for WritePlan {
    fn from(steps: Vec<Step>) -> WritePlan {
        WritePlan { steps, urgent: 0 }
    }
}

impl IntoIterator for WritePlan {
    type Item = Step;
    type IntoIter = std::vec::IntoIter<Step>;
    fn into_iter(self) -> Self::IntoIter {
        self.steps.into_iter()
    }
}

/// Puts the steps `urgent` names first, with every earlier step of the plan they depend on
/// (the same file of their own cgroup, its parent or its children, so the v1 nesting rules
/// hold for them alone), in plan order; then the others, in plan order. That is a valid order
/// when the plan's is: no other step precedes an urgent one it is related to (it would be
/// urgent too), so each step still sees its parent and children as the plan's order would have
/// them. The steps moved first are marked [`Step::urgent`]. Applied again (more urgent steps),
/// it keeps the order valid for the same reason.
pub fn urgent_first(plan: &mut WritePlan, urgent: impl Fn(&Step) -> bool) {
    let marked = urgent_closure(&plan.steps, urgent);
    let count = marked.iter().filter(|&&m| m).count();
    if count == 0 {
        return;
    }
    let (mut first, mut rest) = (Vec::with_capacity(count), Vec::new());
    for (mut step, marked) in std::mem::take(&mut plan.steps).into_iter().zip(marked) {
        step.urgent = marked;
        if marked {
            first.push(step);
        } else {
            rest.push(step);
        }
    }
    first.extend(rest);
    plan.steps = first;
    plan.urgent = count;
}

/// Per step, whether it is urgent or an urgent step depends on it (see [`urgent_first`]).
fn urgent_closure(steps: &[Step], urgent: impl Fn(&Step) -> bool) -> Vec<bool> {
    let mut marked: Vec<bool> = steps.iter().map(|s| s.urgent || urgent(s)).collect();
    if !marked.contains(&true) {
        return marked;
    }
    type Key<'a> = (&'a [u8], InterfaceFile);
    let mut by_cgroup: HashMap<Key<'_>, Vec<usize>> = HashMap::new();
    let mut by_parent: HashMap<Key<'_>, Vec<usize>> = HashMap::new();
    for (index, step) in steps.iter().enumerate() {
        by_cgroup
            .entry((step.path.as_bytes(), step.file))
            .or_default()
            .push(index);
        if let Some(parent) = step.path.parent_bytes() {
            by_parent
                .entry((parent, step.file))
                .or_default()
                .push(index);
        }
    }
    // From the last step back: each marked step marks the earlier steps of the same file of
    // its own cgroup, its parent and its children (those marked later are visited later).
    for k in (0..steps.len()).rev() {
        if !marked[k] {
            continue;
        }
        let (path, file) = (steps[k].path.as_bytes(), steps[k].file);
        let own = by_cgroup.get(&(path, file));
        let parent = steps[k]
            .path
            .parent_bytes()
            .and_then(|p| by_cgroup.get(&(p, file)));
        let children = by_parent.get(&(path, file));
        for &j in [own, parent, children].into_iter().flatten().flatten() {
            if j < k {
                marked[j] = true;
            }
        }
    }
    marked
}

/// The plan of a drift repair without planning: each drifted cgroup's `cpuset.cpus` back to
/// the value the last plan gave it, parents first (a foreign narrowing of a parent took its
/// children along, and they get their cpus back only within it); every step is urgent.
pub fn repairs(repairs: impl IntoIterator<Item = (CgroupPath, CpuSet)>) -> WritePlan {
    let mut steps: Vec<Step> = repairs
        .into_iter()
        .map(|(path, cpus)| Step {
            path,
            file: InterfaceFile::CpusetCpus,
            value: cpus.to_string(),
            // Top-down, as a widening is.
            step: WriteStep::Widen,
            urgent: true,
        })
        .collect();
    steps.sort_by_key(|s| s.path.depth());
    let urgent = steps.len();
    WritePlan { steps, urgent }
}

/// A cgroup of a tree given by path (see [`tree_steps`]): its path, its set now and the set
/// wanted (empty: left alone).
pub type PathNode = (CgroupPath, CpuSet, CpuSet);

/// The steps that take each cgroup of `tree` from its `file`'s set now to the one wanted, in
/// the plan's order ([`order_writes`]: widen top-down, then narrow bottom-up, so that every
/// single write keeps each child within its parent); nothing where nothing changes. `tree`
/// lists parents before children; a cgroup whose parent is not listed is a top of its own
/// (list the parents, left alone, for their sets to count). Not urgent. What the host
/// cpusets of `--isolate-host` (`sched_balance`, outside the scan) are written in: confined to
/// the reserved cpus, and given their own back.
pub fn tree_steps(file: InterfaceFile, tree: &[PathNode]) -> Vec<Step> {
    let index: HashMap<&[u8], usize> = tree
        .iter()
        .enumerate()
        .map(|(i, (path, ..))| (path.as_bytes(), i))
        .collect();
    let nodes: Vec<SetNode> = tree
        .iter()
        .enumerate()
        .map(|(i, (path, current, desired))| SetNode {
            parent: path
                .parent_bytes()
                .and_then(|p| index.get(p).copied())
                .filter(|&p| p < i),
            current: current.clone(),
            desired: desired.clone(),
        })
        .collect();
    order_writes(&nodes)
        .into_iter()
        .map(|w| {
            Step::new(
                tree[w.node].0.clone(),
                file,
                w.value.to_string(),
                w.phase.into(),
            )
        })
        .collect()
}

impl From<Phase> for WriteStep {
    fn from(phase: Phase) -> WriteStep {
        match phase {
            Phase::Widen => WriteStep::Widen,
            Phase::Narrow => WriteStep::Narrow,
        }
    }
}

/// Parents before children (by depth; among cgroups of one depth the order is kept). The
/// order of the per-cgroup files whose value below must fit within the value above:
/// * `cpuset.sched_load_balance` put back (`sched_balance`, v1): while the root cpuset
///   balances, the kernel makes one scheduler domain of every cpu whatever the flags below
///   say (`generate_sched_domains`); the root's flag first makes every cpu balanced again at
///   the first write, and the writes below it change no domain. Stopped half way (an error),
///   the cpus are balanced already. The kernel itself takes the flags in any order.
/// * `cpuset.cpus.exclusive` claimed (`sched_balance`, v2): a cgroup's exclusive cpus must
///   be within its parent's (the kernel refuses others, EINVAL), so the chain is claimed from
///   kubepods down to the container.
pub fn parents_first<T>(items: &mut [T], path: impl Fn(&T) -> &CgroupPath) {
    items.sort_by_key(|item| path(item).depth());
}

/// Children before parents (by depth, deepest first; among cgroups of one depth the order is
/// kept). The reverse of [`parents_first`], for:
/// * `cpuset.sched_load_balance` turned off (`sched_balance`, v1): the domains change only
///   once the whole chain up to the root is 0 (while the root balances every cpu is in one
///   domain), so the container's flag first and the root's last leaves the domains as they
///   are until the last write, which changes them once, into the final shape. Stopped half way
///   (an error), the root still balances: nothing changed in effect. The kernel itself takes
///   the flags in any order.
/// * `cpuset.cpus.exclusive` released (`sched_balance`, v2): a parent's exclusive cpus must
///   keep every child's (the kernel refuses the write, EBUSY), and a sibling can claim cpus
///   only once no other sibling holds them (EINVAL), so every release, from the container up,
///   comes before any claim.
pub fn children_first<T>(items: &mut [T], path: impl Fn(&T) -> &CgroupPath) {
    items.sort_by_key(|item| std::cmp::Reverse(path(item).depth()));
}

/// A cgroup below the scan's depth limit as the writer read it (the plan never saw it), and
/// what its file holds.
pub type Unseen = (CgroupPath, CpuSet);

/// The steps that let `step` (a narrowing) be made over cgroups below the scan's depth limit
/// that hold more: `found` is `step`'s cgroup and the cgroups below it as read (parents before
/// children). Each keeps what it holds of its parent's new value (all of it when nothing), as
/// the plan narrows a known cgroup, in the plan's order ([`order_writes`]: widen top-down where
/// it holds none of it, then narrow bottom-up, `step`'s cgroup last); an empty one (v1: never
/// set up) is left alone. Urgent when `step` is.
pub fn narrow_unseen(step: &Step, found: &[Unseen]) -> WritePlan {
    let Ok(value) = CpuSet::parse(&step.value) else {
        return WritePlan::default();
    };
    let index: HashMap<&[u8], usize> = found
        .iter()
        .enumerate()
        .map(|(i, (path, _))| (path.as_bytes(), i))
        .collect();
    // What each would hold: through an empty cgroup, what its parent would.
    let mut within: Vec<CpuSet> = Vec::with_capacity(found.len());
    let mut nodes: Vec<SetNode> = Vec::with_capacity(found.len());
    for (i, (path, held)) in found.iter().enumerate() {
        let parent = path.parent_bytes().and_then(|p| index.get(p).copied());
        let parent = parent.filter(|&p| p < i);
        let wanted = match parent {
            None => value.clone(),
            Some(p) => match held.intersection(&within[p]) {
                kept if kept.is_empty() => within[p].clone(),
                kept => kept,
            },
        };
        let desired = if held.is_empty() {
            CpuSet::new()
        } else {
            wanted.clone()
        };
        nodes.push(SetNode {
            parent,
            current: held.clone(),
            desired,
        });
        within.push(wanted);
    }
    let steps: Vec<Step> = order_writes(&nodes)
        .into_iter()
        .map(|w| Step {
            path: found[w.node].0.clone(),
            file: step.file,
            value: w.value.to_string(),
            step: match w.phase {
                Phase::Widen => WriteStep::Widen,
                Phase::Narrow => WriteStep::Narrow,
            },
            urgent: step.urgent,
        })
        .collect();
    let urgent = if step.urgent { steps.len() } else { 0 };
    WritePlan { steps, urgent }
}

impl Plan {
    /// Per scanned cgroup, whether its steps are urgent: it gets exclusive cpus (a pin), or
    /// its drift (`drifted`) is repaired. The others (the shared pool's rewrites) may be held
    /// back while new cgroups arrive. The plan's steps are put in that order
    /// ([`urgent_first`]).
    pub fn urgent_first(&mut self, scan: &Scan, drifted: &HashSet<CgroupPath>) -> Vec<bool> {
        let shared = self.pools.as_ref().map(|p| &p.shared);
        let urgent: Vec<bool> = scan
            .cgroups
            .iter()
            .zip(&self.desired)
            .map(|(cgroup, desired)| {
                let pinned = match (&desired.cpus, shared) {
                    (Some(cpus), Some(shared)) => !cpus.is_empty() && cpus.is_disjoint(shared),
                    _ => false,
                };
                pinned || (!drifted.is_empty() && drifted.contains(&cgroup.path))
            })
            .collect();
        let paths: HashSet<&CgroupPath> = scan
            .cgroups
            .iter()
            .zip(&urgent)
            .filter(|(_, &u)| u)
            .map(|(c, _)| &c.path)
            .collect();
        if !paths.is_empty() {
            urgent_first(&mut self.writes, |s| paths.contains(&s.path));
        }
        urgent
    }
}

/// Plays cgroup v1's cpuset rules on a tree of values: what a test uses to prove that a write
/// order is one the kernel accepts. It refuses exactly what the kernel refuses for `cpuset.cpus`
/// and `cpuset.mems`: an empty value (on a cgroup with tasks; here always, since cpusetd never
/// writes one), a value not within the parent's, and a value that drops what a child holds.
#[derive(Debug, Clone)]
pub struct NestingChecker {
    parents: Vec<Option<usize>>,
    values: Vec<CpuSet>,
}

/// Why the kernel would refuse a write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NestingViolation {
    #[error("node {node}: empty value")]
    Empty { node: usize },
    #[error("node {node}: {value} is not within its parent's {parent}")]
    NotWithinParent {
        node: usize,
        value: CpuSet,
        parent: CpuSet,
    },
    #[error("node {node}: {value} drops cpus its child {child} holds ({held})")]
    ChildBusy {
        node: usize,
        value: CpuSet,
        child: usize,
        held: CpuSet,
    },
}

impl NestingChecker {
    pub fn new(nodes: &[SetNode]) -> Self {
        NestingChecker {
            parents: nodes.iter().map(|n| n.parent).collect(),
            values: nodes.iter().map(|n| n.current.clone()).collect(),
        }
    }

    pub fn value(&self, node: usize) -> &CpuSet {
        &self.values[node]
    }

    /// Applies one write if the kernel would accept it.
    pub fn write(&mut self, node: usize, value: &CpuSet) -> Result<(), NestingViolation> {
        if value.is_empty() {
            return Err(NestingViolation::Empty { node });
        }
        if let Some(parent) = self.parents[node] {
            // An uninitialised (empty) parent would have no initialised children in a real tree.
            let pv = &self.values[parent];
            if !value.is_subset(pv) {
                return Err(NestingViolation::NotWithinParent {
                    node,
                    value: value.clone(),
                    parent: pv.clone(),
                });
            }
        }
        for (child, parent) in self.parents.iter().enumerate() {
            if *parent == Some(node) && !self.values[child].is_subset(value) {
                return Err(NestingViolation::ChildBusy {
                    node,
                    value: value.clone(),
                    child,
                    held: self.values[child].clone(),
                });
            }
        }
        self.values[node] = value.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    fn node(parent: Option<usize>, current: &str, desired: &str) -> SetNode {
        SetNode {
            parent,
            current: set(current),
            desired: set(desired),
        }
    }

    #[test]
    fn shrinking_a_parent_under_a_child_narrows_the_child_first() {
        // root 0-7 → pod 0-7 → container 0-7; the container gets 2-3 exclusively while the
        // shared QoS sibling shrinks to 0-1,4-7.
        let nodes = vec![
            node(None, "0-7", "0-7"),
            node(Some(0), "0-7", "0-1,4-7"),
            node(Some(1), "0-7", "0-1,4-7"),
            node(Some(0), "0-7", "2-3"),
            node(Some(3), "0-7", "2-3"),
        ];
        let writes = order_writes(&nodes);
        let order: Vec<(usize, String, Phase)> = writes
            .iter()
            .map(|w| (w.node, w.value.to_string(), w.phase))
            .collect();
        assert_eq!(
            order,
            vec![
                (4, "2-3".into(), Phase::Narrow),
                (3, "2-3".into(), Phase::Narrow),
                (2, "0-1,4-7".into(), Phase::Narrow),
                (1, "0-1,4-7".into(), Phase::Narrow),
            ]
        );
        let mut checker = NestingChecker::new(&nodes);
        for w in &writes {
            checker.write(w.node, &w.value).unwrap();
        }
    }

    #[test]
    fn moving_a_container_to_other_cpus_widens_first() {
        let nodes = vec![
            node(None, "0-3", "0-3"),
            node(Some(0), "0-1", "2-3"),
            node(Some(1), "0-1", "2-3"),
        ];
        let writes = order_writes(&nodes);
        let order: Vec<(usize, String, Phase)> = writes
            .iter()
            .map(|w| (w.node, w.value.to_string(), w.phase))
            .collect();
        assert_eq!(
            order,
            vec![
                (1, "0-3".into(), Phase::Widen),
                (2, "0-3".into(), Phase::Widen),
                (2, "2-3".into(), Phase::Narrow),
                (1, "2-3".into(), Phase::Narrow),
            ]
        );
    }

    #[test]
    fn the_wrong_order_is_refused_by_the_checker() {
        let nodes = vec![node(None, "0-3", "0-1"), node(Some(0), "0-3", "0-1")];
        let mut checker = NestingChecker::new(&nodes);
        let err = checker.write(0, &set("0-1")).unwrap_err();
        assert!(matches!(err, NestingViolation::ChildBusy { child: 1, .. }));
        let err = checker.write(1, &set("4")).unwrap_err();
        assert!(matches!(err, NestingViolation::NotWithinParent { .. }));
    }

    #[test]
    fn nothing_is_written_when_nothing_changes() {
        let nodes = vec![node(None, "0-3", "0-3"), node(Some(0), "1", "1")];
        assert!(order_writes(&nodes).is_empty());
    }

    #[test]
    fn uninitialised_cgroups_get_their_value_and_empty_desired_is_left_alone() {
        let nodes = vec![
            node(None, "0-3", "0-3"),
            node(Some(0), "", "1"),
            node(Some(0), "2", ""),
        ];
        let writes = order_writes(&nodes);
        assert_eq!(writes.len(), 1);
        assert_eq!(
            (writes[0].node, writes[0].value.to_string()),
            (1, "1".into())
        );
    }

    /// A random tree whose current and desired values each nest (child ⊆ parent).
    fn arb_tree() -> impl Strategy<Value = Vec<SetNode>> {
        (1usize..24)
            .prop_flat_map(|n| {
                (
                    proptest::collection::vec(any::<prop::sample::Index>(), n),
                    proptest::collection::vec(0u64..=u64::MAX, n),
                    proptest::collection::vec(0u64..=u64::MAX, n),
                    proptest::collection::vec(0u8..8, n),
                )
            })
            .prop_map(|(parents, cur_bits, new_bits, flags)| {
                let mut nodes: Vec<SetNode> = Vec::new();
                for i in 0..parents.len() {
                    let parent = (i > 0).then(|| parents[i].index(i));
                    let pick = |bits: u64, within: Option<&CpuSet>| -> CpuSet {
                        let mut s: CpuSet = (0..16).filter(|b| bits & (1 << b) != 0).collect();
                        if let Some(p) = within {
                            s = s.intersection(p);
                            if s.is_empty() {
                                s = p.clone();
                            }
                        } else if s.is_empty() {
                            s.insert(0);
                        }
                        s
                    };
                    let pc = parent.map(|p| nodes[p].current.clone());
                    let pd = parent.map(|p| nodes[p].desired.clone());
                    let mut current = pick(cur_bits[i], pc.as_ref());
                    let mut desired = pick(new_bits[i], pd.as_ref());
                    // Some cgroups are not initialised yet (v1: empty until the runtime copies).
                    if flags[i] == 0 && parent.is_some() {
                        current = CpuSet::new();
                    }
                    // Uninitialised and left alone (a cgroup the planner has no value for).
                    if flags[i] == 1 && parent.is_some() {
                        current = CpuSet::new();
                        desired = CpuSet::new();
                    }
                    nodes.push(SetNode {
                        parent,
                        current,
                        desired,
                    });
                }
                // Uninitialised nodes must have no initialised children; children of a
                // left-alone node keep a value within the parent's current and desired.
                for i in 0..nodes.len() {
                    if let Some(p) = nodes[i].parent {
                        if nodes[p].current.is_empty() {
                            nodes[i].current = CpuSet::new();
                        }
                        if nodes[p].desired.is_empty() {
                            nodes[i].desired = CpuSet::new();
                        }
                    }
                }
                nodes
            })
    }

    /// A path per node of a tree: `n0`, `n0/n3`, ... (parents come first).
    fn tree_paths(nodes: &[SetNode]) -> Vec<CgroupPath> {
        let mut paths: Vec<CgroupPath> = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            let name = format!("n{i}");
            paths.push(match n.parent {
                Some(p) => paths[p].join(std::ffi::OsStr::new(&name)).unwrap(),
                None => CgroupPath::new(&name).unwrap(),
            });
        }
        paths
    }

    fn steps_of(writes: &[SetWrite], paths: &[CgroupPath]) -> WritePlan {
        let steps: Vec<Step> = writes
            .iter()
            .map(|w| {
                let step = match w.phase {
                    Phase::Widen => WriteStep::Widen,
                    Phase::Narrow => WriteStep::Narrow,
                };
                Step::new(
                    paths[w.node].clone(),
                    InterfaceFile::CpusetCpus,
                    w.value.to_string(),
                    step,
                )
            })
            .collect();
        steps.into()
    }

    /// Every `urgent` step is in the plan's urgent prefix; the prefix alone, then the whole
    /// plan, are accepted write by write; the whole plan reaches every desired value.
    fn check_urgent_prefix(
        nodes: &[SetNode],
        node_of: &HashMap<&CgroupPath, usize>,
        plan: &WritePlan,
        urgent: impl Fn(&Step) -> bool,
    ) -> Result<(), TestCaseError> {
        let count = plan.urgent_len();
        prop_assert!(plan.iter().skip(count).all(|s| !urgent(s) && !s.urgent));
        prop_assert!(plan.iter().take(count).all(|s| s.urgent));
        for prefix in [count, plan.len()] {
            let mut checker = NestingChecker::new(nodes);
            for s in &plan[..prefix] {
                let value = CpuSet::parse(&s.value).unwrap();
                if let Err(e) = checker.write(node_of[&s.path], &value) {
                    return Err(TestCaseError::fail(format!(
                        "{e} in {plan:?} (urgent {count})"
                    )));
                }
            }
            if prefix == plan.len() {
                for (i, n) in nodes.iter().enumerate() {
                    let expect = if n.desired.is_empty() {
                        &n.current
                    } else {
                        &n.desired
                    };
                    prop_assert_eq!(checker.value(i), expect);
                }
            }
        }
        Ok(())
    }

    /// `--isolate-host`'s confinement (`sched_balance::plan_host_confinement`): below node 0
    /// (the root, never written), each cgroup with cpus keeps its reserved cpus within what its
    /// parent gets (the root's at the top), all of those where it has none; one without cpus is
    /// left alone (empty).
    fn host_confined(nodes: &[SetNode], reserved: &CpuSet) -> Vec<CpuSet> {
        let mut confined: Vec<CpuSet> = Vec::with_capacity(nodes.len());
        for n in nodes {
            let Some(p) = n.parent.filter(|_| !n.current.is_empty()) else {
                confined.push(CpuSet::new());
                continue;
            };
            let parent = if confined[p].is_empty() {
                &nodes[p].current
            } else {
                &confined[p]
            };
            let mut within = parent.intersection(reserved);
            if within.is_empty() {
                within = reserved.clone();
            }
            let kept = n.current.intersection(&within);
            confined.push(if kept.is_empty() { within } else { kept });
        }
        confined
    }

    /// Makes `tree`'s steps ([`tree_steps`]) on a checker holding its current sets, each write
    /// one the kernel must accept; returns what every cgroup holds after.
    fn make_tree_steps(
        tree: &[PathNode],
        parents: &[Option<usize>],
    ) -> Result<Vec<CpuSet>, TestCaseError> {
        let node_of: HashMap<&CgroupPath, usize> =
            tree.iter().enumerate().map(|(i, (p, ..))| (p, i)).collect();
        let nodes: Vec<SetNode> = tree
            .iter()
            .zip(parents)
            .map(|((_, current, desired), &parent)| SetNode {
                parent,
                current: current.clone(),
                desired: desired.clone(),
            })
            .collect();
        let steps = tree_steps(InterfaceFile::CpusetCpus, tree);
        let mut checker = NestingChecker::new(&nodes);
        for s in &steps {
            prop_assert_eq!(s.file, InterfaceFile::CpusetCpus);
            prop_assert!(!s.urgent);
            let (value, node) = (CpuSet::parse(&s.value).unwrap(), node_of[&s.path]);
            // Only a cgroup with a set wanted is written (never the root, never an empty one).
            prop_assert!(!tree[node].2.is_empty(), "{} written", s.path);
            if let Err(e) = checker.write(node, &value) {
                return Err(TestCaseError::fail(format!("{e} in {steps:?}")));
            }
        }
        Ok((0..tree.len()).map(|i| checker.value(i).clone()).collect())
    }

    proptest! {
        /// The plan's urgent steps first (and what they depend on), then the rest: the whole
        /// order and its urgent prefix (the writer's smallest budget) keep every write valid,
        /// and so does marking more steps urgent afterwards (a drift repair after the pins).
        #[test]
        fn urgent_steps_first_keep_children_within_parents(
            nodes in arb_tree(),
            urgent_bits in any::<u64>(),
            more_bits in any::<u64>(),
        ) {
            let paths = tree_paths(&nodes);
            let node_of: HashMap<&CgroupPath, usize> =
                paths.iter().enumerate().map(|(i, p)| (p, i)).collect();
            let mut plan = steps_of(&order_writes(&nodes), &paths);
            let picked = |bits: u64, s: &Step| bits & (1 << (node_of[&s.path] % 64)) != 0;
            urgent_first(&mut plan, |s| picked(urgent_bits, s));
            check_urgent_prefix(&nodes, &node_of, &plan, |s| picked(urgent_bits, s))?;
            urgent_first(&mut plan, |s| picked(more_bits, s));
            check_urgent_prefix(&nodes, &node_of, &plan, |s| {
                picked(urgent_bits, s) || picked(more_bits, s)
            })?;
        }

        /// The steps that narrow a cgroup over a subtree the plan never saw (below the scan's
        /// depth limit): every write is one the kernel accepts, and so is every urgent prefix
        /// (all of it, when the narrowing is urgent); the cgroup ends at its value, and every
        /// cgroup below that holds cpus ends within it.
        #[test]
        fn narrowings_below_the_scan_limit_keep_children_within_parents(
            nodes in arb_tree(),
            value_bits in any::<u16>(),
            urgent in any::<bool>(),
        ) {
            let paths = tree_paths(&nodes);
            let found: Vec<Unseen> = paths
                .iter()
                .zip(&nodes)
                .map(|(p, n)| (p.clone(), n.current.clone()))
                .collect();
            let mut value: CpuSet = (0..16).filter(|b| value_bits & (1 << b) != 0).collect();
            if value.is_empty() {
                value.insert(3);
            }
            let mut step = Step::new(
                paths[0].clone(),
                InterfaceFile::CpusetCpus,
                value.to_string(),
                WriteStep::Narrow,
            );
            step.urgent = urgent;
            let plan = narrow_unseen(&step, &found);
            prop_assert_eq!(plan.urgent_len(), if urgent { plan.len() } else { 0 });
            prop_assert!(plan.iter().all(|s| s.urgent == urgent && s.file == step.file));
            let node_of: HashMap<&CgroupPath, usize> =
                paths.iter().enumerate().map(|(i, p)| (p, i)).collect();
            let mut checker = NestingChecker::new(&nodes);
            for s in &plan {
                let written = CpuSet::parse(&s.value).unwrap();
                if let Err(e) = checker.write(node_of[&s.path], &written) {
                    return Err(TestCaseError::fail(format!("{e} in {plan:?}")));
                }
            }
            // The narrowing itself comes last: its children are within it by then.
            prop_assert!(plan.last().is_none_or(|s| s.path == paths[0]));
            prop_assert_eq!(checker.value(0), &value);
            for (i, n) in nodes.iter().enumerate() {
                let held = checker.value(i);
                prop_assert!(held.is_subset(&value) || n.current.is_empty(), "{i}: {held}");
            }
        }

        /// `--isolate-host`'s host cpusets (`sched_balance`) through [`tree_steps`]: confined to
        /// reserved cpus, then given back their own, with the cgroups made during the
        /// confinement (which copied their parent's narrowed cpus) given what their parent
        /// gets: every single write is one the kernel accepts, the root is never written, and
        /// each phase ends where it should.
        #[test]
        fn host_confinement_and_its_undoing_keep_children_within_parents(
            nodes in arb_tree(),
            reserved_bits in any::<u16>(),
            made_bits in any::<u32>(),
        ) {
            let paths = tree_paths(&nodes);
            let parents: Vec<Option<usize>> = nodes.iter().map(|n| n.parent).collect();
            let root = &nodes[0].current;
            let mut reserved: CpuSet =
                root.iter().filter(|c| reserved_bits & (1 << (c % 16)) != 0).collect();
            if reserved.is_empty() {
                reserved = root.clone();
            }
            let confined = host_confined(&nodes, &reserved);
            let tree: Vec<PathNode> = paths
                .iter()
                .zip(&nodes)
                .zip(&confined)
                .map(|((p, n), c)| (p.clone(), n.current.clone(), c.clone()))
                .collect();
            let held = make_tree_steps(&tree, &parents)?;
            for (i, n) in nodes.iter().enumerate() {
                let expect = if confined[i].is_empty() { &n.current } else { &confined[i] };
                prop_assert_eq!(&held[i], expect, "{}", i);
                prop_assert!(i == 0 || held[i].is_subset(&reserved) || n.current.is_empty());
            }
            // Made during the confinement: a leaf without cpus copies its parent's.
            let has_child: HashSet<usize> = parents.iter().flatten().copied().collect();
            let made: Vec<bool> = (0..nodes.len())
                .map(|i| {
                    nodes[i].current.is_empty()
                        && !has_child.contains(&i)
                        && nodes[i].parent.is_some_and(|p| !held[p].is_empty())
                        && made_bits & (1 << (i % 32)) != 0
                })
                .collect();
            let back: Vec<PathNode> = tree
                .iter()
                .enumerate()
                .map(|(i, (path, original, _))| {
                    let parent = nodes[i].parent.unwrap_or(0);
                    let (now, wanted) = match (i, made[i]) {
                        (0, _) => (held[0].clone(), CpuSet::new()),
                        (_, true) => (held[parent].clone(), nodes[parent].current.clone()),
                        _ => (held[i].clone(), original.clone()),
                    };
                    (path.clone(), now, wanted)
                })
                .collect();
            let after = make_tree_steps(&back, &parents)?;
            for (i, n) in nodes.iter().enumerate() {
                let parent = n.parent.unwrap_or(0);
                let expect = if made[i] { &nodes[parent].current } else { &n.current };
                prop_assert_eq!(&after[i], expect, "{}", i);
            }
        }

        #[test]
        fn every_single_write_keeps_children_within_parents(nodes in arb_tree()) {
            let writes = order_writes(&nodes);
            let mut checker = NestingChecker::new(&nodes);
            for w in &writes {
                prop_assert!(!w.value.is_empty());
                if let Err(e) = checker.write(w.node, &w.value) {
                    return Err(TestCaseError::fail(format!("{e} in {writes:?}")));
                }
            }
            for (i, n) in nodes.iter().enumerate() {
                let expect = if n.desired.is_empty() { &n.current } else { &n.desired };
                prop_assert_eq!(checker.value(i), expect);
            }
            // Planning again from the result writes nothing.
            let again: Vec<SetNode> = nodes
                .iter()
                .enumerate()
                .map(|(i, n)| SetNode { parent: n.parent, current: checker.value(i).clone(), desired: n.desired.clone() })
                .collect();
            prop_assert!(order_writes(&again).is_empty());
        }
    }
}
