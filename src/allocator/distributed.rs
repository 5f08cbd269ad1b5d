//! kubelet's `takeByTopologyNUMADistributed` (`distribute-cpus-across-numa`): spread a request
//! evenly over the fewest NUMA nodes that can hold it, in groups of `group_size` CPUs.
//!
//! For each candidate number of NUMA nodes, every combination (in the accumulator's NUMA order)
//! is scored by the population standard deviation of the free CPUs each NUMA node would have
//! left, with kubelet's rounding to 3 decimals (Go `math.Round`, half away from zero, which is
//! Rust's `f64::round`). The lowest score wins, the first seen on ties. Each NUMA node's share is
//! then picked with the packed algorithm.
//!
//! kubelet keeps the best combination as the very slice its combination walker passed in, and
//! Go's `append` reuses that slice's backing array for later combinations of the same length
//! (for 4-, 6-, 7- and 8-member combinations). The chosen members are therefore whatever the
//! array holds when the walk ends, not necessarily the combination that scored best (fixed
//! upstream only after v1.34, kubernetes PR #141238). [`GoSlice`] reproduces that aliasing.
//!
//! One deliberate difference: where kubelet's round-robin hand-out of remainder groups can make
//! no progress (members whose free counts are not multiples of the group size), kubelet loops
//! forever; here that subset is skipped, and at allocation time it is an accounting error.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::rc::Rc;

use super::accumulator::{take_by_topology_packed, CpuAccumulator, CpuSortingStrategy, TakeError};
use super::index::TopologyIndex;
use crate::cpuset::CpuSet;

/// Go's `math.Round(x*1000)/1000`.
fn round_to_thousandths(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// kubelet's `standardDeviation`: population standard deviation around a mean rounded to 3
/// decimals, itself rounded to 3 decimals.
fn standard_deviation(values: &[i64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let count = values.len() as f64;
    let mean = round_to_thousandths(values.iter().map(|&v| v as f64).sum::<f64>() / count);
    let sum_of_squares: f64 = values
        .iter()
        .map(|&v| (v as f64 - mean) * (v as f64 - mean))
        .sum();
    round_to_thousandths((sum_of_squares / count).sqrt())
}

/// A Go `[]int` as kubelet's combination walker builds it with `append`: slices that share a
/// backing array see each other's writes.
#[derive(Debug, Clone)]
struct GoSlice {
    backing: Rc<RefCell<Vec<usize>>>,
    len: usize,
}

impl GoSlice {
    /// `[]int{}`: empty, capacity 0.
    fn empty() -> Self {
        GoSlice {
            backing: Rc::new(RefCell::new(Vec::new())),
            len: 0,
        }
    }

    /// Go's `append(s, value)`: writes in place while capacity lasts, else copies into a new
    /// array of twice the capacity (1 from empty; exact for the int slices and sizes here).
    fn append(&self, value: usize) -> GoSlice {
        let capacity = self.backing.borrow().len();
        if self.len < capacity {
            self.backing.borrow_mut()[self.len] = value;
            return GoSlice {
                backing: Rc::clone(&self.backing),
                len: self.len + 1,
            };
        }
        let new_capacity = if capacity == 0 { 1 } else { capacity * 2 };
        let mut grown = vec![0; new_capacity];
        grown[..self.len].copy_from_slice(&self.backing.borrow()[..self.len]);
        grown[self.len] = value;
        GoSlice {
            backing: Rc::new(RefCell::new(grown)),
            len: self.len + 1,
        }
    }

    /// The elements as they are now.
    fn to_vec(&self) -> Vec<usize> {
        self.backing.borrow()[..self.len].to_vec()
    }
}

/// kubelet's `iterateCombinations`: every `k`-subset of `items` in lexicographic order of
/// positions, until `visit` breaks. `visit` may keep the slice it is given; later combinations
/// can overwrite it exactly as they do in kubelet.
fn for_each_combination(
    items: &[usize],
    k: usize,
    visit: &mut dyn FnMut(&GoSlice) -> ControlFlow<()>,
) {
    fn walk(
        items: &[usize],
        k: usize,
        start: usize,
        chosen: &GoSlice,
        visit: &mut dyn FnMut(&GoSlice) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        if k == 0 {
            return visit(chosen);
        }
        for i in start..=items.len() - k {
            walk(items, k - 1, i + 1, &chosen.append(items[i]), visit)?;
        }
        ControlFlow::Continue(())
    }
    if k < 1 || k > items.len() {
        return;
    }
    let _ = walk(items, k, 0, &GoSlice::empty(), visit);
}

/// Hands out `remainder` CPUs in groups of `group_size`, round-robin over `subset` (positions
/// into `free_after`). Returns false when a full pass makes no progress.
fn hand_out_remainder(
    free_after: &mut [i64],
    subset: &[usize],
    mut remainder: i64,
    group_size: i64,
) -> bool {
    while remainder > 0 {
        let before = remainder;
        for &member in subset {
            if remainder == 0 {
                break;
            }
            if free_after[member] < group_size {
                continue;
            }
            free_after[member] -= group_size;
            remainder -= group_size;
        }
        if remainder == before {
            return false;
        }
    }
    true
}

/// The best NUMA combination found for one `k`, as kubelet holds it: positions into the NUMA
/// order, read only once the walk is over.
struct Choice {
    members: GoSlice,
    remainder_members: Option<GoSlice>,
}

/// kubelet's `takeByTopologyNUMADistributed`: `count` CPUs out of `available`, distributed
/// across NUMA nodes in groups of `group_size` (treated as 1 when 0).
pub fn take_by_topology_distributed(
    index: &TopologyIndex,
    available: &CpuSet,
    count: usize,
    group_size: usize,
    strategy: CpuSortingStrategy,
) -> Result<CpuSet, TakeError> {
    let group_size = group_size.max(1);
    if count % group_size != 0 {
        return take_by_topology_packed(index, available, count, strategy, false);
    }
    let mut acc = CpuAccumulator::new(index, available, count, strategy);
    if acc.is_satisfied() {
        return Ok(acc.result().clone());
    }
    if acc.is_failed() {
        return Err(TakeError::NotEnoughCpus {
            requested: count,
            available: available.len(),
        });
    }

    let numa_order = acc.sort_available_numa_indices();
    let numa_cpus: Vec<&CpuSet> = numa_order
        .iter()
        .map(|&numa| &index.numa_nodes.cpus[numa])
        .collect();
    let free_per_numa: Vec<i64> = numa_cpus
        .iter()
        .map(|cpus| cpus.intersection_len(acc.free()) as i64)
        .collect();
    let positions: Vec<usize> = (0..numa_order.len()).collect();
    let (min_numas, max_numas) = numa_nodes_needed(index, &acc, group_size, numa_order.len());
    let request = count as i64;
    let group = group_size as i64;

    for k in min_numas..=max_numas {
        let Some(choice) = best_choice(&positions, k, &free_per_numa, request, group) else {
            continue;
        };
        return take_choice(
            index, &mut acc, &numa_cpus, choice, count, group_size, strategy,
        );
    }

    take_by_topology_packed(index, available, count, strategy, false)
}

/// The best `k` of the NUMA nodes (`positions` into `free_per_numa`) for `request` CPUs in
/// groups of `group`: the one whose free CPUs are most balanced afterwards, with the members
/// its remainder goes to.
fn best_choice(
    positions: &[usize],
    k: usize,
    free_per_numa: &[i64],
    request: i64,
    group: i64,
) -> Option<Choice> {
    let mut best_balance = f64::MAX;
    let mut best: Option<Choice> = None;
    for_each_combination(positions, k, &mut |combo_slice| {
        if best_balance == 0.0 {
            return ControlFlow::Break(());
        }
        let combo = &combo_slice.to_vec();
        let combo_free: i64 = combo.iter().map(|&m| free_per_numa[m]).sum();
        if combo_free < request {
            return ControlFlow::Continue(());
        }
        let groups: i64 = combo.iter().map(|&m| free_per_numa[m] / group).sum();
        if groups * group < request {
            return ControlFlow::Continue(());
        }
        let distribution = (request / combo.len() as i64 / group) * group;
        if combo.iter().any(|&m| free_per_numa[m] < distribution) {
            return ControlFlow::Continue(());
        }
        let mut free_after = free_per_numa.to_vec();
        for &member in combo {
            free_after[member] -= distribution;
        }
        let remainder = request - distribution * combo.len() as i64;
        let (best_local_balance, best_local_remainder) =
            best_remainder(combo, &free_after, remainder, group);
        if best_local_balance < best_balance {
            best_balance = best_local_balance;
            best = Some(Choice {
                members: combo_slice.clone(),
                remainder_members: best_local_remainder,
            });
        }
        ControlFlow::Continue(())
    });
    best
}

/// Where the remainder of one combination goes: the subset of its members (largest first)
/// that leaves the free CPUs most balanced, and that balance.
fn best_remainder(
    combo: &[usize],
    free_after: &[i64],
    remainder: i64,
    group: i64,
) -> (f64, Option<GoSlice>) {
    let remainder_candidates: Vec<usize> = combo
        .iter()
        .copied()
        .filter(|&m| free_after[m] >= group)
        .collect();
    let mut best_local_balance = f64::MAX;
    let mut best_local_remainder: Option<GoSlice> = None;
    if remainder == 0 {
        best_local_balance = standard_deviation(free_after);
    }
    let mut size = remainder_candidates.len();
    while remainder > 0 && size >= 1 {
        for_each_combination(&remainder_candidates, size, &mut |subset_slice| {
            let subset = &subset_slice.to_vec();
            let subset_free: i64 = subset.iter().map(|&m| free_after[m]).sum();
            if subset_free < remainder {
                return ControlFlow::Continue(());
            }
            let mut after_remainder = free_after.to_vec();
            if !hand_out_remainder(&mut after_remainder, subset, remainder, group) {
                return ControlFlow::Continue(());
            }
            let balance = standard_deviation(&after_remainder);
            if balance < best_local_balance {
                best_local_balance = balance;
                best_local_remainder = Some(subset_slice.clone());
            }
            ControlFlow::Continue(())
        });
        size -= 1;
    }
    (best_local_balance, best_local_remainder)
}

/// Takes the CPUs of a choice: an even share of each member's, then the remainder group by
/// group from the remainder members.
fn take_choice(
    index: &TopologyIndex,
    acc: &mut CpuAccumulator<'_>,
    numa_cpus: &[&CpuSet],
    choice: Choice,
    count: usize,
    group_size: usize,
    strategy: CpuSortingStrategy,
) -> Result<CpuSet, TakeError> {
    let (request, group) = (count as i64, group_size as i64);
    let members = choice.members.to_vec();
    let remainder_members = choice
        .remainder_members
        .map(|slice| slice.to_vec())
        .unwrap_or_default();
    let distribution = (request / members.len() as i64 / group) * group;
    for &member in &members {
        let share = numa_cpus[member].intersection(acc.free());
        let picked = take_by_topology_packed(
            index,
            &share,
            usize::try_from(distribution).unwrap_or(0),
            strategy,
            false,
        )
        .unwrap_or_default();
        acc.take(&picked);
    }
    let mut remainder = request - distribution * members.len() as i64;
    while remainder > 0 {
        let before = remainder;
        for &member in &remainder_members {
            if remainder == 0 {
                break;
            }
            let share = numa_cpus[member].intersection(acc.free());
            if (share.len() as i64) < group {
                continue;
            }
            let picked = take_by_topology_packed(index, &share, group_size, strategy, false)
                .unwrap_or_default();
            acc.take(&picked);
            remainder -= group;
        }
        if remainder == before {
            break;
        }
    }
    if acc.needed() > 0 {
        return Err(TakeError::TooFewAllocated {
            remaining: acc.needed(),
        });
    }
    if acc.needed() < 0 {
        return Err(TakeError::TooManyAllocated {
            remaining: acc.needed(),
        });
    }
    Ok(acc.result().clone())
}

/// kubelet's `rangeNUMANodesNeededToSatisfy`: the fewest and most NUMA nodes worth trying.
fn numa_nodes_needed(
    index: &TopologyIndex,
    acc: &CpuAccumulator<'_>,
    group_size: usize,
    numa_nodes_with_free_cpus: usize,
) -> (usize, usize) {
    let numa_nodes = index.numa_nodes.len().max(1);
    let cpus = index.all_cpus().len();
    let groups = cpus.saturating_sub(1) / group_size + 1;
    let groups_per_numa = (groups - 1) / numa_nodes + 1;
    let needed = usize::try_from(acc.needed()).unwrap_or(0);
    let groups_needed = needed.saturating_sub(1) / group_size + 1;
    let min_numas = (groups_needed - 1) / groups_per_numa + 1;
    let max_numas = groups_needed.min(numa_nodes_with_free_cpus);
    (min_numas, max_numas)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_deviation_rounds_like_go() {
        assert_eq!(standard_deviation(&[2, 4, 4, 4, 5, 5, 7, 9]), 2.0);
        assert_eq!(standard_deviation(&[1, 2]), 0.5);
        // mean 1/3 rounds to 0.333 before the deviation is taken.
        assert_eq!(standard_deviation(&[0, 0, 1]), 0.471);
        assert_eq!(round_to_thousandths(0.0005), 0.001);
        assert_eq!(round_to_thousandths(-0.0005), -0.001);
    }

    #[test]
    fn combinations_are_lexicographic_and_stop_on_break() {
        let mut seen = Vec::new();
        for_each_combination(&[5, 6, 7], 2, &mut |combo| {
            seen.push(combo.to_vec());
            ControlFlow::Continue(())
        });
        assert_eq!(seen, vec![vec![5, 6], vec![5, 7], vec![6, 7]]);
        let mut visits = 0;
        for_each_combination(&[1, 2, 3, 4], 1, &mut |_| {
            visits += 1;
            if visits == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!(visits, 2);
    }

    #[test]
    fn kept_combinations_alias_like_go_slices() {
        // Size 3 gets a fresh array per combination; size 4 shares its prefix's array.
        let mut kept = Vec::new();
        for_each_combination(&[0, 1, 2, 3, 4], 3, &mut |combo| {
            kept.push(combo.clone());
            ControlFlow::Continue(())
        });
        assert_eq!(kept[0].to_vec(), vec![0, 1, 2]);
        let mut first = None;
        for_each_combination(&[0, 1, 2, 3, 4], 4, &mut |combo| {
            first.get_or_insert_with(|| combo.clone());
            ControlFlow::Continue(())
        });
        // {0,1,2,3} was visited first, then {0,1,2,4} overwrote its last element.
        assert_eq!(first.unwrap().to_vec(), vec![0, 1, 2, 4]);
    }

    #[test]
    fn remainder_hand_out_reports_a_stall_instead_of_spinning() {
        let mut free = vec![3, 3];
        assert!(!hand_out_remainder(&mut free, &[0, 1], 6, 2));
        let mut free = vec![3, 3];
        assert!(hand_out_remainder(&mut free, &[0, 1], 4, 2));
        assert_eq!(free, vec![1, 1]);
    }
}
