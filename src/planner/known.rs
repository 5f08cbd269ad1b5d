//! What a plan knows of the tree it was made from, asked by path: the writer's only view of
//! the scan (it is handed no index).

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};

use crate::cgroupfs::{CgroupPath, CgroupVersion, InterfaceFile, Scan, ScannedCgroup};

/// The scan a plan was made from, and which of its cgroups are past their runtime's set-up.
#[derive(Debug)]
pub struct Known<'a> {
    /// None: nothing is known beyond the plan's own steps (a drift repair).
    scan: Option<&'a Scan>,
    parents: &'a [Option<usize>],
    initialised: &'a [bool],
    index: OnceCell<HashMap<&'a [u8], usize>>,
    children: OnceCell<Vec<Vec<usize>>>,
    /// The children of scanned cgroups planned without them, known elsewhere (see
    /// [`Known::with_children`]).
    known_children: Option<&'a HashMap<CgroupPath, HashSet<OsString>>>,
}

impl<'a> Known<'a> {
    /// `parents[i]` is the parent of scanned cgroup `i` (as planned); `initialised[i]` marks
    /// scanned cgroups known to be past their runtime's set-up (seen set up before, or empty for
    /// too long): an empty value there is drift to repair, not a runtime at work (none: the
    /// one-shot commands, which set every cgroup up themselves).
    pub fn new(scan: &'a Scan, parents: &'a [Option<usize>], initialised: &'a [bool]) -> Self {
        Known {
            scan: Some(scan),
            parents,
            initialised,
            index: OnceCell::new(),
            children: OnceCell::new(),
            known_children: None,
        }
    }

    /// Nothing known but the steps themselves: no parent, child or set-up of any cgroup (a
    /// plan of writes the model has checked alone, such as a drift repair).
    pub fn nothing() -> Known<'static> {
        Known {
            scan: None,
            parents: &[],
            initialised: &[],
            index: OnceCell::new(),
            children: OnceCell::new(),
            known_children: None,
        }
    }

    /// The same, knowing the children of cgroups the scan holds without them (an incremental
    /// pass's shared pool members planned alone, whose children the agent's model knows and,
    /// on cgroup v2, follow them): they count as the scan's own children that inherit (see
    /// [`Known::settled_children`]), so the writer reads only children new since.
    pub fn with_children(mut self, known: &'a HashMap<CgroupPath, HashSet<OsString>>) -> Self {
        self.known_children = Some(known);
        self
    }

    /// The scan's version (none: v2, which sets no cgroup up empty).
    pub fn version(&self) -> CgroupVersion {
        self.scan.map_or(CgroupVersion::V2, |s| s.version)
    }

    fn index(&self, path: &CgroupPath) -> Option<usize> {
        let scan = self.scan?;
        let index = self.index.get_or_init(|| {
            let cgroups = scan.cgroups.iter().enumerate();
            cgroups.map(|(i, c)| (c.path.as_bytes(), i)).collect()
        });
        index.get(path.as_bytes()).copied()
    }

    fn cgroup(&self, index: usize) -> Option<&'a ScannedCgroup> {
        self.scan?.cgroups.get(index)
    }

    /// The scanned parent of `path` (none for the top of the scan and unscanned cgroups).
    pub fn parent(&self, path: &CgroupPath) -> Option<&'a CgroupPath> {
        let parent = self.parents.get(self.index(path)?).copied().flatten()?;
        Some(&self.cgroup(parent)?.path)
    }

    /// Whether the scan found `path`'s cpuset `file` empty: a v1 cgroup its runtime had not set
    /// up yet.
    pub fn found_empty(&self, path: &CgroupPath, file: InterfaceFile) -> bool {
        let Some(c) = self.index(path).and_then(|i| self.cgroup(i)) else {
            return false;
        };
        let value = match file {
            InterfaceFile::CpusetMems => &c.mems,
            InterfaceFile::CpusetCpus => &c.cpus,
            _ => return false,
        };
        value.value().is_some_and(|v| v.is_empty())
    }

    /// [`Known::found_empty`] and [`Known::initialised`] at once (one look-up).
    pub fn setup(&self, path: &CgroupPath, file: InterfaceFile) -> (bool, bool) {
        let Some(i) = self.index(path) else {
            return (false, false);
        };
        let c = &self.scan.expect("an index means a scan").cgroups[i];
        let value = match file {
            InterfaceFile::CpusetMems => &c.mems,
            InterfaceFile::CpusetCpus => &c.cpus,
            _ => return (false, self.initialised.get(i).copied().unwrap_or(false)),
        };
        let empty = value.value().is_some_and(|v| v.is_empty());
        (empty, self.initialised.get(i).copied().unwrap_or(false))
    }

    /// Whether `path` is known past its runtime's set-up (see [`Known::new`]).
    pub fn initialised(&self, path: &CgroupPath) -> bool {
        self.index(path)
            .and_then(|i| self.initialised.get(i).copied())
            .unwrap_or(false)
    }

    /// Names of the scanned children of `path` whose `file` the scan found set (the plan
    /// narrowed them first, if needed), missing (not cpuset cgroups), or empty past their
    /// runtime's set-up (the plan set them up first, and one it could not write is still empty,
    /// which the kernel narrows a parent past), or empty on v2 (a child that inherits: no
    /// runtime copies a set into it, and the kernel narrows its effective set with its
    /// parent's); and how many children the scan has. The others, uninitialised v1 cgroups
    /// when scanned, may have had the parent's wide set copied into them since: the writer
    /// reads those before it narrows `path`.
    pub fn settled_children(
        &self,
        path: &CgroupPath,
        file: InterfaceFile,
    ) -> (HashSet<&'a OsStr>, usize) {
        let Some(cgroup) = self.index(path) else {
            return (HashSet::new(), 0);
        };
        let children = self.children.get_or_init(|| {
            let mut index = vec![Vec::new(); self.parents.len()];
            for (child, parent) in self.parents.iter().enumerate() {
                if let Some(list) = parent.and_then(|p| index.get_mut(p)) {
                    list.push(child);
                }
            }
            index
        });
        let of_this = children.get(cgroup).map_or(&[][..], |c| &c[..]);
        let elsewhere = self.known_children.and_then(|k| k.get(path));
        if let Some(names) = elsewhere.filter(|_| of_this.is_empty()) {
            return (names.iter().map(OsString::as_os_str).collect(), names.len());
        }
        let inherits = self.version() == CgroupVersion::V2;
        let settled = of_this
            .iter()
            .filter_map(|&i| Some((i, self.cgroup(i)?)))
            .filter(|(i, c)| {
                let value = match file {
                    InterfaceFile::CpusetMems => &c.mems,
                    _ => &c.cpus,
                };
                value.configured().is_some()
                    || value.is_missing()
                    || inherits
                    || self.initialised.get(*i).copied().unwrap_or(false)
            })
            .filter_map(|(_, c)| c.path.name())
            .collect();
        (settled, of_this.len())
    }

    /// Whether the children of `path` lie past the scan's depth limit (so the plan never saw
    /// them).
    pub fn unseen_below(&self, path: &CgroupPath) -> bool {
        self.scan
            .and_then(|s| path.strip_prefix(&s.kubepods))
            .is_some_and(|rel| rel.depth() >= crate::cgroupfs::MAX_SCAN_DEPTH)
    }
}
