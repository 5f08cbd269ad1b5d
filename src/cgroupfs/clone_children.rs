//! cgroup v1's `cgroup.clone_children` on kubepods, the QoS directories and the pod
//! directories: set, the kernel gives every new cgroup below them its parent's cpuset at
//! `mkdir`; unset (the kernel's default), new cgroups start empty and their runtime copies the
//! parent's set itself.

use super::fs::{CgroupError, CgroupFs, InterfaceFile};
use super::path::CgroupPath;

impl CgroupFs {
    /// Sets (`on`) or unsets `cgroup.clone_children` of each of `cgroups` that is kubepods, a
    /// QoS directory or a pod directory (at most two levels below `kubepods`) and does not say
    /// so already. Cgroups gone, and files that are not there (fake trees), are skipped; the
    /// last other failure is returned (the rest go on).
    pub fn clone_children<'p>(
        &self,
        kubepods: &CgroupPath,
        cgroups: impl Iterator<Item = &'p CgroupPath>,
        on: bool,
    ) -> Option<CgroupError> {
        let (file, value) = (
            InterfaceFile::CgroupCloneChildren,
            if on { "1" } else { "0" },
        );
        let mut failed = None;
        for path in cgroups {
            let near = path
                .strip_prefix(kubepods)
                .is_some_and(|rel| rel.depth() <= 2);
            if !near || self.read(path, file).is_ok_and(|v| v == value) {
                continue;
            }
            match self.write(path, file, value) {
                Ok(()) => {}
                Err(e) if e.is_gone() => {}
                Err(e) => failed = Some(e),
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn kubepods_the_qos_and_the_pod_directories_clone_their_cpusets_containers_not() {
        let dir = tempfile::tempdir().unwrap();
        let rels = ["kubepods", "kubepods/burstable", "kubepods/burstable/pod1"];
        let container = "kubepods/burstable/pod1/c";
        for rel in rels.iter().chain([&container]) {
            fs::create_dir_all(dir.path().join(rel)).unwrap();
            fs::write(dir.path().join(rel).join("cgroup.clone_children"), "0\n").unwrap();
        }
        let cpuset = CgroupFs::open(dir.path()).unwrap();
        let paths: Vec<CgroupPath> = rels
            .iter()
            .chain([&container])
            .map(|r| CgroupPath::new(r).unwrap())
            .collect();
        let kubepods = CgroupPath::new("kubepods").unwrap();
        assert!(cpuset
            .clone_children(&kubepods, paths.iter(), true)
            .is_none());
        let read =
            |rel: &str| fs::read_to_string(dir.path().join(rel).join("cgroup.clone_children"));
        for rel in rels {
            assert_eq!(read(rel).unwrap(), "1", "{rel}");
        }
        assert_eq!(read(container).unwrap(), "0\n");
        assert!(cpuset
            .clone_children(&kubepods, paths.iter(), false)
            .is_none());
        assert_eq!(read("kubepods/burstable").unwrap(), "0");
        // A directory without the file (a fake tree) is skipped.
        fs::remove_file(dir.path().join("kubepods/cgroup.clone_children")).unwrap();
        assert!(cpuset
            .clone_children(&kubepods, paths.iter(), true)
            .is_none());
    }
}
