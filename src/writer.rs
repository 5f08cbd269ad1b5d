//! The writer: executes a [`WritePlan`] against the cgroup hierarchy, in order.
//!
//! ENOENT means the cgroup is gone (a container exited between scan and write): skipped, not an
//! error, and nothing more is written below it. Any other errno is reported with the path, the
//! value and the errno, and the rest of the plan goes on where the nesting rules still allow it:
//! writes of the same file below a cgroup whose write failed are skipped (the kernel would refuse
//! them too, and the next pass retries the lot).
//!
//! A plan is made from a scan that may be a moment old: a container cgroup created since (its
//! runtime copies the parent's wide cpuset into it at once) is not in it. So before a cpuset is
//! narrowed, its directory is listed, and children the scan did not have (or found uninitialised,
//! which the runtime may have filled since) are read; if one holds CPUs outside the new value
//! the write is not made (the kernel would refuse it with EBUSY), nor are its ancestors'
//! narrowings, and the cgroup is reported [`WriteReport::stale`], for the caller to re-read it
//! and plan again. A narrowing the kernel refuses with EBUSY (a child set up between that check
//! and the write) is reported the same way.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;

use crate::cgroupfs::{
    CgroupError, CgroupFs, CgroupPath, CgroupVersion, FileKind, Hierarchy, InterfaceFile, Scan,
};
use crate::cpuset::CpuSet;
use crate::planner::{PlannedWrite, WritePlan, WriteStep};

/// What happened to a plan.
#[derive(Debug, Default)]
pub struct WriteReport {
    /// Writes the kernel (or the fake tree) accepted.
    pub applied: usize,
    /// Which: indexes into the plan, in order.
    pub applied_writes: Vec<usize>,
    /// Writes skipped because their cgroup, or an ancestor, is gone.
    pub gone: usize,
    /// Cgroups a write found gone (indexes in the scan).
    pub gone_cgroups: Vec<usize>,
    /// Writes skipped because a write above them failed.
    pub skipped: usize,
    /// Writes that failed, with the error (path, value and errno inside).
    pub failed: Vec<(PlannedWrite, CgroupError)>,
    /// Narrowing writes not made because a child the plan did not know of holds more: the
    /// scan was stale below these cgroups (indexes in the scan).
    pub stale: Vec<usize>,
    /// Narrowings of a cgroup (index in the scan) left undone because this failed write of a
    /// child's blocks them.
    pub blocked: Vec<(usize, PlannedWrite)>,
    /// Writes refused to a cgroup the scan found empty (v1: a cpuset never set up, which no
    /// task can join), with the index of its parent: an empty child does not keep its parent
    /// from being narrowed (the kernel allows it), so the parent's narrowing went on; the
    /// caller names the child and counts it.
    pub refused_empty: Vec<(usize, PlannedWrite)>,
    /// The kernel's refusals behind `stale` (EBUSY), for the caller to count and report once;
    /// they are re-planned, not failures.
    pub refused_stale: Vec<(PlannedWrite, CgroupError)>,
    /// Narrowing writes not made yet because a child is new ([`NewChildren::LetThemSettle`]).
    pub settling: Vec<usize>,
    /// Writes not made because the [`Schedule`] held them back (for a later pass).
    pub held_back: usize,
    /// When the urgent writes were done (`None`: there were none).
    pub urgent_done: Option<std::time::Instant>,
}

impl WriteReport {
    /// Every write was made (or its cgroup is gone).
    pub fn is_clean(&self) -> bool {
        self.failed.is_empty() && self.stale.is_empty() && self.settling.is_empty()
    }
}

/// Where a file lives: cpuset files in the cpuset hierarchy, cpu files in the cpu one.
fn controller_of(file: InterfaceFile) -> Controller {
    match file {
        InterfaceFile::CpuCfsQuotaUs
        | InterfaceFile::CpuCfsPeriodUs
        | InterfaceFile::CpuMax
        | InterfaceFile::CpuShares
        | InterfaceFile::CpuWeight => Controller::Cpu,
        _ => Controller::Cpuset,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Controller {
    Cpuset,
    Cpu,
}

/// How narrowing treats a cgroup whose children are new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewChildren<'a> {
    /// Narrow now (the one-shot commands).
    NarrowNow,
    /// The agent on cgroup v1, while runtimes create cgroups: a new cpuset cgroup is empty until
    /// its runtime copies the parent's set into it (read the parent, then write the child, at
    /// any moment; runc's `ensureParent`). Writing the child first races with that copy, and
    /// narrowing the parent meanwhile makes one of the two writes fail (EBUSY for us, EACCES
    /// for the runtime, which then fails to start the container). So a cgroup uninitialised in
    /// the scan is left to its runtime (not written, nor anything below it), and a cgroup is not
    /// narrowed while a child is uninitialised on disk: it is reported
    /// [`WriteReport::settling`], for a pass a moment later. `initialised[i]` marks scanned
    /// cgroups known to be past that point (seen set up before, or empty for too long): an
    /// empty value there is drift to repair, not a runtime at work.
    LetThemSettle { initialised: &'a [bool] },
}

/// Which of a plan's writes a pass makes first, and which it may leave for a later pass.
///
/// Urgent writes (and every earlier write of the plan they depend on: the same file of their
/// parent or children, so the v1 nesting rules hold for them alone) are made first, in plan
/// order; then the others, in plan order. That is a valid order: no other write precedes an
/// urgent one it is related to (it would be urgent too), so each write still sees its parent
/// and children as the plan's order would have them.
#[derive(Default, Clone, Copy)]
pub struct Schedule<'a> {
    /// Per planned write; `None`: none is urgent.
    pub urgent: Option<&'a [bool]>,
    /// Make the urgent writes only; the others are [`WriteReport::held_back`].
    pub urgent_only: bool,
    /// Asked before each of the other writes: `true` holds back the rest.
    pub preempt: Option<&'a dyn Fn() -> bool>,
    /// How many of the other writes are made before `preempt` is asked.
    pub preempt_after: usize,
}

impl std::fmt::Debug for Schedule<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field(
                "urgent",
                &self.urgent.map(|u| u.iter().filter(|&&x| x).count()),
            )
            .field("urgent_only", &self.urgent_only)
            .field("preempt", &self.preempt.is_some())
            .field("preempt_after", &self.preempt_after)
            .finish()
    }
}

/// The order writes are made in: the urgent ones with what they depend on, then the rest (see
/// [`Schedule`]); and how many of the first are urgent. `writes[i]` is write `i`'s cgroup and
/// file, `parents` the cgroups' parents.
pub(crate) fn schedule_order(
    writes: &[(usize, InterfaceFile)],
    parents: &[Option<usize>],
    urgent: Option<&[bool]>,
) -> (Vec<usize>, usize) {
    let Some(urgent) = urgent.filter(|u| u.iter().any(|&x| x)) else {
        return ((0..writes.len()).collect(), 0);
    };
    let mut by_cgroup: HashMap<(usize, InterfaceFile), Vec<usize>> = HashMap::new();
    for (index, &key) in writes.iter().enumerate() {
        by_cgroup.entry(key).or_default().push(index);
    }
    let children = children_index(parents);
    let mut marked: Vec<bool> = (0..writes.len())
        .map(|i| urgent.get(i).copied().unwrap_or(false))
        .collect();
    // From the last write back: each marked write marks the earlier writes of the same file
    // of its own cgroup, its parent and its children (those marked later are visited later).
    for k in (0..writes.len()).rev() {
        if !marked[k] {
            continue;
        }
        let (cgroup, file) = writes[k];
        let related = std::iter::once(cgroup)
            .chain(parents.get(cgroup).copied().flatten())
            .chain(children.get(cgroup).into_iter().flatten().copied());
        for related in related {
            for &j in by_cgroup.get(&(related, file)).into_iter().flatten() {
                if j < k {
                    marked[j] = true;
                }
            }
        }
    }
    let first: Vec<usize> = (0..writes.len()).filter(|&i| marked[i]).collect();
    let count = first.len();
    let order = first
        .into_iter()
        .chain((0..writes.len()).filter(|&i| !marked[i]))
        .collect();
    (order, count)
}

/// The children of each scanned cgroup, from the parents' index.
fn children_index(parents: &[Option<usize>]) -> Vec<Vec<usize>> {
    let mut index = vec![Vec::new(); parents.len()];
    for (child, parent) in parents.iter().enumerate() {
        if let Some(list) = parent.and_then(|p| index.get_mut(p)) {
            list.push(child);
        }
    }
    index
}

/// Executes `plan`, made from `scan`, in order. `parents[i]` is the parent of scanned cgroup
/// `i` (as planned).
pub fn apply(
    hierarchy: &Hierarchy,
    plan: &WritePlan,
    scan: &Scan,
    parents: &[Option<usize>],
    new_children: NewChildren<'_>,
) -> WriteReport {
    apply_scheduled(
        hierarchy,
        plan,
        scan,
        parents,
        new_children,
        Schedule::default(),
    )
}

/// As [`apply`], urgent writes first and the rest perhaps held back (see [`Schedule`]).
pub fn apply_scheduled(
    hierarchy: &Hierarchy,
    plan: &WritePlan,
    scan: &Scan,
    parents: &[Option<usize>],
    new_children: NewChildren<'_>,
    schedule: Schedule<'_>,
) -> WriteReport {
    let mut report = WriteReport::default();
    let mut gone = vec![false; parents.len()];
    // Cgroups whose write of a file failed, per file.
    let mut failed: HashSet<(usize, InterfaceFile)> = HashSet::new();
    // Ancestors of cgroups whose narrowing was deferred, per file.
    let mut deferred: HashSet<(usize, InterfaceFile)> = HashSet::new();
    // Cgroups left to their runtime, per file.
    let mut uninitialised: HashSet<(usize, InterfaceFile)> = HashSet::new();
    let (settle, initialised) = match new_children {
        NewChildren::NarrowNow => (false, &[][..]),
        NewChildren::LetThemSettle { initialised } => (true, initialised),
    };
    // Children of each scanned cgroup, built at the first narrowing.
    let mut children: Option<Vec<Vec<usize>>> = None;
    let ancestors =
        |cgroup: usize| std::iter::successors(Some(cgroup), |&i| parents.get(i).copied().flatten());
    let keys: Vec<(usize, InterfaceFile)> = plan.iter().map(|w| (w.cgroup, w.file)).collect();
    let (order, urgent_count) = schedule_order(&keys, parents, schedule.urgent);
    for (position, &index) in order.iter().enumerate() {
        let write = &plan[index];
        if position == urgent_count && urgent_count > 0 {
            report.urgent_done = Some(std::time::Instant::now());
        }
        if position >= urgent_count
            && (schedule.urgent_only
                || (position - urgent_count >= schedule.preempt_after
                    && schedule.preempt.is_some_and(|preempt| preempt())))
        {
            report.held_back = order.len() - position;
            break;
        }
        if ancestors(write.cgroup).any(|i| gone.get(i) == Some(&true)) {
            report.gone += 1;
            continue;
        }
        if !failed.is_empty()
            && ancestors(write.cgroup)
                .skip(1)
                .any(|i| failed.contains(&(i, write.file)))
        {
            report.skipped += 1;
            continue;
        }
        if settle
            && !initialised.get(write.cgroup).copied().unwrap_or(false)
            && (is_uninitialised(scan, write.cgroup, write.file)
                || ancestors(write.cgroup).any(|i| uninitialised.contains(&(i, write.file))))
        {
            uninitialised.insert((write.cgroup, write.file));
            report.skipped += 1;
            continue;
        }
        let fs = match controller_of(write.file) {
            Controller::Cpuset => &hierarchy.cpuset,
            Controller::Cpu => &hierarchy.cpu,
        };
        if write.step == WriteStep::Narrow {
            if deferred.contains(&(write.cgroup, write.file)) {
                // A child's narrowing was deferred: it still holds more than this value.
                report.skipped += 1;
                continue;
            }
            let children = children.get_or_insert_with(|| children_index(parents));
            let of_this = children.get(write.cgroup).map_or(&[][..], |c| &c[..]);
            let settled = settled_children(scan, of_this, initialised, write.file);
            let child = child_in_the_way(
                fs,
                &write.path,
                write.file,
                &write.value,
                (&settled, of_this.len()),
                settle,
            );
            // Below the scan's depth limit the plan cannot know the children: a cgroup the
            // container made there, however deep, is narrowed here, deepest first, as the plan
            // would narrow a known one (its set ∩ the new value), instead of holding the whole
            // chain wide (and re-planning for ever).
            let child = match child {
                Some(ChildState::Holds { .. }) if beyond_scan_depth(scan, &write.path) => {
                    narrow_unseen_subtree(fs, &write.path, write.file, &write.value);
                    None
                }
                // No runtime sets up a cgroup down there: an empty one is not a start in
                // progress, and the kernel narrows its parent past it.
                Some(ChildState::Uninitialised) if beyond_scan_depth(scan, &write.path) => None,
                other => other,
            };
            if let Some(child) = child {
                log::debug!(
                    "cg={} not narrowed to {} now: {child}",
                    write.path,
                    write.value
                );
                match child {
                    ChildState::Holds { .. } => report.stale.push(write.cgroup),
                    ChildState::Uninitialised => report.settling.push(write.cgroup),
                }
                deferred.extend(ancestors(write.cgroup).skip(1).map(|i| (i, write.file)));
                continue;
            }
        }
        match fs.write(&write.path, write.file, &write.value) {
            Ok(()) => {
                report.applied += 1;
                report.applied_writes.push(index);
            }
            Err(e) if e.is_gone() => {
                log::debug!(
                    "cg={} gone before {} was written",
                    write.path,
                    write.file.name()
                );
                if let Some(flag) = gone.get_mut(write.cgroup) {
                    *flag = true;
                }
                report.gone += 1;
                report.gone_cgroups.push(write.cgroup);
            }
            Err(e)
                if write.step == WriteStep::Narrow
                    && e.errno() == Some(nix::errno::Errno::EBUSY as i32) =>
            {
                // A child set up since the check holds more: the kernel's word for "stale".
                log::debug!(
                    "cg={} not narrowed to {}: a child holds more (re-planning)",
                    write.path,
                    write.value
                );
                report.stale.push(write.cgroup);
                report.refused_stale.push((write.clone(), e));
                deferred.extend(ancestors(write.cgroup).skip(1).map(|i| (i, write.file)));
            }
            Err(e) => {
                failed.insert((write.cgroup, write.file));
                if scan.version == CgroupVersion::V1
                    && is_uninitialised(scan, write.cgroup, write.file)
                {
                    // Still empty (v1): it holds no task and does not block its parent (see
                    // `settled_children`), which is narrowed as planned. (An empty v2 cpuset
                    // inherits its parent's: a failure like any other.)
                    if let Some(parent) = parents.get(write.cgroup).copied().flatten() {
                        report.refused_empty.push((parent, write.clone()));
                    }
                } else if write.step == WriteStep::Narrow {
                    // Its parents cannot be narrowed over it (the kernel would refuse them with
                    // EBUSY, and a re-plan would change nothing): they wait for the next
                    // reconcile, and the report says which child blocks them.
                    let blocked: Vec<usize> = ancestors(write.cgroup).skip(1).collect();
                    deferred.extend(blocked.iter().map(|&i| (i, write.file)));
                    if let Some(&parent) = blocked.first() {
                        report.blocked.push((parent, write.clone()));
                    }
                }
                report.failed.push((write.clone(), e));
            }
        }
    }
    if report.urgent_done.is_none() && urgent_count > 0 {
        report.urgent_done = Some(std::time::Instant::now());
    }
    report
}

/// Whether the scan found scanned cgroup `cgroup`'s cpuset `file` empty: a v1 cgroup its
/// runtime has not set up yet.
fn is_uninitialised(scan: &Scan, cgroup: usize, file: InterfaceFile) -> bool {
    let Some(c) = scan.cgroups.get(cgroup) else {
        return false;
    };
    let value = match file {
        InterfaceFile::CpusetMems => &c.mems,
        InterfaceFile::CpusetCpus => &c.cpus,
        _ => return false,
    };
    value.value().is_some_and(|v| v.is_empty())
}

/// Names of the scanned `children` whose `file` the scan found set (the plan narrowed them
/// first, if needed), missing (not cpuset cgroups), or empty past their runtime's set-up
/// (`initialised`: the plan set them up first, and one it could not write is still empty,
/// which the kernel narrows a parent past). The others, uninitialised when scanned, may have
/// had the parent's wide set copied into them since, and are read again.
fn settled_children<'a>(
    scan: &'a Scan,
    children: &[usize],
    initialised: &[bool],
    file: InterfaceFile,
) -> HashSet<&'a OsStr> {
    children
        .iter()
        .filter_map(|&i| Some((i, scan.cgroups.get(i)?)))
        .filter(|(i, c)| {
            let value = match file {
                InterfaceFile::CpusetMems => &c.mems,
                _ => &c.cpus,
            };
            value.configured().is_some()
                || value.is_missing()
                || initialised.get(*i).copied().unwrap_or(false)
        })
        .filter_map(|(_, c)| c.path.name())
        .collect()
}

/// Whether the children of `path` lie past the scan's depth limit (so the plan never saw them).
fn beyond_scan_depth(scan: &Scan, path: &CgroupPath) -> bool {
    path.strip_prefix(&scan.kubepods)
        .is_some_and(|rel| rel.depth() >= crate::cgroupfs::MAX_SCAN_DEPTH)
}

/// Most cgroups [`narrow_unseen_subtree`] visits below one cgroup.
const MAX_UNSEEN: usize = 4096;

/// Narrows every cgroup below `root` whose `file` holds more than `value` to what it holds of
/// `value` (all of `value` when nothing), deepest first, so `root` can then be narrowed. For
/// the part of a tree below the scan's depth limit; at most [`MAX_UNSEEN`] cgroups.
fn narrow_unseen_subtree(fs: &CgroupFs, root: &CgroupPath, file: InterfaceFile, value: &str) {
    let Ok(wanted) = CpuSet::parse(value) else {
        return;
    };
    // Pre-order collection, then narrowed in reverse (children before their parents).
    let mut order: Vec<CgroupPath> = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        if order.len() >= MAX_UNSEEN {
            log::warn!(
                "cg={root}: more than {MAX_UNSEEN} cgroups below it; the rest stay as they are"
            );
            break;
        }
        let Ok(entries) = fs.list(&dir) else {
            continue;
        };
        for entry in entries.iter().filter(|e| e.kind == FileKind::Directory) {
            if let Ok(child) = dir.join(&entry.name) {
                order.push(child.clone());
                stack.push(child);
            }
        }
    }
    let mut narrowed = 0;
    for dir in order.iter().rev() {
        let Ok(text) = fs.read(dir, file) else {
            continue;
        };
        let Ok(held) = CpuSet::parse(&text) else {
            continue;
        };
        if held.is_empty() || held.is_subset(&wanted) {
            continue;
        }
        let kept = held.intersection(&wanted);
        let new = if kept.is_empty() {
            wanted.clone()
        } else {
            kept
        };
        if fs.write(dir, file, &new.to_string()).is_ok() {
            narrowed += 1;
        }
    }
    if narrowed > 0 {
        log::info!(
            "cg={root}: narrowed {narrowed} cgroup(s) below the scan's depth limit to {} first",
            value
        );
    }
}

/// Why a cgroup is not narrowed now.
#[derive(Debug)]
enum ChildState {
    /// A child the plan did not know holds more than the new value.
    Holds { child: CgroupPath, held: CpuSet },
    /// A child is not initialised yet: its runtime is about to copy the parent's set into it.
    Uninitialised,
}

impl std::fmt::Display for ChildState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildState::Holds { child, held } => {
                write!(f, "child {child} holds {held} (re-planning)")
            }
            ChildState::Uninitialised => write!(f, "a new child is being set up (later)"),
        }
    }
}

/// A child of `cgroup` not among `known` whose `file` holds CPUs (or memory nodes) outside
/// `value`, as the tree says now; with `settle`, also one that is not initialised yet.
/// Unreadable children do not count, nor (without `settle`) uninitialised ones: the kernel lets
/// a parent narrow over them. `known` comes with how many children the plan knows of: a
/// cgroup the plan knows no child of, and whose link count says it has no subdirectory (a
/// container's, mostly), is not listed. (Equal non-zero counts would not do: a child removed
/// and another created since the scan, a container restarting, keep the count.)
fn child_in_the_way(
    fs: &CgroupFs,
    cgroup: &CgroupPath,
    file: InterfaceFile,
    value: &str,
    (known, planned_children): (&HashSet<&OsStr>, usize),
    settle: bool,
) -> Option<ChildState> {
    if !matches!(file, InterfaceFile::CpusetCpus | InterfaceFile::CpusetMems) {
        return None;
    }
    if planned_children == 0 && fs.subdir_count(cgroup) == Some(0) {
        return None;
    }
    let new = CpuSet::parse(value).ok()?;
    let entries = fs.list(cgroup).ok()?;
    entries
        .iter()
        .filter(|e| e.kind == FileKind::Directory && !known.contains(e.name.as_os_str()))
        .filter_map(|e| cgroup.join(&e.name).ok())
        .find_map(|child| {
            let held = CpuSet::parse(&fs.read(&child, file).ok()?).ok()?;
            if held.is_empty() {
                settle.then_some(ChildState::Uninitialised)
            } else {
                (!held.is_subset(&new)).then_some(ChildState::Holds { child, held })
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroupfs::{CgroupDriver, CgroupLayout, CgroupVersion};
    use std::fs;

    #[test]
    fn a_narrowing_write_over_a_child_the_plan_did_not_know_is_not_made() {
        let dir = tempfile::tempdir().unwrap();
        let cpuset = dir.path().join("cpuset");
        let make = |rel: &str, cpus: &str| {
            fs::create_dir_all(cpuset.join(rel)).unwrap();
            fs::write(cpuset.join(rel).join("cpuset.cpus"), format!("{cpus}\n")).unwrap();
        };
        for (rel, cpus) in [
            ("", "0-3"),
            ("kubepods", "0-3"),
            ("kubepods/pod", "0-3"),
            ("kubepods/pod/planned", "0-3"),
            ("kubepods/other", "0-3"),
            ("kubepods/other/filled", ""),
            ("kubepods/third", "0-3"),
            ("kubepods/third/empty", ""),
        ] {
            make(rel, cpus);
        }
        fs::create_dir_all(dir.path().join("cpu")).unwrap();
        fs::write(dir.path().join("cpu/cpu.shares"), "1024\n").unwrap();
        let layout = CgroupLayout {
            version: CgroupVersion::V1,
            driver: CgroupDriver::Cgroupfs,
            cpuset_root: cpuset.clone(),
            cpu_root: dir.path().join("cpu"),
            kubepods: CgroupPath::new("kubepods").unwrap(),
        };
        let hierarchy = Hierarchy::open(&layout).unwrap();
        let scan = crate::cgroupfs::Scanner::new(hierarchy.clone(), layout.kubepods.clone())
            .scan()
            .unwrap();
        // Since the scan: a child created with its parent's set copied down, and a child
        // that was uninitialised then and got its parent's set since.
        make("kubepods/pod/late", "0-3");
        make("kubepods/other/filled", "0-3");

        let index = |p: &str| {
            scan.cgroups
                .iter()
                .position(|c| c.path == CgroupPath::new(p).unwrap())
                .unwrap()
        };
        let write = |p: &str, value: &str| PlannedWrite {
            cgroup: index(p),
            path: CgroupPath::new(p).unwrap(),
            file: InterfaceFile::CpusetCpus,
            value: value.into(),
            step: WriteStep::Narrow,
        };
        let plan = vec![
            write("kubepods/pod/planned", "1"),
            write("kubepods/pod", "1"),
            write("kubepods/other", "2"),
            write("kubepods/third", "2"),
            write("kubepods", "1-2"),
        ];
        let parents = crate::planner::parent_indexes(&scan);
        let report = apply(&hierarchy, &plan, &scan, &parents, NewChildren::NarrowNow);
        assert_eq!(
            report.stale,
            vec![index("kubepods/pod"), index("kubepods/other")]
        );
        assert!(report.failed.is_empty());
        assert_eq!((report.applied, report.skipped), (2, 1));
        let read = |rel: &str| fs::read_to_string(cpuset.join(rel).join("cpuset.cpus")).unwrap();
        assert_eq!(read("kubepods/pod"), "0-3\n");
        assert_eq!(read("kubepods/pod/planned"), "1");
        assert_eq!(read("kubepods/other"), "0-3\n");
        // An uninitialised child does not hold its parent back.
        assert_eq!(read("kubepods/third"), "2");
        // Nor is a parent narrowed over a child whose narrowing was deferred.
        assert_eq!(read("kubepods"), "0-3\n");
    }

    #[test]
    fn the_agent_leaves_a_new_cgroup_to_its_runtime_and_narrows_its_parent_later() {
        let dir = tempfile::tempdir().unwrap();
        let cpuset = dir.path().join("cpuset");
        for (rel, cpus) in [
            ("", "0-3"),
            ("kubepods", "0-3"),
            ("kubepods/pod", "0-3"),
            ("kubepods/pod/ready", "0-3"),
            ("kubepods/pod/fresh", ""),
        ] {
            fs::create_dir_all(cpuset.join(rel)).unwrap();
            fs::write(cpuset.join(rel).join("cpuset.cpus"), format!("{cpus}\n")).unwrap();
        }
        fs::create_dir_all(dir.path().join("cpu")).unwrap();
        fs::write(dir.path().join("cpu/cpu.shares"), "1024\n").unwrap();
        let layout = CgroupLayout {
            version: CgroupVersion::V1,
            driver: CgroupDriver::Cgroupfs,
            cpuset_root: cpuset.clone(),
            cpu_root: dir.path().join("cpu"),
            kubepods: CgroupPath::new("kubepods").unwrap(),
        };
        let hierarchy = Hierarchy::open(&layout).unwrap();
        let scan = crate::cgroupfs::Scanner::new(hierarchy.clone(), layout.kubepods.clone())
            .scan()
            .unwrap();
        let index = |p: &str| {
            scan.cgroups
                .iter()
                .position(|c| c.path == CgroupPath::new(p).unwrap())
                .unwrap()
        };
        let write = |p: &str, value: &str, step| PlannedWrite {
            cgroup: index(p),
            path: CgroupPath::new(p).unwrap(),
            file: InterfaceFile::CpusetCpus,
            value: value.into(),
            step,
        };
        let plan = vec![
            write("kubepods/pod/fresh", "1", WriteStep::Widen),
            write("kubepods/pod/ready", "1", WriteStep::Narrow),
            write("kubepods/pod", "1", WriteStep::Narrow),
        ];
        let parents = crate::planner::parent_indexes(&scan);
        let read = |rel: &str| fs::read_to_string(cpuset.join(rel).join("cpuset.cpus")).unwrap();

        let report = apply(
            &hierarchy,
            &plan,
            &scan,
            &parents,
            NewChildren::LetThemSettle { initialised: &[] },
        );
        assert_eq!(report.settling, vec![index("kubepods/pod")]);
        assert_eq!((report.applied, report.skipped), (1, 1));
        assert_eq!(read("kubepods/pod/fresh"), "\n", "left to its runtime");
        assert_eq!(read("kubepods/pod/ready"), "1");
        assert_eq!(
            read("kubepods/pod"),
            "0-3\n",
            "narrowed once the child is set up"
        );

        // The one-shot commands set it up themselves and narrow at once.
        let report = apply(&hierarchy, &plan, &scan, &parents, NewChildren::NarrowNow);
        assert!(report.is_clean());
        assert_eq!(read("kubepods/pod/fresh"), "1");
        assert_eq!(read("kubepods/pod"), "1");
    }
}
