//! What changed in the model since the last pass: an index of paths over the records (a
//! record forgotten leaves it, see [`SincePass::forget`]), which decides what the next pass
//! plans: the chains of the pods that changed, a drift repair, or the whole model.

use std::collections::{BTreeSet, HashSet};

use crate::cgroupfs::CgroupPath;
use crate::classify::CgroupKind;

/// What changed in the model since the last pass.
#[derive(Debug, Default)]
pub(crate) struct SincePass {
    /// Cgroups new to the model.
    pub(crate) new: BTreeSet<CgroupPath>,
    /// Pods that lost a container (its cgroup went).
    pub(crate) touched: BTreeSet<CgroupPath>,
    /// Pods whose cgroup went (by uid).
    pub(crate) gone_pods: BTreeSet<String>,
    /// Anything else: a cgroup gone, re-read with other values, drift. Only a full plan will do.
    pub(crate) other: bool,
    /// Cgroups with a foreign change of their `cpuset.cpus` (drift), taken by the pass that
    /// repairs them.
    pub(crate) drifted: HashSet<CgroupPath>,
    /// The model changed in more than drifted `cpuset.cpus` values of cgroups the last pass
    /// planned (which the controller writes back without planning).
    pub(crate) structural: bool,
}

impl SincePass {
    /// Before the first pass: everything is new.
    pub(crate) fn start() -> SincePass {
        SincePass {
            structural: true,
            ..SincePass::default()
        }
    }

    /// A full pass plans all that changed (drift is taken by the pass that repairs it).
    pub(crate) fn planned_all(&mut self) {
        let drifted = std::mem::take(&mut self.drifted);
        *self = SincePass {
            drifted,
            ..SincePass::default()
        };
    }

    /// An incremental pass planned the pods that changed (what went was taken before).
    pub(crate) fn planned_chains(&mut self) {
        self.structural = false;
        self.new.clear();
        self.touched.clear();
    }

    /// Whether pods changed: cgroups came, were re-read with other values, or went.
    pub(crate) fn pods_changed(&self) -> bool {
        !self.new.is_empty() || !self.touched.is_empty() || !self.gone_pods.is_empty()
    }

    /// `path` was read with other values: new to the model (`new`), or re-read (a runtime
    /// writing a container's CPU settings after making its cgroup, a resize): its pod's chain
    /// is planned again (a cgroup outside any pod makes the pass a full one; drift is repaired
    /// on its own).
    pub(crate) fn read(&mut self, path: &CgroupPath, new: bool) {
        if new {
            self.new.insert(path.clone());
        } else if !self.new.contains(path) {
            self.touched.insert(path.clone());
        }
    }

    /// A cgroup of `kind` (of pod `uid`) went, under `parent` (when the model holds it). A pod
    /// that went, or a container that went from a pod that stays, leaves the next pass
    /// incremental (the pod's assignments released; the pod's chain planned again); anything
    /// else makes it a full one.
    pub(crate) fn removed(
        &mut self,
        kind: Option<(CgroupKind, Option<String>)>,
        parent: Option<CgroupPath>,
    ) {
        match (kind, parent) {
            (Some((CgroupKind::Pod, Some(uid))), _) => {
                self.gone_pods.insert(uid);
            }
            (
                Some((CgroupKind::Container | CgroupKind::Sandbox | CgroupKind::ContainerChild, _)),
                Some(parent),
            ) => {
                self.touched.insert(parent);
            }
            _ => self.other = true,
        }
    }

    /// `path` left the model: the next pass plans without it.
    pub(crate) fn forget(&mut self, path: &CgroupPath) {
        self.structural = true;
        self.new.remove(path);
        self.touched.remove(path);
        self.drifted.remove(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> CgroupPath {
        CgroupPath::new(text).unwrap()
    }

    #[test]
    fn a_cgroup_read_again_after_it_came_is_still_new() {
        let mut since = SincePass::default();
        since.read(&path("k/pod/c"), true);
        since.read(&path("k/pod/c"), false);
        since.read(&path("k/pod/d"), false);
        assert_eq!(since.new, [path("k/pod/c")].into());
        assert_eq!(since.touched, [path("k/pod/d")].into());
        assert!(since.pods_changed());
        since.planned_chains();
        assert!(!since.pods_changed() && !since.structural);
    }

    #[test]
    fn what_went_leaves_a_pass_incremental_only_for_pods_and_their_containers() {
        let mut since = SincePass::default();
        since.removed(Some((CgroupKind::Pod, Some("uid".into()))), None);
        let container = Some((CgroupKind::Container, Some("uid2".into())));
        since.removed(container.clone(), Some(path("k/pod2")));
        assert_eq!(since.gone_pods, ["uid".to_string()].into());
        assert_eq!(since.touched, [path("k/pod2")].into());
        assert!(!since.other);
        // A container whose pod the model does not hold, or a cgroup not classified.
        since.removed(container, None);
        assert!(since.other);
        let mut since = SincePass::default();
        since.removed(None, Some(path("k")));
        assert!(since.other);
    }

    #[test]
    fn a_full_pass_keeps_only_the_drift_and_forgetting_drops_a_path_everywhere() {
        let mut since = SincePass::start();
        since.read(&path("k/a"), true);
        since.drifted.insert(path("k/b"));
        since.other = true;
        since.planned_all();
        assert!(!since.structural && !since.other && since.new.is_empty());
        assert_eq!(since.drifted, [path("k/b")].into());
        since.forget(&path("k/b"));
        assert!(since.drifted.is_empty() && since.structural);
    }
}
