//! What a pass plans: the whole tree, or (an incremental pass) a *chain*: pods' subtrees and
//! their ancestors up to kubepods. A chain writes in its pods and widens its ancestors; their
//! narrowings wait for a full pass. A chain may also plan the shared pool's members ([`Pool`]:
//! the few cgroups that hold the pool in a set of their own, on cgroup v2 with inheritance),
//! and then makes their rewrites itself, after its pins. [`assert_chain_is_full_plan`] holds a
//! chain's plan to a full plan of the same tree (debug builds and tests check every incremental
//! pass with it).

use std::collections::{HashMap, HashSet};

use crate::cgroupfs::{CgroupPath, Scan};

use super::{Plan, Step, WriteStep};

/// What a pass plans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The whole model.
    Full,
    /// New pods: their subtrees (`roots`) and the roots' ancestors; with `pool`, the shared
    /// pool's members too.
    Chain {
        roots: Vec<CgroupPath>,
        pool: Option<Pool>,
    },
}

/// The shared pool's members a chain plans, so that a change of the pool is written in the
/// chain's own pass: every cgroup that holds some of the pool in a set of its own. Those in a
/// pod are planned with their pod (among the chain's `roots`: a pod's set is its children's
/// union); the others (the QoS cgroups, directories of no pod) are planned `alone`, without
/// their subtrees (whose cgroups follow them on cgroup v2), below their ancestors.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pool {
    pub alone: Vec<CgroupPath>,
}

impl Mode {
    pub fn is_full(&self) -> bool {
        matches!(self, Mode::Full)
    }

    /// Whether the pass plans `path`'s own values (and writes them): in a chain, only the
    /// pods' subtrees and the pool's members planned alone, not their ancestors.
    pub fn owns(&self, path: &CgroupPath) -> bool {
        match self {
            Mode::Full => true,
            Mode::Chain { roots, pool } => {
                roots.iter().any(|r| path.strip_prefix(r).is_some())
                    || pool.as_ref().is_some_and(|p| p.alone.contains(path))
            }
        }
    }

    /// The pool's members a chain plans alone, without their subtrees (none for a full pass).
    pub fn alone(&self) -> &[CgroupPath] {
        match self {
            Mode::Chain {
                pool: Some(pool), ..
            } => &pool.alone,
            _ => &[],
        }
    }

    /// Whether the pass plans the shared pool's members (a full pass, or a chain with its
    /// [`Pool`]): nothing of a change of the pool is left for a later pass.
    pub fn plans_pool(&self) -> bool {
        match self {
            Mode::Full => true,
            Mode::Chain { pool, .. } => pool.is_some(),
        }
    }

    /// Whether the pass makes `step` of a cgroup it planned: one in its pods, or a widening
    /// of an ancestor (top-down, before the pods: a pool that grew reaches a new pod through
    /// them).
    pub fn makes(&self, step: &Step) -> bool {
        step.step == WriteStep::Widen || self.owns(&step.path)
    }
}

/// The reference an incremental pass is held to: a full plan of the same model (`full`, from
/// the same assignments as the chain's) decides the same assignments, pools and events, and
/// the same desired sets and writes for every cgroup of the `chain`. A chain that plans the
/// shared pool ([`Mode::plans_pool`]) is held to more: the full plan writes nothing outside
/// the chain. Panics where it does not.
pub fn assert_chain_is_full_plan(chain: (&Scan, &Plan), full: (&Scan, &Plan), mode: &Mode) {
    let ((chain, planned), (scan, full)) = (chain, full);
    assert_eq!(
        planned.assignments, full.assignments,
        "an incremental pass assigned what a full plan would not"
    );
    assert_eq!(planned.pools, full.pools, "an incremental pass's pools");
    assert_eq!(planned.events, full.events, "an incremental pass's events");
    let index: HashMap<&CgroupPath, usize> = scan
        .cgroups
        .iter()
        .enumerate()
        .map(|(i, c)| (&c.path, i))
        .collect();
    for (cgroup, desired) in chain.cgroups.iter().zip(&planned.desired) {
        assert_eq!(
            Some(desired),
            index.get(&cgroup.path).map(|&i| &full.desired[i]),
            "an incremental pass's desired sets of {}",
            cgroup.path
        );
    }
    let chain_paths: HashSet<&CgroupPath> = chain.cgroups.iter().map(|c| &c.path).collect();
    if mode.plans_pool() {
        let outside = full.writes.iter().find(|w| !chain_paths.contains(&w.path));
        assert_eq!(
            outside, None,
            "an incremental pass that plans the shared pool left a write out of its chain"
        );
    }
    let key = |w: &Step| (w.path.clone(), w.file, w.value.clone(), w.step);
    let mut mine: Vec<_> = planned.writes.iter().map(key).collect();
    let in_chain = |w: &&Step| {
        mode.owns(&w.path) || (w.step == WriteStep::Widen && chain_paths.contains(&w.path))
    };
    let mut theirs: Vec<_> = full.writes.iter().filter(in_chain).map(key).collect();
    mine.sort();
    theirs.sort();
    assert_eq!(
        mine, theirs,
        "an incremental pass's writes (in its pods, and its ancestors' widenings)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroupfs::{CgroupVersion, CpuSettings, FileValue, InterfaceFile, ScannedCgroup};
    use crate::state::Assignments;

    fn path(text: &str) -> CgroupPath {
        CgroupPath::new(text).unwrap()
    }

    fn scan(paths: &[&str]) -> Scan {
        let cgroup = |p: &str| ScannedCgroup {
            path: path(p),
            relative: path(p),
            cpus: FileValue::Missing,
            mems: FileValue::Missing,
            effective_cpus: FileValue::Missing,
            cpu: CpuSettings::V2 {
                max: FileValue::Missing,
                weight: FileValue::Missing,
            },
        };
        Scan {
            version: CgroupVersion::V2,
            kubepods: path("kubepods"),
            inherits: false,
            cgroups: paths.iter().map(|p| cgroup(p)).collect(),
            skipped: Vec::new(),
            complete: true,
            truncated: false,
            gone_pods: Default::default(),
        }
    }

    fn plan(writes: &[(&str, &str, WriteStep)]) -> Plan {
        let step = |&(p, v, s): &(&str, &str, WriteStep)| {
            Step::new(path(p), InterfaceFile::CpusetCpus, v.into(), s)
        };
        Plan {
            pools: None,
            desired: Vec::new(),
            parents: Vec::new(),
            assignments: Assignments::default(),
            events: Vec::new(),
            writes: writes.iter().map(step).collect::<Vec<_>>().into(),
        }
    }

    fn chain() -> Mode {
        Mode::Chain {
            roots: vec![path("kubepods/pod-a")],
            pool: None,
        }
    }

    /// The chain of `chain()` that also plans the shared pool: `kubepods/burstable` alone.
    fn pool_chain() -> Mode {
        Mode::Chain {
            roots: vec![path("kubepods/pod-a")],
            pool: Some(Pool {
                alone: vec![path("kubepods/burstable")],
            }),
        }
    }

    #[test]
    fn a_chain_owns_its_pods_and_widens_their_ancestors_only() {
        let mode = chain();
        assert!(mode.owns(&path("kubepods/pod-a/c")) && !mode.owns(&path("kubepods")));
        assert!(!mode.owns(&path("kubepods/pod-ab")));
        let step = |p: &str, s| Step::new(path(p), InterfaceFile::CpusetCpus, "1".into(), s);
        assert!(mode.makes(&step("kubepods", WriteStep::Widen)));
        assert!(!mode.makes(&step("kubepods", WriteStep::Narrow)));
        assert!(Mode::Full.makes(&step("kubepods", WriteStep::Narrow)));
    }

    /// The full plan also narrows kubepods and writes another pod: not the chain's.
    fn full() -> (Scan, Plan) {
        let full = plan(&[
            ("kubepods", "0-3", WriteStep::Widen),
            ("kubepods/pod-a/c", "2", WriteStep::Narrow),
            ("kubepods/pod-b/c", "0-1", WriteStep::Narrow),
            ("kubepods", "0-2", WriteStep::Narrow),
        ]);
        let scan = scan(&["kubepods", "kubepods/pod-a/c", "kubepods/pod-b/c"]);
        (scan, full)
    }

    #[test]
    fn a_chain_that_makes_what_a_full_plan_makes_there_passes() {
        let chain_scan = scan(&["kubepods", "kubepods/pod-a/c"]);
        let planned = plan(&[
            ("kubepods/pod-a/c", "2", WriteStep::Narrow),
            ("kubepods", "0-3", WriteStep::Widen),
        ]);
        let (scan, full) = full();
        assert_chain_is_full_plan((&chain_scan, &planned), (&scan, &full), &chain());
    }

    #[test]
    #[should_panic(expected = "an incremental pass's writes")]
    fn a_chain_that_leaves_out_an_ancestors_widening_fails() {
        let chain_scan = scan(&["kubepods", "kubepods/pod-a/c"]);
        let planned = plan(&[("kubepods/pod-a/c", "2", WriteStep::Narrow)]);
        let (scan, full) = full();
        assert_chain_is_full_plan((&chain_scan, &planned), (&scan, &full), &chain());
    }

    #[test]
    fn a_chain_with_the_pool_owns_its_members_alone_not_their_subtrees() {
        let mode = pool_chain();
        assert!(mode.plans_pool() && !chain().plans_pool());
        assert!(mode.owns(&path("kubepods/burstable")));
        assert!(!mode.owns(&path("kubepods/burstable/pod-x")));
        assert!(!mode.owns(&path("kubepods")) && mode.owns(&path("kubepods/pod-a/c")));
    }

    /// The full plan of a pin beside a QoS cgroup: the pin, then the QoS cgroup narrowed.
    fn full_with_qos(other: Option<(&str, &str)>) -> (Scan, Plan) {
        let mut writes = vec![
            ("kubepods/pod-a/c", "2", WriteStep::Widen),
            ("kubepods/burstable", "0-1,3", WriteStep::Narrow),
        ];
        let mut paths = vec!["kubepods", "kubepods/burstable", "kubepods/pod-a/c"];
        if let Some((p, v)) = other {
            writes.push((p, v, WriteStep::Narrow));
            paths.push(p);
        }
        (scan(&paths), plan(&writes))
    }

    #[test]
    fn a_chain_that_plans_the_pool_makes_its_members_writes() {
        let chain_scan = scan(&["kubepods", "kubepods/burstable", "kubepods/pod-a/c"]);
        let planned = plan(&[
            ("kubepods/pod-a/c", "2", WriteStep::Widen),
            ("kubepods/burstable", "0-1,3", WriteStep::Narrow),
        ]);
        let (scan, full) = full_with_qos(None);
        assert_chain_is_full_plan((&chain_scan, &planned), (&scan, &full), &pool_chain());
    }

    #[test]
    #[should_panic(expected = "an incremental pass's writes")]
    fn a_chain_that_plans_the_pool_but_leaves_a_members_narrowing_out_fails() {
        let chain_scan = scan(&["kubepods", "kubepods/burstable", "kubepods/pod-a/c"]);
        let planned = plan(&[("kubepods/pod-a/c", "2", WriteStep::Widen)]);
        let (scan, full) = full_with_qos(None);
        assert_chain_is_full_plan((&chain_scan, &planned), (&scan, &full), &pool_chain());
    }

    /// Without the pool, the same chain may leave the full plan's writes elsewhere (they wait
    /// for the full pass); with it, one left out of the chain is a member it missed.
    #[test]
    #[should_panic(expected = "left a write out of its chain")]
    fn a_chain_that_plans_the_pool_misses_no_write_of_the_full_plan() {
        let chain_scan = scan(&["kubepods", "kubepods/burstable", "kubepods/pod-a/c"]);
        let planned = plan(&[
            ("kubepods/pod-a/c", "2", WriteStep::Widen),
            ("kubepods/burstable", "0-1,3", WriteStep::Narrow),
        ]);
        let (scan, full) = full_with_qos(Some(("kubepods/besteffort", "0-1,3")));
        assert_chain_is_full_plan((&chain_scan, &planned), (&scan, &full), &chain_with_qos());
        assert_chain_is_full_plan((&chain_scan, &planned), (&scan, &full), &pool_chain());
    }

    /// The chain of `pool_chain()` without its pool, but with `kubepods/burstable` among its
    /// roots (so it owns the same cgroups): it may leave `besteffort` to the full pass.
    fn chain_with_qos() -> Mode {
        Mode::Chain {
            roots: vec![path("kubepods/pod-a"), path("kubepods/burstable")],
            pool: None,
        }
    }
}
