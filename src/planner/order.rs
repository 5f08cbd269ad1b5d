//! The nesting-safe order of cpuset writes (DESIGN.md §5).
//!
//! cgroup v1 refuses a child cpuset that is not a subset of its parent, and a parent that would
//! drop CPUs a child still uses (EBUSY). Given every cgroup's current and desired set, a plan is
//! two phases: **widen** top-down, writing `current ∪ desired` where that differs from current,
//! then **narrow** bottom-up, writing `desired` where the widened value differs from it. After
//! every single write, every child is a subset of its parent. Nothing is written where nothing
//! changes, and an empty set is never written.

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

    proptest! {
        /// The writer's schedule (urgent writes and what they depend on first, then the rest)
        /// keeps every write valid, and so does stopping after the urgent ones or anywhere
        /// after them.
        #[test]
        fn urgent_writes_first_keep_children_within_parents(
            nodes in arb_tree(),
            urgent_bits in any::<u64>(),
        ) {
            use crate::cgroupfs::InterfaceFile;
            let writes = order_writes(&nodes);
            let keys: Vec<(usize, InterfaceFile)> =
                writes.iter().map(|w| (w.node, InterfaceFile::CpusetCpus)).collect();
            let parents: Vec<Option<usize>> = nodes.iter().map(|n| n.parent).collect();
            let urgent: Vec<bool> = (0..writes.len()).map(|i| urgent_bits & (1 << (i % 64)) != 0).collect();
            let (order, count) = crate::writer::schedule_order(&keys, &parents, Some(&urgent));
            prop_assert_eq!(order.len(), writes.len());
            for (i, &u) in urgent.iter().enumerate() {
                if u {
                    prop_assert!(order[..count].contains(&i));
                }
            }
            let mut checker = NestingChecker::new(&nodes);
            for &index in &order {
                let w = &writes[index];
                if let Err(e) = checker.write(w.node, &w.value) {
                    return Err(TestCaseError::fail(format!("{e} in {order:?} (urgent {count})")));
                }
            }
            for (i, n) in nodes.iter().enumerate() {
                let expect = if n.desired.is_empty() { &n.current } else { &n.desired };
                prop_assert_eq!(checker.value(i), expect);
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
