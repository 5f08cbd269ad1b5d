//! Exclusive CPU assignments: who holds which CPUs.
//!
//! Assignments are keyed by (pod UID, container name) when the name is known, so a restarted
//! container (new id, new cgroup) finds its CPUs again; by container id otherwise (DESIGN.md §3).
//! This is the state the controller owns, the planner reads and the checkpoint persists.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

/// What an exclusive assignment belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssignmentKey {
    /// A container whose name is known (from its runtime `config.json`).
    Named { pod_uid: String, container: String },
    /// A container known only by its id.
    Id {
        pod_uid: String,
        container_id: String,
    },
}

impl AssignmentKey {
    pub fn pod_uid(&self) -> &str {
        match self {
            AssignmentKey::Named { pod_uid, .. } | AssignmentKey::Id { pod_uid, .. } => pod_uid,
        }
    }
}

impl fmt::Display for AssignmentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AssignmentKey::Named { pod_uid, container } => write!(f, "pod{pod_uid}/{container}"),
            AssignmentKey::Id {
                pod_uid,
                container_id,
            } => write!(f, "pod{pod_uid}/id:{container_id}"),
        }
    }
}

/// Where a pin the agent did not choose itself came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Adoption {
    /// The live tree showed the container on a set it could keep (someone pinned it before).
    LiveTree,
    /// kubelet's `cpu_manager_state` named it, and the live tree agreed (migration from
    /// kubelet's static policy).
    Kubelet,
}

impl fmt::Display for Adoption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Adoption::LiveTree => "adopted from the live tree",
            Adoption::Kubelet => "adopted from kubelet's cpu_manager_state",
        })
    }
}

/// CPUs held exclusively by one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExclusiveAssignment {
    pub cpus: CpuSet,
    /// The id of the container that last held the CPUs (a restart brings a new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Set when the agent adopted the pin rather than choosing it; kept across restarts of
    /// the container and of the agent, dropped when the agent moves or resizes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted: Option<Adoption>,
    /// How many cpus the container is entitled to while it holds fewer: some of its cpus went
    /// offline (or out of reach) and no replacement was free yet. `None`: it holds them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted: Option<usize>,
}

impl ExclusiveAssignment {
    /// How many cpus it should hold: [`Self::wanted`] while short, else what it holds.
    pub fn entitled(&self) -> usize {
        self.wanted.unwrap_or(self.cpus.len())
    }
}

/// Every exclusive assignment on the node. CPUs of two assignments never overlap.
///
/// In JSON a list (the key is a struct) of entries, each with its key's members, its cpus and,
/// when known, `pod`: the pod's `namespace/name`, so that a pod gone while the agent was down
/// is still named in the log when its cpus are released.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "entries::List", try_from = "entries::List")]
pub struct Assignments {
    by_key: BTreeMap<AssignmentKey, ExclusiveAssignment>,
    /// `namespace/name` by pod uid, for pods holding an assignment.
    pod_names: BTreeMap<String, String>,
}

/// Why an assignment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    #[error("cpus {cpus} of {key} overlap cpus held by {holder}")]
    Overlap {
        key: Box<AssignmentKey>,
        cpus: CpuSet,
        holder: Box<AssignmentKey>,
    },
    #[error("{key} has an empty cpu set")]
    Empty { key: Box<AssignmentKey> },
}

impl Assignments {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn get(&self, key: &AssignmentKey) -> Option<&ExclusiveAssignment> {
        self.by_key.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&AssignmentKey, &ExclusiveAssignment)> {
        self.by_key.iter()
    }

    /// Every CPU held by some assignment.
    pub fn exclusive_cpus(&self) -> CpuSet {
        let mut all = CpuSet::new();
        for a in self.by_key.values() {
            all.extend_from(&a.cpus);
        }
        all
    }

    /// The assignment holding any of `cpus`, other than `except`.
    pub fn holder_of(&self, cpus: &CpuSet, except: &AssignmentKey) -> Option<&AssignmentKey> {
        self.by_key
            .iter()
            .find(|(k, a)| *k != except && !a.cpus.is_disjoint(cpus))
            .map(|(k, _)| k)
    }

    /// Records an assignment, replacing any previous one of the same key. Refuses an empty set
    /// and a set that overlaps another assignment.
    pub fn insert(
        &mut self,
        key: AssignmentKey,
        assignment: ExclusiveAssignment,
    ) -> Result<(), AssignmentError> {
        if assignment.cpus.is_empty() {
            return Err(AssignmentError::Empty { key: Box::new(key) });
        }
        if let Some(holder) = self.holder_of(&assignment.cpus, &key) {
            return Err(AssignmentError::Overlap {
                holder: Box::new(holder.clone()),
                cpus: assignment.cpus,
                key: Box::new(key),
            });
        }
        self.by_key.insert(key, assignment);
        Ok(())
    }

    pub fn remove(&mut self, key: &AssignmentKey) -> Option<ExclusiveAssignment> {
        self.by_key.remove(key)
    }

    /// Keeps only the assignments for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&AssignmentKey, &ExclusiveAssignment) -> bool) {
        self.by_key.retain(|k, a| keep(k, a));
    }

    /// The `namespace/name` of the pod with this uid, when recorded.
    pub fn pod_name(&self, pod_uid: &str) -> Option<&str> {
        self.pod_names.get(pod_uid).map(String::as_str)
    }

    /// Records the `namespace/name` of the pod with this uid.
    pub fn set_pod_name(&mut self, pod_uid: &str, name: String) {
        self.pod_names.insert(pod_uid.to_string(), name);
    }

    /// Every recorded pod name, by uid.
    pub fn pod_names(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pod_names
            .iter()
            .map(|(uid, name)| (uid.as_str(), name.as_str()))
    }

    /// Records the names of the pods that hold assignments, from `names` (by uid). With
    /// `prune`, names of pods that hold none are dropped (after assignments changed);
    /// otherwise only missing names are added (no allocation when none is missing).
    pub fn name_pods(&mut self, names: &std::collections::HashMap<String, String>, prune: bool) {
        if prune {
            let held: std::collections::HashSet<&str> =
                self.by_key.keys().map(AssignmentKey::pod_uid).collect();
            self.pod_names.retain(|uid, _| held.contains(uid.as_str()));
        }
        for key in self.by_key.keys() {
            let uid = key.pod_uid();
            if self.pod_names.contains_key(uid) {
                continue;
            }
            if let Some(name) = names.get(uid) {
                self.pod_names.insert(uid.to_string(), name.clone());
            }
        }
    }
}

mod entries {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    pub struct Entry {
        #[serde(flatten)]
        key: AssignmentKey,
        cpus: CpuSet,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        adopted: Option<Adoption>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wanted: Option<usize>,
        /// The pod's `namespace/name`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
    }

    /// The JSON form of [`Assignments`].
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(transparent)]
    pub struct List(Vec<Entry>);

    impl From<Assignments> for List {
        fn from(assignments: Assignments) -> List {
            let names = &assignments.pod_names;
            List(
                assignments
                    .by_key
                    .iter()
                    .map(|(k, a)| Entry {
                        key: k.clone(),
                        cpus: a.cpus.clone(),
                        container_id: a.container_id.clone(),
                        adopted: a.adopted,
                        wanted: a.wanted,
                        pod: names.get(k.pod_uid()).cloned(),
                    })
                    .collect(),
            )
        }
    }

    /// Goes through [`Assignments::insert`], so a file naming one CPU twice is refused.
    impl TryFrom<List> for Assignments {
        type Error = AssignmentError;

        fn try_from(list: List) -> Result<Assignments, AssignmentError> {
            let mut assignments = Assignments::new();
            for e in list.0 {
                let assignment = ExclusiveAssignment {
                    cpus: e.cpus,
                    container_id: e.container_id,
                    adopted: e.adopted,
                    wanted: e.wanted,
                };
                if let Some(pod) = e.pod {
                    assignments.set_pod_name(e.key.pod_uid(), pod);
                }
                assignments.insert(e.key, assignment)?;
            }
            Ok(assignments)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(pod: &str, c: &str) -> AssignmentKey {
        AssignmentKey::Named {
            pod_uid: pod.into(),
            container: c.into(),
        }
    }

    fn cpus(text: &str) -> ExclusiveAssignment {
        ExclusiveAssignment {
            cpus: CpuSet::parse(text).unwrap(),
            container_id: None,
            adopted: None,
            wanted: None,
        }
    }

    #[test]
    fn overlapping_assignments_are_refused() {
        let mut a = Assignments::new();
        a.insert(named("p1", "app"), cpus("2-3")).unwrap();
        let err = a.insert(named("p2", "app"), cpus("3-4")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cpus 3-4 of podp2/app overlap cpus held by podp1/app"
        );
        // Replacing one's own assignment is fine.
        a.insert(named("p1", "app"), cpus("3-4")).unwrap();
        assert_eq!(a.exclusive_cpus().to_string(), "3-4");
        assert!(a.insert(named("p3", "x"), cpus("")).is_err());
    }

    #[test]
    fn json_round_trip() {
        let mut a = Assignments::new();
        a.insert(named("p1", "app"), cpus("2-3")).unwrap();
        a.insert(
            AssignmentKey::Id {
                pod_uid: "p2".into(),
                container_id: "abc".into(),
            },
            cpus("5"),
        )
        .unwrap();
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(
            json,
            r#"[{"named":{"pod_uid":"p1","container":"app"},"cpus":"2-3"},{"id":{"pod_uid":"p2","container_id":"abc"},"cpus":"5"}]"#
        );
        let back: Assignments = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
        let overlapping = json.replace("\"5\"", "\"3\"");
        let err = serde_json::from_str::<Assignments>(&overlapping).unwrap_err();
        assert!(err.to_string().contains("overlap"), "{err}");
    }
}
