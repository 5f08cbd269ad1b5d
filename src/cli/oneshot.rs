//! The one-shot commands' execution of a plan (`plan --apply`, `reset`): every step at once,
//! then what cgroups below the scan's depth limit held up. The agent's controller makes its
//! plans its own way (within a budget, re-reading where writing showed its scan stale); the
//! writer itself decides nothing.

use std::collections::HashSet;

use crate::cgroupfs::{CgroupPath, Hierarchy, InterfaceFile};
use crate::planner::{Known, Step, WritePlan};
use crate::writer::{execute_all, narrow_unseen, Done, Executed, Outcome};

/// Executes all of `plan`; where cgroups below the scan's depth limit held a narrowing up, the
/// planner's steps for them ([`narrow_unseen`]), then the narrowings they held up once more
/// (whose outcomes replace the first ones).
pub(crate) fn apply(hierarchy: &Hierarchy, plan: WritePlan, known: &Known<'_>) -> Executed {
    let mut executed = execute_all(hierarchy, plan, known);
    // The narrowings held up, and those above them that waited for them.
    let mut held_up: HashSet<(CgroupPath, InterfaceFile)> = HashSet::new();
    for root in executed.with(|o| matches!(o, Outcome::UnseenInTheWay { .. })) {
        let chain = std::iter::successors(Some(root.path.clone()), CgroupPath::parent);
        held_up.extend(chain.map(|p| (p, root.file)));
    }
    if !narrow_unseen(hierarchy, &mut executed) {
        return executed;
    }
    let (again, done): (Vec<Done>, Vec<Done>) = executed.done.into_iter().partition(|d| {
        matches!(d.outcome, Outcome::UnseenInTheWay { .. } | Outcome::Skipped)
            && held_up.contains(&(d.step.path.clone(), d.step.file))
    });
    let again: Vec<Step> = again.into_iter().map(|d| d.step).collect();
    let again = execute_all(hierarchy, again.into(), known);
    executed.done = done;
    executed.done.extend(again.done);
    executed
}
