//! The scan: a read-only walk of the kubepods subtree into plain values ([`Scan`]) that the
//! classifier and the planner consume without touching the filesystem.
//!
//! For every cgroup directory below (and including) the kubepods root the scan records its path,
//! its current `cpuset.cpus` / `cpuset.mems` / effective CPUs, and its CPU settings from the
//! right place: on v1 the same relative path under the cpu controller mount (`cpu.shares`,
//! `cpu.cfs_quota_us`, `cpu.cfs_period_us`), on v2 the directory itself (`cpu.max`,
//! `cpu.weight`). A value that cannot be read or parsed is kept as such in its field and logged
//! once; the scan as a whole fails only when the kubepods root itself cannot be read. Symlinks
//! and special files are never followed, directories that vanish mid-scan are skipped, and depth
//! and size are bounded.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;

use crate::cpuset::CpuSet;
use crate::logging::{error_chain, LogOnce};

use super::fs::{CgroupError, CgroupFs, DirentBuffer, FileAt, FileKind, InterfaceFile, Refusal};
use super::layout::{CgroupLayout, CgroupVersion};
use super::path::CgroupPath;
use super::values::{
    parse_cfs_period, parse_cfs_quota, parse_cpu_max, parse_cpuset, parse_shares, parse_weight,
    CpuMax, Quota, ValueError,
};

/// Deepest cgroup scanned, counted from the kubepods root (a pod's container is at depth 2 or 3).
pub const MAX_SCAN_DEPTH: usize = 32;
/// Most cgroups recorded in one scan; beyond this the scan is marked incomplete.
pub const MAX_SCAN_CGROUPS: usize = 65_536;

/// The value of one interface file as the scan found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileValue<T> {
    /// The file does not exist (controller not enabled, cgroup not under this controller).
    Missing,
    Value(T),
    /// The file holds text that is not a valid value; kept as found.
    Invalid {
        text: String,
        /// Boxed: a scan holds six values per cgroup, nearly always valid.
        error: Box<ValueError>,
    },
    /// The file exists but could not be read (permission, a symlink or FIFO in its place...).
    Unreadable {
        error: String,
    },
}

impl<T> FileValue<T> {
    /// The parsed value, if there is one.
    pub fn value(&self) -> Option<&T> {
        match self {
            FileValue::Value(value) => Some(value),
            _ => None,
        }
    }

    pub fn is_missing(&self) -> bool {
        matches!(self, FileValue::Missing)
    }
}

impl FileValue<CpuSet> {
    /// The set when one is configured. `None` for an empty value: on v1 a cpuset cgroup that is
    /// not yet initialised (the runtime copies its parent's set in shortly), on v2 a cgroup that
    /// inherits its parent's set. Neither is drift.
    pub fn configured(&self) -> Option<&CpuSet> {
        self.value().filter(|set| !set.is_empty())
    }
}

/// The CPU bandwidth settings of a cgroup, from wherever its cgroup version keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSettings {
    V1 {
        shares: FileValue<u64>,
        cfs_quota: FileValue<Quota>,
        cfs_period_us: FileValue<u64>,
    },
    V2 {
        max: FileValue<CpuMax>,
        weight: FileValue<u64>,
    },
}

/// One cgroup directory as found by the scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedCgroup {
    /// Relative to the controller root(s): what reads and writes take.
    pub path: CgroupPath,
    /// Relative to the kubepods root (the root itself is the empty path): what classification
    /// takes.
    pub relative: CgroupPath,
    pub cpus: FileValue<CpuSet>,
    pub mems: FileValue<CpuSet>,
    /// v1 `cpuset.effective_cpus`, v2 `cpuset.cpus.effective`.
    pub effective_cpus: FileValue<CpuSet>,
    pub cpu: CpuSettings,
}

/// Why an entry of the tree was not scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// A symlink: never followed.
    Symlink,
    /// A FIFO, socket or device where only directories and interface files belong.
    SpecialFile(FileKind),
    /// Deeper than [`MAX_SCAN_DEPTH`].
    TooDeep,
    /// The directory could not be listed (the error is logged).
    Unlistable,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Symlink => f.write_str("symlink, not followed"),
            SkipReason::SpecialFile(kind) => write!(f, "{kind} inside the cgroup tree"),
            SkipReason::TooDeep => write!(f, "deeper than {MAX_SCAN_DEPTH} levels"),
            SkipReason::Unlistable => f.write_str("cannot be listed"),
        }
    }
}

/// An entry the scan left out, relative to the controller root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEntry {
    pub path: CgroupPath,
    pub reason: SkipReason,
}

/// The result of one scan. `cgroups` is in pre-order (every parent before its children,
/// siblings by name), starting with the kubepods root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    pub version: CgroupVersion,
    pub kubepods: CgroupPath,
    pub cgroups: Vec<ScannedCgroup>,
    /// cgroup v2 under a kernel that keeps `cpuset.cpus.effective` (see
    /// [`keeps_effective_sets`]): a child whose `cpuset.cpus` is empty follows its parent, and
    /// the planner leaves such a child empty where that gives it what it should have.
    pub inherits: bool,
    pub skipped: Vec<SkippedEntry>,
    /// False when [`MAX_SCAN_CGROUPS`] was reached and the rest of the tree was not scanned
    /// (or when the scan is an incremental pass's part of the model).
    pub complete: bool,
    /// The walk stopped at its limit ([`MAX_SCAN_CGROUPS`]): what the cgroups past it hold is
    /// not known, so the planner gives no new exclusive CPUs and does not let the shared pool
    /// grow until a scan sees the whole tree (an incremental pass's part of the model is not
    /// truncated: the model behind it is whole).
    pub truncated: bool,
    /// Pods the scan did not cover but that are known to be gone (an incremental pass's scan):
    /// their assignments are released even when the scan is not complete.
    pub gone_pods: BTreeSet<String>,
}

impl ScannedCgroup {
    /// The cgroup as it reads after a successful write of `value` to `file` (what the kernel
    /// shows: the values the agent writes are canonical). Files the scan does not keep are
    /// ignored.
    pub fn assume_written(&mut self, file: InterfaceFile, value: &str) {
        fn known<T>(parsed: Result<T, ValueError>) -> Option<FileValue<T>> {
            parsed.map(FileValue::Value).ok()
        }
        match (file, &mut self.cpu) {
            (InterfaceFile::CpusetCpus, _) => {
                if let Some(v) = known(parse_cpuset(value)) {
                    self.cpus = v;
                }
            }
            (InterfaceFile::CpusetMems, _) => {
                if let Some(v) = known(parse_cpuset(value)) {
                    self.mems = v;
                }
            }
            (InterfaceFile::CpuCfsQuotaUs, CpuSettings::V1 { cfs_quota, .. }) => {
                if let Some(v) = known(parse_cfs_quota(value)) {
                    *cfs_quota = v;
                }
            }
            (InterfaceFile::CpuMax, CpuSettings::V2 { max, .. }) => {
                if let Some(v) = known(parse_cpu_max(value)) {
                    *max = v;
                }
            }
            _ => {}
        }
    }

    /// Equal in everything the agent decides on: the effective cpus (the kernel's derived
    /// value, never planned from) are left out.
    pub fn same_settings(&self, other: &ScannedCgroup) -> bool {
        self.path == other.path
            && self.relative == other.relative
            && self.cpus == other.cpus
            && self.mems == other.mems
            && self.cpu == other.cpu
    }
}

impl Scan {
    /// The scanned cgroup at `relative` (relative to the kubepods root).
    pub fn get(&self, relative: &CgroupPath) -> Option<&ScannedCgroup> {
        self.cgroups.iter().find(|c| &c.relative == relative)
    }
}

/// Each cgroup's `cpuset.cpus` as a full scan saw it: what a quiet reconcile tick compares
/// the tree with (see [`Scanner::cpusets_unchanged`]). The reconcile thread keeps one through
/// its whole period, so it is compact: the paths front-coded in scan order in one buffer (per
/// cgroup, the length it shares with the path before, then the length and bytes of the rest),
/// not a path allocation each (at 10,000 containers about 1.3 MiB instead of 2.4).
#[derive(Debug, Clone, Default)]
pub struct CpusetSnapshot {
    paths: Vec<u8>,
    /// `None`: the scan read no value there (a tick then scans in full).
    cpus: Vec<Option<CpuSet>>,
}

impl CpusetSnapshot {
    pub fn of(scan: &Scan) -> CpusetSnapshot {
        let mut paths = Vec::new();
        let mut last: &[u8] = &[];
        for cgroup in &scan.cgroups {
            let path = cgroup.path.as_bytes();
            let shared = last.iter().zip(path).take_while(|(a, b)| a == b).count();
            for len in [shared, path.len() - shared] {
                // A path is far below 4 GiB (a scan's depth is 32 names).
                paths.extend_from_slice(&(len as u32).to_le_bytes());
            }
            paths.extend_from_slice(&path[shared..]);
            last = path;
        }
        paths.shrink_to_fit();
        let cpus = scan.cgroups.iter().map(|c| c.cpus.value().cloned());
        CpusetSnapshot {
            paths,
            cpus: cpus.collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// Each cgroup's path (`None` if it no longer parses, which a path taken from a scan always
    /// does) and the set the scan read there, in scan order.
    fn entries(&self) -> impl Iterator<Item = (Option<CgroupPath>, Option<&CpuSet>)> + '_ {
        fn len(rest: &mut &[u8]) -> usize {
            let (bytes, after) = rest.split_at(4);
            *rest = after;
            u32::from_le_bytes(bytes.try_into().expect("four bytes")) as usize
        }
        let mut rest = &self.paths[..];
        let mut path = Vec::new();
        self.cpus.iter().map(move |cpus| {
            let shared = len(&mut rest);
            let own = len(&mut rest);
            let (own, after) = rest.split_at(own);
            rest = after;
            path.truncate(shared);
            path.extend_from_slice(own);
            let parsed = CgroupPath::from_os(std::ffi::OsStr::from_bytes(&path)).ok();
            (parsed, cpus.as_ref())
        })
    }
}

/// The controller hierarchies the agent reads and writes: the cpuset one and the cpu one (the
/// same tree on v2, and on v1 when the controllers are mounted together).
#[derive(Debug, Clone)]
pub struct Hierarchy {
    pub version: CgroupVersion,
    pub cpuset: CgroupFs,
    pub cpu: CgroupFs,
}

impl Hierarchy {
    /// Where `file` lives: cpuset files in the cpuset hierarchy, cpu files in the cpu one.
    pub fn fs_of(&self, file: InterfaceFile) -> &CgroupFs {
        match file {
            InterfaceFile::CpuCfsQuotaUs
            | InterfaceFile::CpuCfsPeriodUs
            | InterfaceFile::CpuMax
            | InterfaceFile::CpuShares
            | InterfaceFile::CpuWeight => &self.cpu,
            _ => &self.cpuset,
        }
    }

    /// Opens the controller roots of a layout.
    pub fn open(layout: &CgroupLayout) -> Result<Hierarchy, CgroupError> {
        let cpuset = CgroupFs::open(&layout.cpuset_root)?;
        let cpu = if layout.cpu_root == layout.cpuset_root {
            cpuset.clone()
        } else {
            CgroupFs::open(&layout.cpu_root)?
        };
        Ok(Hierarchy {
            version: layout.version,
            cpuset,
            cpu,
        })
    }
}

/// The directories of a cgroup the scan holds open while it visits the cgroup's children:
/// its cpuset directory and, on v1, its cpu directory (when it has one).
#[derive(Debug)]
struct OpenDirs {
    cpuset: OwnedFd,
    cpu: Option<OwnedFd>,
}

/// A cgroup the scan is still to visit, with its parent's open directories (none for the
/// cgroup the walk starts at).
#[derive(Debug)]
struct Pending {
    path: CgroupPath,
    parent: Option<Rc<OpenDirs>>,
}

/// One listing of a cgroup's cpuset directory (see [`Scanner::list`]).
#[derive(Debug)]
struct Listing {
    /// The kind of each file of [`Scanner::cpuset_dir_files`], in its order; `None` for a
    /// file that is not there.
    kinds: [Option<FileKind>; 5],
    /// Every entry that is not a regular file (child cgroups, symlinks, special files).
    others: Vec<(OsString, FileKind)>,
}

type ListResult = Result<Listing, CgroupError>;

/// Scans the kubepods subtree; keeps which problems were logged so each is logged once.
#[derive(Debug)]
pub struct Scanner {
    hierarchy: Hierarchy,
    kubepods: CgroupPath,
    problems: LogOnce,
    max_cgroups: usize,
    /// See [`Scan::inherits`].
    inherits: bool,
}

/// Whether a kernel keeps the cpuset hierarchy's effective sets: a real cgroup v2 mount, or
/// (debug builds) a fake tree under the fake kernel's rules, which model them. A plain tmpfs
/// tree (`cpusetd demo` in a release build, benches) has no kernel to make an empty cpuset
/// follow its parent, so every cgroup there is written as on v1.
pub fn keeps_effective_sets(hierarchy: &Hierarchy) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
    if hierarchy.version != CgroupVersion::V2 {
        return false;
    }
    #[cfg(debug_assertions)]
    if super::fake_kernel::models_effective_sets(&hierarchy.cpuset) {
        return true;
    }
    statfs(hierarchy.cpuset.root()).is_ok_and(|st| st.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

impl Scanner {
    pub fn new(hierarchy: Hierarchy, kubepods: CgroupPath) -> Scanner {
        Scanner {
            inherits: keeps_effective_sets(&hierarchy),
            hierarchy,
            kubepods,
            problems: LogOnce::new(),
            max_cgroups: MAX_SCAN_CGROUPS,
        }
    }

    /// The same scanner stopping after `max` cgroups instead of [`MAX_SCAN_CGROUPS`] (tests
    /// of what an incomplete scan may and may not do, without 65,536 directories).
    /// See [`Scan::inherits`].
    pub fn inherits(&self) -> bool {
        self.inherits
    }

    pub fn with_max_cgroups(mut self, max: usize) -> Scanner {
        self.max_cgroups = max;
        self
    }

    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The kubepods cgroup, relative to the controller roots.
    pub fn kubepods(&self) -> &CgroupPath {
        &self.kubepods
    }

    /// The CPUs and memory nodes kubepods' parent lets its children have now: its effective
    /// sets (which the kernel keeps free of offline CPUs), or its configured ones where the
    /// effective file is missing. `None` for what cannot be read (no limit is then applied).
    pub fn kubepods_parent_limits(&self) -> (Option<CpuSet>, Option<CpuSet>) {
        let Some(parent) = self.kubepods.parent() else {
            return (None, None);
        };
        let cpuset = &self.hierarchy.cpuset;
        let (cpus_effective, mems_effective) = match self.hierarchy.version {
            CgroupVersion::V1 => (
                InterfaceFile::CpusetEffectiveCpus,
                InterfaceFile::CpusetEffectiveMems,
            ),
            CgroupVersion::V2 => (
                InterfaceFile::CpusetCpusEffective,
                InterfaceFile::CpusetMemsEffective,
            ),
        };
        let read = |effective, configured| {
            [effective, configured]
                .into_iter()
                .find_map(|file| {
                    cpuset
                        .read_file(&parent, file)
                        .ok()
                        .and_then(|text| parse_cpuset(&text).ok())
                })
                .filter(|set| !set.is_empty())
        };
        let cpus = read(cpus_effective, InterfaceFile::CpusetCpus)
            .map(|cpus| cpus.union(&self.isolated_for_pods()));
        (cpus, read(mems_effective, InterfaceFile::CpusetMems))
    }

    /// cgroup v2: the CPUs of isolated partitions below kubepods, which the kernel takes out of
    /// every effective set outside them, kubepods' parent's included (Linux 6.12, the
    /// `sched-v2` scenario of `scripts/vm-e2e.sh`). They still belong to pods: kubepods'
    /// `cpuset.cpus.exclusive` (only ever set to hand CPUs down to such partitions) that the
    /// root's `cpuset.cpus.isolated` lists. Empty on v1, before Linux 6.8 (no
    /// `cpuset.cpus.isolated`) and where either file cannot be read.
    fn isolated_for_pods(&self) -> CpuSet {
        let cpuset = &self.hierarchy.cpuset;
        if self.hierarchy.version != CgroupVersion::V2 {
            return CpuSet::new();
        }
        let read = |path: &CgroupPath, file| {
            cpuset
                .read_file(path, file)
                .ok()
                .and_then(|text| parse_cpuset(&text).ok())
                .unwrap_or_default()
        };
        let held = read(&self.kubepods, InterfaceFile::CpusetCpusExclusive);
        if held.is_empty() {
            return held;
        }
        held.intersection(&read(
            &CgroupPath::root(),
            InterfaceFile::CpusetCpusIsolated,
        ))
    }

    /// Walks the kubepods subtree. Fails only when the kubepods root cannot be opened or listed.
    pub fn scan(&mut self) -> Result<Scan, CgroupError> {
        self.problems.next_pass();
        let root = self.kubepods.clone();
        // Surface a missing or refused root as an error instead of an empty scan.
        self.hierarchy.cpuset.list(&root)?;
        let mut scan = self.empty_scan();
        self.walk(root, &mut scan);
        Ok(scan)
    }

    /// Scans the subtree at `path` (relative to the controller root, at or below the kubepods
    /// root): its cgroups in pre-order. Empty when it is gone or not below the kubepods root.
    /// What the agent reads when a directory appears.
    pub fn scan_subtree(&mut self, path: &CgroupPath) -> Scan {
        let mut scan = self.empty_scan();
        if path.strip_prefix(&self.kubepods).is_some() {
            self.walk(path.clone(), &mut scan);
        }
        scan
    }

    /// Reads one cgroup without its children; `None` when it is gone or not below the kubepods
    /// root. What the agent reads when an interface file changes.
    pub fn read_cgroup(&mut self, path: &CgroupPath) -> Option<ScannedCgroup> {
        path.strip_prefix(&self.kubepods)?;
        let mut scan = self.empty_scan();
        let dir = self.open_cgroup(path, None, &mut scan)?;
        let listing = self.list(path, &dir, &mut DirentBuffer::new());
        let (cgroup, _) = self.read_values(path, &dir, None, &listing)?;
        Some(cgroup)
    }

    /// Reads every snapshot cgroup's `cpuset.cpus` once (one `openat2` each): `true` when each
    /// still reads as the snapshot says, `false` at the first that does not (changed, gone,
    /// unreadable) or when the snapshot holds a value that was not a plain set.
    pub fn cpusets_unchanged(&mut self, snapshot: &CpusetSnapshot) -> bool {
        let cpuset = self.hierarchy.cpuset.clone();
        snapshot.entries().all(|(path, seen)| {
            let (Some(path), Some(seen)) = (path, seen) else {
                return false;
            };
            match cpuset.read_file(&path, InterfaceFile::CpusetCpus) {
                Ok(text) => parse_cpuset(&text).is_ok_and(|now| &now == seen),
                Err(_) => false,
            }
        })
    }

    /// The CPU settings of the cgroup at `path` as a group (v1 shares, quota and period; v2
    /// `cpu.max` and `cpu.weight`), each file's problem noted as for a full read. Each file in
    /// one `openat2` of its path ([`CgroupFs::read_file`], which falls back to the walk and
    /// its messages), not a walk to the directory and an open beneath it.
    fn read_cpu_settings(&mut self, path: &CgroupPath) -> CpuSettings {
        let cpu_fs = self.hierarchy.cpu.clone();
        match self.hierarchy.version {
            CgroupVersion::V1 => {
                let shares = cpu_fs.read_file(path, InterfaceFile::CpuShares);
                let quota = cpu_fs.read_file(path, InterfaceFile::CpuCfsQuotaUs);
                let period = cpu_fs.read_file(path, InterfaceFile::CpuCfsPeriodUs);
                CpuSettings::V1 {
                    shares: self.value(path, InterfaceFile::CpuShares, shares, parse_shares),
                    cfs_quota: self.value(
                        path,
                        InterfaceFile::CpuCfsQuotaUs,
                        quota,
                        parse_cfs_quota,
                    ),
                    cfs_period_us: self.value(
                        path,
                        InterfaceFile::CpuCfsPeriodUs,
                        period,
                        parse_cfs_period,
                    ),
                }
            }
            CgroupVersion::V2 => {
                let max = cpu_fs.read_file(path, InterfaceFile::CpuMax);
                let weight = cpu_fs.read_file(path, InterfaceFile::CpuWeight);
                CpuSettings::V2 {
                    max: self.value(path, InterfaceFile::CpuMax, max, parse_cpu_max),
                    weight: self.value(path, InterfaceFile::CpuWeight, weight, parse_weight),
                }
            }
        }
    }

    /// Re-reads, in place, what a modification of `file` can have changed: `cpuset.cpus` or
    /// `cpuset.mems` alone (one `openat2` of the file; the effective cpus, which nothing is
    /// planned from, keep the value of the last full read), or the CPU settings as a group
    /// (v1 shares, quota and period; v2 `cpu.max` and `cpu.weight`). What the agent reads when
    /// the watcher names a modified file: the other watched files have their own events.
    /// Returns `false` when the cgroup is gone; any other file is read with the whole cgroup,
    /// as [`Self::read_cgroup`] does.
    pub fn refresh(&mut self, cgroup: &mut ScannedCgroup, file: InterfaceFile) -> bool {
        let path = cgroup.path.clone();
        let cpuset = self.hierarchy.cpuset.clone();
        match file {
            InterfaceFile::CpusetCpus | InterfaceFile::CpusetMems => {
                let read = cpuset.read_file(&path, file);
                if read.as_ref().is_err_and(|e| e.is_gone()) && !cpuset.exists(&path) {
                    log::debug!("cg={path} vanished during the scan");
                    return false;
                }
                let value = self.value(&path, file, read, parse_cpuset);
                if file == InterfaceFile::CpusetCpus {
                    cgroup.cpus = value;
                } else {
                    cgroup.mems = value;
                }
                true
            }
            InterfaceFile::CpuShares
            | InterfaceFile::CpuCfsQuotaUs
            | InterfaceFile::CpuCfsPeriodUs
            | InterfaceFile::CpuMax
            | InterfaceFile::CpuWeight => {
                if !cpuset.exists(&path) {
                    log::debug!("cg={path} vanished during the scan");
                    return false;
                }
                cgroup.cpu = self.read_cpu_settings(&path);
                true
            }
            _ => match self.read_cgroup(&path) {
                Some(fresh) => {
                    *cgroup = fresh;
                    true
                }
                None => false,
            },
        }
    }

    /// A scan that saw nothing (of this scanner's tree).
    pub fn empty_scan(&self) -> Scan {
        Scan {
            version: self.hierarchy.version,
            kubepods: self.kubepods.clone(),
            cgroups: Vec::new(),
            inherits: self.inherits,
            skipped: Vec::new(),
            complete: true,
            truncated: false,
            gone_pods: BTreeSet::new(),
        }
    }

    /// Visits `start` and every cgroup below it, in pre-order. A cgroup's directories stay
    /// open while its children are visited, which open theirs through them (one name each,
    /// not the whole path again).
    fn walk(&mut self, start: CgroupPath, scan: &mut Scan) {
        let mut buf = DirentBuffer::new();
        let mut pending = vec![Pending {
            path: start,
            parent: None,
        }];
        while let Some(next) = pending.pop() {
            if scan.cgroups.len() >= self.max_cgroups {
                scan.complete = false;
                scan.truncated = true;
                if self.problems.first_time("scan-truncated") {
                    log::warn!(
                        "scan stopped after {} cgroups under {}: the rest is not managed, nothing \
                         held there is released, and no new exclusive cpus are given (nor does \
                         the shared pool grow) until a scan sees the whole tree",
                        self.max_cgroups,
                        self.kubepods
                    );
                }
                break;
            }
            if let Some((children, dirs)) = self.visit(&next, scan, &mut buf) {
                let dirs = Rc::new(dirs);
                // Reversed so that popping yields siblings in name order.
                pending.extend(children.into_iter().rev().map(|path| Pending {
                    path,
                    parent: Some(Rc::clone(&dirs)),
                }));
            }
        }
    }

    /// Opens a cgroup's directory in the cpuset hierarchy, through its parent's when that is
    /// open; `None` (recorded as skipped when it is not simply gone) when it cannot be.
    fn open_cgroup(
        &mut self,
        path: &CgroupPath,
        parent: Option<&OpenDirs>,
        scan: &mut Scan,
    ) -> Option<OwnedFd> {
        let cpuset = &self.hierarchy.cpuset;
        let opened = match parent {
            Some(parent) => cpuset.open_child_dir(&parent.cpuset, path),
            None => cpuset.open_dir(path),
        };
        match opened {
            Ok(dir) => Some(dir),
            Err(err) if err.is_gone() => {
                log::debug!("cg={path} vanished during the scan");
                None
            }
            Err(err) => {
                self.report(path, "open", &err);
                scan.skipped.push(SkippedEntry {
                    path: path.clone(),
                    reason: SkipReason::Unlistable,
                });
                None
            }
        }
    }

    /// Lists a cgroup's open cpuset directory once: the kinds of the files the scan reads
    /// there, and the entries that are not regular files (child cgroups, and what is skipped).
    fn list(&self, path: &CgroupPath, dir: &OwnedFd, buf: &mut DirentBuffer) -> ListResult {
        let wanted = self.cpuset_dir_files();
        let mut listing = Listing {
            kinds: [None; 5],
            others: Vec::new(),
        };
        self.hierarchy
            .cpuset
            .each_entry(dir, path, buf, |name, kind| {
                if let Some(at) = wanted.iter().position(|file| name == file.name()) {
                    listing.kinds[at] = Some(kind);
                }
                if kind != FileKind::RegularFile {
                    listing.others.push((name.to_os_string(), kind));
                }
            })
            .map(|()| listing)
    }

    /// The files the scan reads in a cgroup's cpuset directory: the cpuset's, and on v2 the
    /// CPU settings too (the order of [`Listing::kinds`]).
    fn cpuset_dir_files(&self) -> &'static [InterfaceFile] {
        match self.hierarchy.version {
            CgroupVersion::V1 => &[
                InterfaceFile::CpusetCpus,
                InterfaceFile::CpusetMems,
                InterfaceFile::CpusetEffectiveCpus,
            ],
            CgroupVersion::V2 => &[
                InterfaceFile::CpusetCpus,
                InterfaceFile::CpusetMems,
                InterfaceFile::CpusetCpusEffective,
                InterfaceFile::CpuMax,
                InterfaceFile::CpuWeight,
            ],
        }
    }

    /// Reads a file of the open cpuset directory `dir` as its listing says it is: missing
    /// without a system call, refused without opening it when it is not a regular file, else
    /// one `openat2`, one `read`, `close`. Without a listing, as [`CgroupFs::read_in`] reads.
    fn read_cpuset_file(
        &self,
        path: &CgroupPath,
        dir: &OwnedFd,
        listing: &ListResult,
        file: InterfaceFile,
    ) -> Result<String, CgroupError> {
        let cpuset = &self.hierarchy.cpuset;
        let Ok(listing) = listing else {
            return cpuset.read_in(dir, path, file);
        };
        let at = self.cpuset_dir_files().iter().position(|f| *f == file);
        let refused = |reason| CgroupError::Refused {
            path: cpuset.file_path(path, file),
            value: None,
            reason,
        };
        match at.and_then(|at| listing.kinds[at]) {
            None => Err(CgroupError::Read {
                path: cpuset.file_path(path, file),
                source: std::io::Error::from_raw_os_error(nix::errno::Errno::ENOENT as i32),
            }),
            Some(FileKind::RegularFile) => cpuset.read_beneath(FileAt::Dir(dir), path, file, true),
            Some(FileKind::Symlink) => Err(refused(Refusal::Symlink)),
            Some(kind) => Err(refused(Refusal::NotRegularFile { kind })),
        }
    }

    /// The v1 cpu controller's settings of the cgroup at `path`, read through one open of its
    /// directory (through `parent`'s when that is open and the cgroup has no children, as
    /// `listing` says), which is returned for the children.
    fn read_cpu_v1(
        &mut self,
        path: &CgroupPath,
        parent: Option<&OpenDirs>,
        listing: &ListResult,
    ) -> (CpuSettings, Option<OwnedFd>) {
        let cpu_fs = self.hierarchy.cpu.clone();
        let parent_cpu = parent.and_then(|p| p.cpu.as_ref());
        // A cgroup without children needs no open cpu directory of its own: its files
        // are opened through its parent's.
        let leaf = listing.as_ref().is_ok_and(|l| {
            l.others
                .iter()
                .all(|(_, kind)| *kind != FileKind::Directory)
        });
        let cpu_dir = match parent_cpu {
            Some(_) if leaf => Ok(None),
            Some(parent) => cpu_fs.open_child_dir(parent, path).map(Some),
            None => cpu_fs.open_dir(path).map(Some),
        };
        let read = |file| match (&cpu_dir, parent_cpu) {
            (Ok(Some(cpu_dir)), _) => cpu_fs.read_beneath(FileAt::Dir(cpu_dir), path, file, false),
            (Ok(None), Some(parent)) => {
                cpu_fs.read_beneath(FileAt::Parent(parent), path, file, false)
            }
            (Err(err), _) if err.is_gone() => Err(CgroupError::Read {
                path: cpu_fs.file_path(path, file),
                source: std::io::Error::from_raw_os_error(nix::errno::Errno::ENOENT as i32),
            }),
            _ => cpu_fs.read(path, file),
        };
        let shares = read(InterfaceFile::CpuShares);
        let quota = read(InterfaceFile::CpuCfsQuotaUs);
        let period = read(InterfaceFile::CpuCfsPeriodUs);
        let cpu = CpuSettings::V1 {
            shares: self.value(path, InterfaceFile::CpuShares, shares, parse_shares),
            cfs_quota: self.value(path, InterfaceFile::CpuCfsQuotaUs, quota, parse_cfs_quota),
            cfs_period_us: self.value(
                path,
                InterfaceFile::CpuCfsPeriodUs,
                period,
                parse_cfs_period,
            ),
        };
        (cpu, cpu_dir.ok().flatten())
    }

    /// Reads the values of one cgroup whose cpuset directory is open as `dir` and listed as
    /// `listing`; `None` when it vanished. On v1 the cpu controller's files are read through
    /// one open of its directory (through `parent`'s when that is open), which is returned for
    /// the children.
    fn read_values(
        &mut self,
        path: &CgroupPath,
        dir: &OwnedFd,
        parent: Option<&OpenDirs>,
        listing: &ListResult,
    ) -> Option<(ScannedCgroup, Option<OwnedFd>)> {
        let relative = path.strip_prefix(&self.kubepods)?;
        let (cpus_file, mems_file) = (InterfaceFile::CpusetCpus, InterfaceFile::CpusetMems);
        let effective_file = match self.hierarchy.version {
            CgroupVersion::V1 => InterfaceFile::CpusetEffectiveCpus,
            CgroupVersion::V2 => InterfaceFile::CpusetCpusEffective,
        };
        let read = self.read_cpuset_file(path, dir, listing, cpus_file);
        let cpus = self.value(path, cpus_file, read, parse_cpuset);
        if cpus.is_missing() && !self.hierarchy.cpuset.exists(path) {
            log::debug!("cg={path} vanished during the scan");
            return None;
        }
        let read = self.read_cpuset_file(path, dir, listing, mems_file);
        let mems = self.value(path, mems_file, read, parse_cpuset);
        let read = self.read_cpuset_file(path, dir, listing, effective_file);
        let effective_cpus = self.value(path, effective_file, read, parse_cpuset);
        let (cpu, cpu_dir) = match self.hierarchy.version {
            CgroupVersion::V1 => self.read_cpu_v1(path, parent, listing),
            CgroupVersion::V2 => {
                let max = self.read_cpuset_file(path, dir, listing, InterfaceFile::CpuMax);
                let weight = self.read_cpuset_file(path, dir, listing, InterfaceFile::CpuWeight);
                let cpu = CpuSettings::V2 {
                    max: self.value(path, InterfaceFile::CpuMax, max, parse_cpu_max),
                    weight: self.value(path, InterfaceFile::CpuWeight, weight, parse_weight),
                };
                (cpu, None)
            }
        };
        let cgroup = ScannedCgroup {
            path: path.clone(),
            relative,
            cpus,
            mems,
            effective_cpus,
            cpu,
        };
        Some((cgroup, cpu_dir))
    }

    /// Records one cgroup and returns its child directories with its open directories (for
    /// them to open theirs through), or `None` when it vanished. Its cpuset directory is
    /// listed once, before its files are read: the listing says which of them exist and are
    /// regular files, and which entries are child cgroups.
    fn visit(
        &mut self,
        pending: &Pending,
        scan: &mut Scan,
        buf: &mut DirentBuffer,
    ) -> Option<(Vec<CgroupPath>, OpenDirs)> {
        let path = &pending.path;
        let relative = path
            .strip_prefix(&self.kubepods)
            .expect("the scan only walks below the kubepods root");
        let parent = pending.parent.as_deref();
        let dir = self.open_cgroup(path, parent, scan)?;
        let listing = self.list(path, &dir, buf);
        let (cgroup, cpu_dir) = self.read_values(path, &dir, parent, &listing)?;
        scan.cgroups.push(cgroup);
        let dirs = OpenDirs {
            cpuset: dir,
            cpu: cpu_dir,
        };
        let mut entries = match listing {
            Ok(listing) => listing.others,
            Err(err) if err.is_gone() => return Some((Vec::new(), dirs)),
            Err(err) => {
                self.report(path, "list", &err);
                scan.skipped.push(SkippedEntry {
                    path: path.clone(),
                    reason: SkipReason::Unlistable,
                });
                return Some((Vec::new(), dirs));
            }
        };
        entries.sort_by(|a, b| a.0.cmp(&b.0));

        let mut children = Vec::new();
        for (name, kind) in entries {
            let reason = match kind {
                FileKind::Directory => None,
                FileKind::RegularFile => continue,
                FileKind::Symlink => Some(SkipReason::Symlink),
                kind => Some(SkipReason::SpecialFile(kind)),
            };
            let child = match path.join(&name) {
                Ok(child) => child,
                Err(err) => {
                    // Cannot happen for names read from a directory; kept as a guard.
                    if self.problems.first_time(format!("badname {err}")) {
                        log::warn!("cg={path}: skipping an entry: {err}");
                    }
                    continue;
                }
            };
            let reason = reason
                .or_else(|| (relative.depth() + 1 > MAX_SCAN_DEPTH).then_some(SkipReason::TooDeep));
            match reason {
                None => children.push(child),
                Some(reason) => {
                    if self.problems.first_time(format!("skip {child:?}")) {
                        log::warn!("cg={child} skipped: {reason}");
                    }
                    scan.skipped.push(SkippedEntry {
                        path: child,
                        reason,
                    });
                }
            }
        }
        Some((children, dirs))
    }

    /// Turns a read into a [`FileValue`], logging a problem the first time it is seen.
    fn value<T>(
        &mut self,
        path: &CgroupPath,
        file: InterfaceFile,
        read: Result<String, CgroupError>,
        parse: fn(&str) -> Result<T, ValueError>,
    ) -> FileValue<T> {
        match read {
            Ok(text) => match parse(&text) {
                Ok(value) => FileValue::Value(value),
                Err(error) => {
                    if self.problems.first_time(format!("{path:?}/{file}={text}")) {
                        log::warn!("cg={path} {file}: {error}; treated as unknown");
                    }
                    FileValue::Invalid {
                        text,
                        error: Box::new(error),
                    }
                }
            },
            Err(err) if err.is_gone() => FileValue::Missing,
            Err(err) => {
                let error = error_chain(&err);
                if self
                    .problems
                    .first_time(format!("{path:?}/{file}: {error}"))
                {
                    log::warn!("cg={path} {file}: {error}");
                }
                FileValue::Unreadable { error }
            }
        }
    }

    fn report(&mut self, path: &CgroupPath, what: &str, err: &CgroupError) {
        let error = error_chain(err);
        if self
            .problems
            .first_time(format!("{path:?} {what}: {error}"))
        {
            log::warn!("cg={path}: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// The snapshot gives back every path and set of its scan, in order, whatever prefixes
    /// the paths share (the root, a name that extends the one before, a shorter one after).
    #[test]
    fn a_snapshot_keeps_each_path_and_set_of_its_scan() {
        let paths = [
            "",
            "k",
            "k/pod1",
            "k/pod1/c",
            "k/pod1/cc",
            "k/pod10",
            "k/p",
            "x/y",
        ];
        let cgroup = |i: usize, text: &str| ScannedCgroup {
            path: CgroupPath::new(text).unwrap(),
            relative: CgroupPath::new(text).unwrap(),
            cpus: match i {
                3 => FileValue::Missing,
                _ => FileValue::Value(CpuSet::from_iter([i as u32, 100 + i as u32])),
            },
            mems: FileValue::Missing,
            effective_cpus: FileValue::Missing,
            cpu: CpuSettings::V2 {
                max: FileValue::Missing,
                weight: FileValue::Missing,
            },
        };
        let scan = Scan {
            version: CgroupVersion::V2,
            kubepods: CgroupPath::new("k").unwrap(),
            cgroups: paths
                .iter()
                .enumerate()
                .map(|(i, p)| cgroup(i, p))
                .collect(),
            inherits: false,
            skipped: Vec::new(),
            complete: true,
            truncated: false,
            gone_pods: BTreeSet::new(),
        };
        let snapshot = CpusetSnapshot::of(&scan);
        assert_eq!(snapshot.len(), paths.len());
        let entries: Vec<_> = snapshot
            .entries()
            .map(|(path, cpus)| (path.unwrap(), cpus.cloned()))
            .collect();
        let scanned: Vec<_> = scan
            .cgroups
            .iter()
            .map(|c| (c.path.clone(), c.cpus.value().cloned()))
            .collect();
        assert_eq!(entries, scanned);
        assert!(snapshot.paths.len() < paths.iter().map(|p| p.len() + 8).sum::<usize>());
    }

    /// Linux 6.12: while cpus 2-3 are an isolated partition below kubepods, the root's
    /// effective set lacks them; they are still the pods' (issue 25: the agent took them for
    /// lost, released the pin and allocated elsewhere). CPUs isolated by someone else are not.
    #[test]
    fn cpus_isolated_below_kubepods_still_belong_to_pods() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("kubepods")).unwrap();
        fs::write(root.join("cpuset.cpus.effective"), "0-1,4-5,7\n").unwrap();
        fs::write(root.join("cpuset.mems.effective"), "0\n").unwrap();
        fs::write(root.join("cpuset.cpus.isolated"), "2-3,6\n").unwrap();
        fs::write(root.join("kubepods/cpuset.cpus.exclusive"), "2-3\n").unwrap();
        let fs = CgroupFs::open(root).unwrap();
        let hierarchy = Hierarchy {
            version: CgroupVersion::V2,
            cpuset: fs.clone(),
            cpu: fs,
        };
        let scanner = Scanner::new(hierarchy, CgroupPath::new("kubepods").unwrap());
        let (cpus, mems) = scanner.kubepods_parent_limits();
        assert_eq!(cpus.unwrap().to_string(), "0-5,7");
        assert_eq!(mems.unwrap().to_string(), "0");
        // Nothing held by kubepods: the effective set as the kernel says it.
        fs::write(root.join("kubepods/cpuset.cpus.exclusive"), "\n").unwrap();
        let (cpus, _) = scanner.kubepods_parent_limits();
        assert_eq!(cpus.unwrap().to_string(), "0-1,4-5,7");
    }
}
