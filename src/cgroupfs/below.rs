//! What the cgroups below a cgroup hold now, read just before it is narrowed (the writer's
//! checks): a child a plan did not know that holds more than the new value, and the whole
//! subtree below the scan's depth limit. Plain values; nothing here writes.

use std::collections::HashSet;
use std::ffi::OsStr;

use crate::cpuset::CpuSet;

use super::fs::{CgroupFs, FileKind, InterfaceFile};
use super::path::CgroupPath;

/// Most cgroups [`CgroupFs::subtree_sets`] reads below one cgroup.
pub const MAX_UNSEEN: usize = 4096;

/// A child that keeps its parent from being narrowed now.
#[derive(Debug, PartialEq, Eq)]
pub enum ChildInTheWay {
    /// Its `file` holds CPUs (or memory nodes) outside the new value.
    Holds(CgroupPath),
    /// It is not initialised yet (empty): its runtime may be setting it up.
    Uninitialised,
}

impl CgroupFs {
    /// A child of `cgroup` not among `known` whose `file` holds CPUs (or memory nodes) outside
    /// `value`, as the tree says now; with `settle`, also one that is not initialised yet.
    /// Unreadable children do not count, nor (without `settle`) uninitialised ones: the kernel
    /// lets a parent narrow over them. `known` comes with how many children the plan knows
    /// of: a cgroup the plan knows no child of, and whose link count says it has no
    /// subdirectory (a container's, mostly), is not listed. (Equal non-zero counts would not
    /// do: a child removed and another created since the scan, a container restarting, keep
    /// the count.)
    pub fn child_in_the_way(
        &self,
        cgroup: &CgroupPath,
        file: InterfaceFile,
        value: &str,
        (known, planned_children): (&HashSet<&OsStr>, usize),
        settle: bool,
    ) -> Option<ChildInTheWay> {
        if !matches!(file, InterfaceFile::CpusetCpus | InterfaceFile::CpusetMems) {
            return None;
        }
        if planned_children == 0 && self.subdir_count(cgroup) == Some(0) {
            return None;
        }
        let new = CpuSet::parse(value).ok()?;
        let entries = self.list(cgroup).ok()?;
        entries
            .iter()
            .filter(|e| e.kind == FileKind::Directory && !known.contains(e.name.as_os_str()))
            .filter_map(|e| cgroup.join(&e.name).ok())
            .find_map(|child| {
                let held = CpuSet::parse(&self.read(&child, file).ok()?).ok()?;
                if held.is_empty() {
                    settle.then_some(ChildInTheWay::Uninitialised)
                } else {
                    (!held.is_subset(&new)).then_some(ChildInTheWay::Holds(child))
                }
            })
    }

    /// `root` and the cgroups below it (past the scan's depth limit), parents before children,
    /// with what their `file` holds (unreadable ones are left out); at most [`MAX_UNSEEN`] of
    /// them.
    pub fn subtree_sets(
        &self,
        root: &CgroupPath,
        file: InterfaceFile,
    ) -> Vec<(CgroupPath, CpuSet)> {
        let mut found = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            if found.len() >= MAX_UNSEEN {
                log::warn!(
                    target: "cpusetd::writer",
                    "cg={root}: more than {MAX_UNSEEN} cgroups below it; the rest stay as they are"
                );
                break;
            }
            let held = self
                .read(&dir, file)
                .ok()
                .and_then(|t| CpuSet::parse(&t).ok());
            let Some(held) = held else {
                continue;
            };
            let Ok(entries) = self.list(&dir) else {
                continue;
            };
            let children = entries.iter().filter(|e| e.kind == FileKind::Directory);
            stack.extend(children.filter_map(|e| dir.join(&e.name).ok()));
            found.push((dir, held));
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A cpuset tree in a temp dir: `(relative path, cpuset.cpus)`, parents first.
    fn tree(cgroups: &[(&str, &str)]) -> (tempfile::TempDir, CgroupFs) {
        let dir = tempfile::tempdir().unwrap();
        for (rel, cpus) in cgroups {
            fs::create_dir_all(dir.path().join(rel)).unwrap();
            let file = dir.path().join(rel).join("cpuset.cpus");
            fs::write(file, format!("{cpus}\n")).unwrap();
        }
        let fs = CgroupFs::open(dir.path()).unwrap();
        (dir, fs)
    }

    fn path(p: &str) -> CgroupPath {
        CgroupPath::new(p).unwrap()
    }

    #[test]
    fn a_child_outside_the_new_value_is_in_the_way_unless_known() {
        let (_dir, fs) = tree(&[("p", "0-3"), ("p/known", "0-3"), ("p/late", "2-3")]);
        let cpus = InterfaceFile::CpusetCpus;
        let known: HashSet<&OsStr> = [OsStr::new("known")].into();
        let way = fs.child_in_the_way(&path("p"), cpus, "0-1", (&known, 1), false);
        assert_eq!(way, Some(ChildInTheWay::Holds(path("p/late"))));
        assert_eq!(
            fs.child_in_the_way(&path("p"), cpus, "2-3", (&known, 1), false),
            None
        );
        // Only cpuset files are checked.
        let shares = InterfaceFile::CpuShares;
        assert_eq!(
            fs.child_in_the_way(&path("p"), shares, "0-1", (&known, 1), false),
            None
        );
    }

    #[test]
    fn an_uninitialised_child_is_in_the_way_only_while_settling() {
        let (_dir, fs) = tree(&[("p", "0-3"), ("p/new", "")]);
        let (cpus, none) = (InterfaceFile::CpusetCpus, HashSet::new());
        assert_eq!(
            fs.child_in_the_way(&path("p"), cpus, "0", (&none, 0), true),
            Some(ChildInTheWay::Uninitialised)
        );
        assert_eq!(
            fs.child_in_the_way(&path("p"), cpus, "0", (&none, 0), false),
            None
        );
    }

    #[test]
    fn the_subtree_is_read_parents_first_without_unreadable_cgroups() {
        let (dir, fs) = tree(&[("r", "0-3"), ("r/a", "1-2"), ("r/a/b", "2"), ("r/c", "3")]);
        fs::remove_file(dir.path().join("r/c/cpuset.cpus")).unwrap();
        let found = fs.subtree_sets(&path("r"), InterfaceFile::CpusetCpus);
        let set = |s: &str| CpuSet::parse(s).unwrap();
        assert_eq!(
            found,
            vec![
                (path("r"), set("0-3")),
                (path("r/a"), set("1-2")),
                (path("r/a/b"), set("2")),
            ]
        );
    }
}
