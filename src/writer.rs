//! The writer: executes a prefix of a [`WritePlan`] within a [`Budget`], in the plan's order,
//! and says what became of each step, by path ([`Outcome`]). It decides no order: the planner
//! does (`planner::order`).
//!
//! ENOENT means the cgroup is gone (a container exited between scan and write): not an error,
//! and nothing more is written below it. Any other errno is reported with the path, the value
//! and the errno, and the rest of the plan goes on where the nesting rules still allow it:
//! writes of the same file below a cgroup whose write failed are skipped (the kernel would
//! refuse them too, and the next pass retries the lot).
//!
//! A plan is made from a scan that may be a moment old: a container cgroup created since (its
//! runtime copies the parent's wide cpuset into it at once) is not in it. So before a cpuset is
//! narrowed, its directory is listed, and children the scan did not have (or found uninitialised,
//! which the runtime may have filled since) are read; if one holds CPUs outside the new value
//! the write is not made (the kernel would refuse it with EBUSY), nor are its ancestors'
//! narrowings, and the step's outcome is [`Outcome::ChildInTheWay`], for the caller to re-read
//! the cgroup and plan again. A narrowing the kernel refuses with EBUSY (a child set up between
//! that check and the write) has the same outcome. Below the scan's depth limit the plan cannot
//! know the children: there the subtree is read and reported ([`Outcome::UnseenInTheWay`]), and
//! the planner's steps for it (`planner::order::narrow_unseen`) are made next, by the caller.
//! The writer writes nothing but the steps it is given.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::cgroupfs::{
    CgroupError, CgroupPath, CgroupVersion, ChildInTheWay, Hierarchy, InterfaceFile,
};
use crate::planner::{Known, Step, Unseen, WritePlan, WriteStep};

/// What became of one step.
#[derive(Debug)]
pub enum Outcome {
    /// The kernel (or the fake tree) accepted it.
    Written,
    /// The cgroup is gone (ENOENT): it leaves the model.
    Gone,
    /// Not tried: an earlier step found the cgroup or an ancestor gone.
    UnderGone,
    /// Not tried: a write of the same file above failed, or a child's narrowing was not made
    /// (it still holds more than this value).
    Skipped,
    /// Not tried: the cgroup was uninitialised when scanned (v1) and its runtime may be setting
    /// it up now (see [`NewChildren::LetThemSettle`]).
    LeftToRuntime,
    /// A narrowing not made because a child the plan did not know holds more (`child`, seen
    /// before the write) or the kernel said so (`refused`, EBUSY): the scan was stale below the
    /// cgroup, re-read it and plan again.
    ChildInTheWay {
        child: Option<CgroupPath>,
        refused: Option<CgroupError>,
    },
    /// A narrowing not made because a cgroup below the scan's depth limit (which the plan
    /// cannot know) holds more: `found` is this cgroup and those below it as read, parents
    /// first, for the planner's steps ([`crate::planner::order::narrow_unseen`]).
    UnseenInTheWay { found: Vec<Unseen> },
    /// A narrowing not made yet because a child is new ([`NewChildren::LetThemSettle`]).
    Settling,
    /// The kernel refused the write (path, value and errno inside the error). `blocks`: the
    /// parent whose narrowing waits for this one (which failed).
    Refused {
        error: CgroupError,
        blocks: Option<CgroupPath>,
    },
    /// Refused to a cgroup the scan found empty (v1: a cpuset never set up, which no task can
    /// join): it does not keep its `parent` from being narrowed (the kernel allows it), so that
    /// narrowing goes on; the caller names the cgroup and counts it.
    RefusedEmpty {
        error: CgroupError,
        parent: Option<CgroupPath>,
    },
    /// Not reached within the [`Budget`] (for a later pass).
    HeldBack,
}

/// One step of the plan and what became of it.
#[derive(Debug)]
pub struct Done {
    pub step: Step,
    pub outcome: Outcome,
}

/// Every step of a plan, in the order made, with its outcome.
#[derive(Debug, Default)]
pub struct Executed {
    pub done: Vec<Done>,
    /// When the urgent steps were done (`None`: there were none).
    pub urgent_done: Option<Instant>,
}

/// How many steps had each outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub written: usize,
    /// Gone, or under a cgroup found gone.
    pub gone: usize,
    /// Skipped or left to the runtime.
    pub skipped: usize,
    /// Refused by the kernel (EBUSY over a child the plan did not know is `stale`).
    pub failed: usize,
    pub stale: usize,
    pub settling: usize,
    pub held_back: usize,
}

impl Tally {
    /// Every write was made (or its cgroup is gone).
    pub fn is_clean(&self) -> bool {
        self.failed == 0 && self.stale == 0 && self.settling == 0
    }

    /// Every step was written: none failed, waits, was held back, skipped or found gone.
    pub fn all_written(&self) -> bool {
        self.is_clean() && self.held_back == 0 && self.skipped == 0 && self.gone == 0
    }
}

impl Executed {
    pub fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for done in &self.done {
            let count = match done.outcome {
                Outcome::Written => &mut t.written,
                Outcome::Gone | Outcome::UnderGone => &mut t.gone,
                Outcome::Skipped | Outcome::LeftToRuntime => &mut t.skipped,
                Outcome::ChildInTheWay { .. } | Outcome::UnseenInTheWay { .. } => &mut t.stale,
                Outcome::Settling => &mut t.settling,
                Outcome::Refused { .. } | Outcome::RefusedEmpty { .. } => &mut t.failed,
                Outcome::HeldBack => &mut t.held_back,
            };
            *count += 1;
        }
        t
    }

    /// The steps written, in order.
    pub fn written(&self) -> impl Iterator<Item = &Step> {
        self.with(|o| matches!(o, Outcome::Written))
    }

    /// The kernel's refusals (EBUSY over a child the plan did not know aside), in order.
    pub fn refusals(&self) -> impl Iterator<Item = &CgroupError> {
        self.done.iter().filter_map(|d| match &d.outcome {
            Outcome::Refused { error, .. } | Outcome::RefusedEmpty { error, .. } => Some(error),
            _ => None,
        })
    }

    /// The steps whose outcome `pick` selects, in order.
    pub fn with(&self, pick: impl Fn(&Outcome) -> bool) -> impl Iterator<Item = &Step> {
        self.done
            .iter()
            .filter(move |d| pick(&d.outcome))
            .map(|d| &d.step)
    }
}

/// How narrowing treats a cgroup whose children are new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewChildren {
    /// Narrow now (the one-shot commands).
    NarrowNow,
    /// The agent on cgroup v1, while runtimes create cgroups: a new cpuset cgroup is empty until
    /// its runtime copies the parent's set into it (read the parent, then write the child, at
    /// any moment; runc's `ensureParent`). Writing the child first races with that copy, and
    /// narrowing the parent meanwhile makes one of the two writes fail (EBUSY for us, EACCES
    /// for the runtime, which then fails to start the container). So a cgroup uninitialised in
    /// the scan is left to its runtime (not written, nor anything below it) unless [`Known`]
    /// says it is past that point, and a cgroup is not narrowed while a child is uninitialised
    /// on disk ([`Outcome::Settling`], for a pass a moment later).
    LetThemSettle,
}

/// How much of a plan one pass makes.
#[derive(Clone, Copy)]
pub enum Budget<'a> {
    /// Every step.
    All,
    /// The urgent steps only ([`WritePlan::urgent_len`]); the others are [`Outcome::HeldBack`].
    UrgentOnly,
    /// The urgent steps, `after` more, then more until `arrived` says something new arrived
    /// (asked before each): the rest are held back.
    Yield {
        after: usize,
        arrived: &'a dyn Fn() -> bool,
    },
}

impl Budget<'_> {
    /// Whether the budget ends before the `n`-th step after the urgent ones.
    fn ends_before(&self, n: usize) -> bool {
        match self {
            Budget::All => false,
            Budget::UrgentOnly => true,
            Budget::Yield { after, arrived } => n >= *after && arrived(),
        }
    }
}

impl std::fmt::Debug for Budget<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Budget::All => write!(f, "All"),
            Budget::UrgentOnly => write!(f, "UrgentOnly"),
            Budget::Yield { after, .. } => write!(f, "Yield {{ after: {after} }}"),
        }
    }
}

/// Makes the planner's steps (`planner::order::narrow_unseen`) for the narrowings that cgroups
/// below the scan's depth limit held up ([`Outcome::UnseenInTheWay`]; disjoint subtrees), all
/// of them whatever the budget was (they are a held-up narrowing's); their outcomes join
/// `executed`'s. The narrowings themselves are the caller's to make again. Whether there were
/// any.
pub fn narrow_unseen(hierarchy: &Hierarchy, executed: &mut Executed) -> bool {
    let mut plan = WritePlan::default();
    for Done { step, outcome } in &executed.done {
        if let Outcome::UnseenInTheWay { found } = outcome {
            let (path, n) = (&step.path, found.len().saturating_sub(1));
            log::info!("cg={path}: narrowing {n} cgroup(s) below the scan's depth limit first");
            plan.extend(crate::planner::order::narrow_unseen(step, found));
        }
    }
    let more = execute_all(hierarchy, plan, &Known::nothing());
    executed.done.extend(more.done);
    executed
        .done
        .iter()
        .any(|d| matches!(d.outcome, Outcome::UnseenInTheWay { .. }))
}

/// Executes every step of `plan`, made from the tree `known` describes, narrowing now.
pub fn execute_all(hierarchy: &Hierarchy, plan: WritePlan, known: &Known<'_>) -> Executed {
    execute(hierarchy, plan, known, NewChildren::NarrowNow, Budget::All)
}

/// Executes a prefix of `plan`, made from the tree `known` describes, within `budget`.
pub fn execute(
    hierarchy: &Hierarchy,
    plan: WritePlan,
    known: &Known<'_>,
    new_children: NewChildren,
    budget: Budget<'_>,
) -> Executed {
    let urgent = plan.urgent_len();
    let mut run = Run {
        hierarchy,
        known,
        settle: new_children == NewChildren::LetThemSettle,
        gone: HashSet::new(),
        failed: PathFiles::default(),
        deferred: PathFiles::default(),
        uninitialised: PathFiles::default(),
    };
    let mut executed = Executed {
        done: Vec::with_capacity(plan.len()),
        urgent_done: None,
    };
    let mut held = false;
    for (position, step) in plan.into_iter().enumerate() {
        if position == urgent && urgent > 0 {
            executed.urgent_done = Some(Instant::now());
        }
        held = held || (position >= urgent && budget.ends_before(position - urgent));
        let outcome = if held {
            Outcome::HeldBack
        } else {
            run.step(&step)
        };
        executed.done.push(Done { step, outcome });
    }
    if executed.urgent_done.is_none() && urgent > 0 {
        executed.urgent_done = Some(Instant::now());
    }
    executed
}

/// `path` and the cgroups above it, nearest first, as path bytes (the sets below hold scanned
/// cgroups only: walking the path's own ancestors finds the scanned ones, without a look-up).
fn ancestors(path: &CgroupPath) -> impl Iterator<Item = &[u8]> {
    std::iter::successors(Some(path.as_bytes()), |p| {
        let slash = p.iter().rposition(|&b| b == b'/');
        (!p.is_empty()).then(|| slash.map_or(&p[..0], |s| &p[..s]))
    })
}

/// Cgroups (path bytes), each with the files a condition holds for.
#[derive(Default)]
struct PathFiles(HashMap<Box<[u8]>, Vec<InterfaceFile>>);

impl PathFiles {
    fn insert(&mut self, path: &[u8], file: InterfaceFile) {
        let files = self.0.entry(path.into()).or_default();
        if !files.contains(&file) {
            files.push(file);
        }
    }

    fn contains(&self, path: &[u8], file: InterfaceFile) -> bool {
        self.0.get(path).is_some_and(|f| f.contains(&file))
    }

    /// Whether it holds `file` of a cgroup above `path`.
    fn above(&self, path: &CgroupPath, file: InterfaceFile) -> bool {
        !self.0.is_empty() && ancestors(path).skip(1).any(|p| self.contains(p, file))
    }

    /// Whether it holds `file` of `path` or a cgroup above it.
    fn at_or_above(&self, path: &CgroupPath, file: InterfaceFile) -> bool {
        !self.0.is_empty() && ancestors(path).any(|p| self.contains(p, file))
    }
}

/// One execution's state: what earlier steps found.
struct Run<'r, 'k> {
    hierarchy: &'r Hierarchy,
    known: &'r Known<'k>,
    settle: bool,
    /// Cgroups found gone.
    gone: HashSet<Box<[u8]>>,
    /// Cgroups whose write of a file failed.
    failed: PathFiles,
    /// Ancestors of cgroups whose narrowing was not made.
    deferred: PathFiles,
    /// Cgroups left to their runtime.
    uninitialised: PathFiles,
}

impl Run<'_, '_> {
    /// Makes one step, unless an earlier one rules it out.
    fn step(&mut self, step: &Step) -> Outcome {
        let (path, file) = (&step.path, step.file);
        if !self.gone.is_empty() && ancestors(path).any(|p| self.gone.contains(p)) {
            return Outcome::UnderGone;
        }
        if self.failed.above(path, file) {
            return Outcome::Skipped;
        }
        if self.settle {
            let (empty, initialised) = self.known.setup(path, file);
            if !initialised && (empty || self.uninitialised.at_or_above(path, file)) {
                self.uninitialised.insert(path.as_bytes(), file);
                return Outcome::LeftToRuntime;
            }
        }
        if step.step == WriteStep::Narrow {
            if self.deferred.contains(path.as_bytes(), file) {
                return Outcome::Skipped;
            }
            if let Some(outcome) = self.child_in_the_way(step) {
                self.defer_ancestors(path, file);
                return outcome;
            }
        }
        let written = self.hierarchy.fs_of(file).write(path, file, &step.value);
        match written {
            Ok(()) => Outcome::Written,
            Err(e) => self.refused(step, e),
        }
    }

    fn defer_ancestors(&mut self, path: &CgroupPath, file: InterfaceFile) {
        for p in ancestors(path).skip(1) {
            self.deferred.insert(p, file);
        }
    }

    /// A narrowing not to make now: a child holds more, or is being set up.
    fn child_in_the_way(&self, step: &Step) -> Option<Outcome> {
        let (path, file) = (&step.path, step.file);
        let fs = self.hierarchy.fs_of(file);
        let (settled, planned) = self.known.settled_children(path, file);
        let way = fs.child_in_the_way(path, file, &step.value, (&settled, planned), self.settle)?;
        // Below the scan's depth limit the plan cannot know the children: what is there,
        // however deep, is read for the planner to narrow (`order::narrow_unseen`), instead of
        // holding the whole chain wide (and re-planning for ever). No runtime sets up a
        // cgroup down there: an empty one is not a start in progress, and the kernel narrows
        // its parent past it.
        let outcome = match (way, self.known.unseen_below(path)) {
            (ChildInTheWay::Holds(_), true) => {
                let found = fs.subtree_sets(path, file);
                return Some(Outcome::UnseenInTheWay { found });
            }
            (ChildInTheWay::Uninitialised, true) => return None,
            (ChildInTheWay::Holds(child), false) => Outcome::ChildInTheWay {
                child: Some(child),
                refused: None,
            },
            (ChildInTheWay::Uninitialised, false) => Outcome::Settling,
        };
        log::debug!("cg={path} not narrowed to {} now: {outcome:?}", step.value);
        Some(outcome)
    }

    /// What a refused write means.
    fn refused(&mut self, step: &Step, e: CgroupError) -> Outcome {
        let (path, file) = (&step.path, step.file);
        if e.is_gone() {
            log::debug!("cg={path} gone before {} was written", file.name());
            self.gone.insert(path.as_bytes().into());
            return Outcome::Gone;
        }
        if step.step == WriteStep::Narrow && e.errno() == Some(nix::errno::Errno::EBUSY as i32) {
            // A child set up since the check holds more: the kernel's word for "stale".
            log::debug!(
                "cg={path} not narrowed to {}: a child holds more (re-planning)",
                step.value
            );
            self.defer_ancestors(path, file);
            return Outcome::ChildInTheWay {
                child: None,
                refused: Some(e),
            };
        }
        self.failed.insert(path.as_bytes(), file);
        let parent = self.known.parent(path).cloned();
        if self.known.version() == CgroupVersion::V1 && self.known.found_empty(path, file) {
            // Still empty (v1): it holds no task and does not block its parent (see
            // `Known::settled_children`), which is narrowed as planned. (An empty v2 cpuset
            // inherits its parent's: a failure like any other.)
            return Outcome::RefusedEmpty { error: e, parent };
        }
        if step.step != WriteStep::Narrow {
            return Outcome::Refused {
                error: e,
                blocks: None,
            };
        }
        // Its parents cannot be narrowed over it (the kernel would refuse them with EBUSY, and
        // a re-plan would change nothing): they wait for the next reconcile, and the outcome
        // says which parent it blocks.
        self.defer_ancestors(path, file);
        Outcome::Refused {
            error: e,
            blocks: parent,
        }
    }
}

#[allow(clippy::too_many_lines)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroupfs::{CgroupDriver, CgroupLayout, CgroupVersion};
    use crate::cli::oneshot::apply;
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

        let path = |p: &str| CgroupPath::new(p).unwrap();
        let write = |p: &str, value: &str| {
            Step::new(
                path(p),
                InterfaceFile::CpusetCpus,
                value.into(),
                WriteStep::Narrow,
            )
        };
        let plan: WritePlan = vec![
            write("kubepods/pod/planned", "1"),
            write("kubepods/pod", "1"),
            write("kubepods/other", "2"),
            write("kubepods/third", "2"),
            write("kubepods", "1-2"),
        ]
        .into();
        let parents = crate::planner::parent_indexes(&scan);
        let known = Known::new(&scan, &parents, &[]);
        let executed = apply(&hierarchy, plan, &known);
        let stale: Vec<&CgroupPath> = executed
            .with(|o| matches!(o, Outcome::ChildInTheWay { .. }))
            .map(|s| &s.path)
            .collect();
        assert_eq!(stale, vec![&path("kubepods/pod"), &path("kubepods/other")]);
        let tally = executed.tally();
        assert_eq!(tally.failed, 0);
        assert_eq!((tally.written, tally.skipped), (2, 1));
        let read = |rel: &str| fs::read_to_string(cpuset.join(rel).join("cpuset.cpus")).unwrap();
        assert_eq!(read("kubepods/pod"), "0-3\n");
        assert_eq!(read("kubepods/pod/planned"), "1");
        assert_eq!(read("kubepods/other"), "0-3\n");
        // An uninitialised child does not hold its parent back.
        assert_eq!(read("kubepods/third"), "2");
        // Nor is a parent narrowed over a child whose narrowing was deferred.
        assert_eq!(read("kubepods"), "0-3\n");
    }

    /// `rel`'s `cpuset.cpus` below `root` set to `cpus` (the directory made first).
    fn make_cpus(root: &std::path::Path, rel: &str, cpus: &str) {
        fs::create_dir_all(root.join(rel)).unwrap();
        fs::write(root.join(rel).join("cpuset.cpus"), format!("{cpus}\n")).unwrap();
    }

    /// A v2 tree at `root`: `kubepods/burstable` on 0-3 and 30 pods below it whose cpusets are
    /// empty (they inherit), each with an `app` child where `apps`; its hierarchy and a scan.
    fn v2_burstable_tree(root: &std::path::Path, apps: bool) -> (Hierarchy, crate::cgroupfs::Scan) {
        for rel in ["", "kubepods", "kubepods/burstable"] {
            make_cpus(root, rel, "0-3");
        }
        for pod in 0..30 {
            make_cpus(root, &format!("kubepods/burstable/pod{pod}"), "");
            if apps {
                make_cpus(root, &format!("kubepods/burstable/pod{pod}/app"), "");
            }
        }
        let layout = CgroupLayout {
            version: CgroupVersion::V2,
            driver: CgroupDriver::Cgroupfs,
            cpuset_root: root.to_path_buf(),
            cpu_root: root.to_path_buf(),
            kubepods: CgroupPath::new("kubepods").unwrap(),
        };
        let hierarchy = Hierarchy::open(&layout).unwrap();
        let mut scanner = crate::cgroupfs::Scanner::new(hierarchy.clone(), layout.kubepods.clone());
        let scan = scanner.scan().unwrap();
        (hierarchy, scan)
    }

    /// cgroup v2 (the 6.12 guest, issue 24's exclusive target): the pods below a QoS cgroup
    /// leave their `cpuset.cpus` empty and inherit. Narrowing the QoS cgroup (what makes a new
    /// pin exclusive) does not read each of them first: a v2 runtime copies no set into an
    /// empty child, and the kernel narrows an inheriting child's effective set with its parent.
    /// Before, every empty child was re-read before the write (110 pods: 0.2-0.5 s in the
    /// guest). Counted by a child given a wide set behind the scan's back: the writer that
    /// reads the children holds the narrowing for it (stale, nothing written); v2's kernel
    /// narrows a parent past a child's own set.
    #[test]
    fn a_v2_narrowing_is_made_without_reading_the_children_that_inherit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (hierarchy, scan) = v2_burstable_tree(root, true);
        assert_eq!(scan.version, CgroupVersion::V2);
        make_cpus(root, "kubepods/burstable/pod7", "0-3");
        let burstable = CgroupPath::new("kubepods/burstable").unwrap();
        let step = Step::new(
            burstable.clone(),
            InterfaceFile::CpusetCpus,
            "0,2-3".into(),
            WriteStep::Narrow,
        );
        let parents = crate::planner::parent_indexes(&scan);
        let known = Known::new(&scan, &parents, &[]);
        let tally = apply(&hierarchy, vec![step].into(), &known).tally();
        assert_eq!((tally.written, tally.stale), (1, 0), "{tally:?}");
        let read = |rel: &str| fs::read_to_string(root.join(rel).join("cpuset.cpus")).unwrap();
        assert_eq!(read("kubepods/burstable").trim(), "0,2-3");
        assert_eq!(read("kubepods/burstable/pod7").trim(), "0-3");
    }

    /// An incremental pass plans a QoS cgroup alone (without its pods, see
    /// `planner::chain::Pool`) and names the children its model knows
    /// ([`Known::with_children`]): they count as scanned children that inherit, and are not read
    /// before the narrowing (here one was given a wide set behind the model's back, which the
    /// writer would otherwise find and hold the narrowing for). A child the model does not know
    /// is still read.
    #[test]
    fn a_cgroup_planned_alone_is_narrowed_without_reading_the_children_the_model_knows() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let make = |rel: &str, cpus: &str| make_cpus(root, rel, cpus);
        let (hierarchy, mut scan) = v2_burstable_tree(root, false);
        scan.cgroups.retain(|c| c.path.depth() <= 2);
        assert_eq!(scan.cgroups.len(), 2, "kubepods and burstable alone");
        let burstable = CgroupPath::new("kubepods/burstable").unwrap();
        let children: HashMap<CgroupPath, HashSet<std::ffi::OsString>> = [(
            burstable.clone(),
            (0..30).map(|n| format!("pod{n}").into()).collect(),
        )]
        .into();
        let parents = crate::planner::parent_indexes(&scan);
        let narrow = |value: &str| {
            let step = Step::new(
                burstable.clone(),
                InterfaceFile::CpusetCpus,
                value.into(),
                WriteStep::Narrow,
            );
            let known = Known::new(&scan, &parents, &[]).with_children(&children);
            apply(&hierarchy, vec![step].into(), &known).tally()
        };
        make("kubepods/burstable/pod7", "0-3");
        let tally = narrow("0,2-3");
        assert_eq!((tally.written, tally.stale), (1, 0), "{tally:?}");
        make("kubepods/burstable/new", "0-3");
        let tally = narrow("0,3");
        assert_eq!((tally.written, tally.stale), (0, 1), "{tally:?}");
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
        let path = |p: &str| CgroupPath::new(p).unwrap();
        let write = |p: &str, value: &str, step| {
            Step::new(path(p), InterfaceFile::CpusetCpus, value.into(), step)
        };
        let plan: WritePlan = vec![
            write("kubepods/pod/fresh", "1", WriteStep::Widen),
            write("kubepods/pod/ready", "1", WriteStep::Narrow),
            write("kubepods/pod", "1", WriteStep::Narrow),
        ]
        .into();
        let parents = crate::planner::parent_indexes(&scan);
        let known = Known::new(&scan, &parents, &[]);
        let read = |rel: &str| fs::read_to_string(cpuset.join(rel).join("cpuset.cpus")).unwrap();

        let executed = execute(
            &hierarchy,
            plan.clone(),
            &known,
            NewChildren::LetThemSettle,
            Budget::All,
        );
        let settling: Vec<&CgroupPath> = executed
            .with(|o| matches!(o, Outcome::Settling))
            .map(|s| &s.path)
            .collect();
        assert_eq!(settling, vec![&path("kubepods/pod")]);
        let tally = executed.tally();
        assert_eq!((tally.written, tally.skipped), (1, 1));
        assert_eq!(read("kubepods/pod/fresh"), "\n", "left to its runtime");
        assert_eq!(read("kubepods/pod/ready"), "1");
        assert_eq!(
            read("kubepods/pod"),
            "0-3\n",
            "narrowed once the child is set up"
        );

        // The one-shot commands set it up themselves and narrow at once.
        let executed = apply(&hierarchy, plan, &known);
        assert!(executed.tally().is_clean());
        assert_eq!(read("kubepods/pod/fresh"), "1");
        assert_eq!(read("kubepods/pod"), "1");
    }

    /// Issue 24: cgroups below the scan's depth limit that hold more are read and reported,
    /// never written by the writer on its own; the planner's steps for them (`apply` for the
    /// one-shot commands) narrow them, in order, and then the held-up narrowings.
    #[test]
    fn cgroups_below_the_scan_limit_are_reported_then_narrowed_by_planned_steps() {
        use crate::cgroupfs::MAX_SCAN_DEPTH;
        let dir = tempfile::tempdir().unwrap();
        let cpuset = dir.path().join("cpuset");
        let mut rel = "kubepods".to_string();
        let mut chain = vec![String::new(), rel.clone()];
        for level in 0..MAX_SCAN_DEPTH + 3 {
            rel = format!("{rel}/l{level}");
            chain.push(rel.clone());
        }
        for (depth, rel) in chain.iter().enumerate() {
            fs::create_dir_all(cpuset.join(rel)).unwrap();
            // Two levels past the limit hold none of the new value: widened first.
            let cpus = if depth > MAX_SCAN_DEPTH + 2 {
                "0"
            } else {
                "0-3"
            };
            fs::write(cpuset.join(rel).join("cpuset.cpus"), format!("{cpus}\n")).unwrap();
        }
        fs::create_dir_all(dir.path().join("cpu")).unwrap();
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
        let limit = MAX_SCAN_DEPTH + 1;
        assert_eq!(
            scan.cgroups.len(),
            limit,
            "kubepods and the levels it scans"
        );
        let narrow = |rel: &str| {
            let path = CgroupPath::new(rel).unwrap();
            Step::new(
                path,
                InterfaceFile::CpusetCpus,
                "2-3".into(),
                WriteStep::Narrow,
            )
        };
        let plan: WritePlan = chain[2..=limit]
            .iter()
            .rev()
            .map(|r| narrow(r))
            .collect::<Vec<_>>()
            .into();
        let parents = crate::planner::parent_indexes(&scan);
        let known = Known::new(&scan, &parents, &[]);
        let read = |rel: &str| fs::read_to_string(cpuset.join(rel).join("cpuset.cpus")).unwrap();
        let executed = execute(
            &hierarchy,
            plan.clone(),
            &known,
            NewChildren::NarrowNow,
            Budget::All,
        );
        let Outcome::UnseenInTheWay { found } = &executed.done[0].outcome else {
            panic!("{:?}", executed.done[0]);
        };
        let found: Vec<String> = found.iter().map(|(p, c)| format!("{p} {c}")).collect();
        let expected: Vec<String> = chain[limit..]
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{r} {}", if i >= 2 { "0" } else { "0-3" }))
            .collect();
        assert_eq!(found, expected);
        assert_eq!(
            executed.tally().skipped,
            plan.len() - 1,
            "its ancestors wait"
        );
        assert!(
            chain[2..].iter().all(|r| read(r).trim() != "2-3"),
            "nothing written"
        );

        let mut unseen = executed;
        assert!(narrow_unseen(&hierarchy, &mut unseen));
        let values: Vec<String> = unseen.done[plan.len()..]
            .iter()
            .map(|d| format!("{}:{}", d.step.path.depth() - limit, d.step.value))
            .collect();
        let order = ["2:0,2-3", "3:0,2-3", "3:2-3", "2:2-3", "1:2-3", "0:2-3"];
        assert_eq!(values, order, "widened top-down, then narrowed bottom-up");

        let executed = apply(&hierarchy, plan, &known);
        assert!(executed.tally().is_clean(), "{:?}", executed.tally());
        for rel in &chain[2..] {
            assert_eq!(read(rel).trim(), "2-3", "{rel}");
        }
    }

    #[test]
    fn a_budget_makes_the_urgent_prefix_and_holds_back_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let cpuset = dir.path().join("cpuset");
        for rel in ["", "kubepods", "kubepods/a", "kubepods/b"] {
            fs::create_dir_all(cpuset.join(rel)).unwrap();
            fs::write(cpuset.join(rel).join("cpuset.cpus"), "0-3\n").unwrap();
        }
        fs::create_dir_all(dir.path().join("cpu")).unwrap();
        let layout = CgroupLayout {
            version: CgroupVersion::V1,
            driver: CgroupDriver::Cgroupfs,
            cpuset_root: cpuset.clone(),
            cpu_root: dir.path().join("cpu"),
            kubepods: CgroupPath::new("kubepods").unwrap(),
        };
        let hierarchy = Hierarchy::open(&layout).unwrap();
        let path = |p: &str| CgroupPath::new(p).unwrap();
        let step = |p: &str| {
            Step::new(
                path(p),
                InterfaceFile::CpusetCpus,
                "1".into(),
                WriteStep::Narrow,
            )
        };
        let mut plan: WritePlan = vec![step("kubepods/a"), step("kubepods/b")].into();
        crate::planner::order::urgent_first(&mut plan, |s| s.path == path("kubepods/b"));
        assert_eq!(plan.urgent_len(), 1);
        let known = Known::nothing();
        let outcomes = |executed: &Executed| -> Vec<(String, bool)> {
            let done = executed.done.iter();
            done.map(|d| {
                (
                    d.step.path.to_string(),
                    matches!(d.outcome, Outcome::Written),
                )
            })
            .collect()
        };
        let arrived = || true;
        for budget in [
            Budget::UrgentOnly,
            Budget::Yield {
                after: 0,
                arrived: &arrived,
            },
        ] {
            let executed = execute(
                &hierarchy,
                plan.clone(),
                &known,
                NewChildren::NarrowNow,
                budget,
            );
            let expected = vec![
                ("kubepods/b".to_string(), true),
                ("kubepods/a".to_string(), false),
            ];
            assert_eq!(outcomes(&executed), expected, "{budget:?}");
            assert_eq!(executed.tally().held_back, 1);
            assert!(executed.urgent_done.is_some());
        }
        let executed = execute(
            &hierarchy,
            plan,
            &known,
            NewChildren::NarrowNow,
            Budget::All,
        );
        assert_eq!(executed.tally().written, 2);
    }
}
