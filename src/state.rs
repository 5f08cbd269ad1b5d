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

/// Why the agent could not give a container the exclusive cpus it asks for, as its log said it
/// (once, until the container gets them or goes): kubelet's text, the count asked for and,
/// where the reason counts them, the cpus that were available. Kept in the checkpoint, so
/// `status` shows the agent's decision rather than one of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub reason: String,
    pub requested: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<usize>,
}

/// The refusals in force, by container.
pub type Refusals = BTreeMap<AssignmentKey, Refusal>;

/// Every exclusive assignment on the node. CPUs of two assignments never overlap.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Assignments {
    // A list rather than a map in JSON: the key is a struct.
    #[serde(with = "entries")]
    by_key: BTreeMap<AssignmentKey, ExclusiveAssignment>,
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
}

mod entries {
    use super::*;
    use serde::{Deserializer, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Entry {
        #[serde(flatten)]
        key: AssignmentKey,
        cpus: CpuSet,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        adopted: Option<Adoption>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wanted: Option<usize>,
    }

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<AssignmentKey, ExclusiveAssignment>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let list: Vec<Entry> = map
            .iter()
            .map(|(k, a)| Entry {
                key: k.clone(),
                cpus: a.cpus.clone(),
                container_id: a.container_id.clone(),
                adopted: a.adopted,
                wanted: a.wanted,
            })
            .collect();
        list.serialize(s)
    }

    /// Goes through [`Assignments::insert`], so a file naming one CPU twice is refused.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<AssignmentKey, ExclusiveAssignment>, D::Error> {
        let mut assignments = Assignments::new();
        for e in Vec::<Entry>::deserialize(d)? {
            let assignment = ExclusiveAssignment {
                cpus: e.cpus,
                container_id: e.container_id,
                adopted: e.adopted,
                wanted: e.wanted,
            };
            assignments
                .insert(e.key, assignment)
                .map_err(serde::de::Error::custom)?;
        }
        Ok(assignments.by_key)
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
