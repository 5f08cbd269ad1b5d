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
/// Why kubelet would refuse a pod at admission: its `PodAdmitResult.Reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AdmissionReason {
    /// `full-pcpus-only`: a request that is not whole cores, or not enough free whole cores.
    #[serde(rename = "SMTAlignmentError")]
    SmtAlignment,
    /// Any other allocation failure (not enough cpus): kubelet's `UnexpectedAdmissionError`.
    #[serde(rename = "UnexpectedAdmissionError")]
    Unexpected,
    /// Not kubelet's: a pod asking for isolated cpus (`cpusetd.io/isolated-cpus`) that the
    /// isolated pool cannot serve (too small, none on the node, or `--respect-isolcpus` off).
    /// Named in kubelet's style; it is never served from the other cpus instead.
    #[serde(rename = "IsolatedCPUsError")]
    IsolatedCpus,
}

impl AdmissionReason {
    /// How the log and `status` say a pod was rejected for this reason: kubelet's reasons "as
    /// kubelet would reject it"; the isolated pool's is cpusetd's own.
    pub fn rejected_as(&self) -> &'static str {
        match self {
            AdmissionReason::SmtAlignment | AdmissionReason::Unexpected => {
                "as kubelet would reject it"
            }
            AdmissionReason::IsolatedCpus => "as the isolated cpus it asks for cannot be given",
        }
    }

    /// Every reason, in the order metrics list them.
    pub const ALL: [AdmissionReason; 3] = [
        AdmissionReason::SmtAlignment,
        AdmissionReason::Unexpected,
        AdmissionReason::IsolatedCpus,
    ];
}

impl fmt::Display for AdmissionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AdmissionReason::SmtAlignment => "SMTAlignmentError",
            AdmissionReason::Unexpected => "UnexpectedAdmissionError",
            AdmissionReason::IsolatedCpus => "IsolatedCPUsError",
        })
    }
}

/// A pod kubelet would reject at admission: no container of it holds exclusive cpus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRejection {
    pub reason: AdmissionReason,
    /// The container whose request failed (kubelet stops at the first).
    pub container: String,
    /// kubelet's admission message.
    pub message: String,
    /// Decided by the request alone (not a whole number of cores): it stands while the pod
    /// lives, even after that container is gone (an init container). Otherwise the pod is
    /// admitted again, all its containers at once, every pass.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
}

impl fmt::Display for PodRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.container, self.message)
    }
}

/// Every exclusive assignment on the node. CPUs of two assignments never overlap.
///
/// Besides the cpus, each assignment remembers the cpus in-place resizes added to it, in the
/// order they came ([`Self::grown`]; what it held before them is its original set), and the
/// node remembers the pods kubelet would reject ([`Self::rejection`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignments {
    by_key: BTreeMap<AssignmentKey, ExclusiveAssignment>,
    /// Cpus added to an assignment after it was made, oldest first: non-empty, disjoint
    /// subsets of its cpus that leave some of them out (its original set).
    grown: BTreeMap<AssignmentKey, Vec<CpuSet>>,
    rejected: BTreeMap<String, PodRejection>,
    /// `namespace/name` by pod uid, for pods holding an assignment: in JSON each entry's
    /// `pod`, so that a pod gone while the agent was down is still named in the log when its
    /// cpus are released.
    pod_names: BTreeMap<String, String>,
}

// A list rather than a map in JSON: the key is a struct. Rejections are not in it (the
// checkpoint keeps them beside it).
impl Serialize for Assignments {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        entries::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for Assignments {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        entries::deserialize(d)
    }
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
        let steps = self.grown.remove(&key).unwrap_or_default();
        self.by_key.insert(key.clone(), assignment);
        self.set_grown(&key, steps);
        Ok(())
    }

    pub fn remove(&mut self, key: &AssignmentKey) -> Option<ExclusiveAssignment> {
        self.grown.remove(key);
        self.by_key.remove(key)
    }

    /// Keeps only the assignments for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&AssignmentKey, &ExclusiveAssignment) -> bool) {
        self.by_key.retain(|k, a| keep(k, a));
        let by_key = &self.by_key;
        self.grown.retain(|k, _| by_key.contains_key(k));
    }

    /// The cpus in-place resizes added to `key`'s assignment, oldest first (empty: it holds
    /// its original set).
    pub fn grown(&self, key: &AssignmentKey) -> &[CpuSet] {
        self.grown.get(key).map(Vec::as_slice).unwrap_or_default()
    }

    /// The cpus `key` held before in-place resizes added to them.
    pub fn original(&self, key: &AssignmentKey) -> Option<CpuSet> {
        let held = self.by_key.get(key)?;
        let mut original = held.cpus.clone();
        for step in self.grown(key) {
            original.remove_all(step);
        }
        Some(original)
    }

    /// Records what resizes added to `key`'s assignment, oldest first. Kept only as far as it
    /// holds: each step within its cpus and not in an earlier one, empty steps dropped, and
    /// never all of its cpus (the oldest step becomes part of the original set then).
    pub fn set_grown(&mut self, key: &AssignmentKey, steps: Vec<CpuSet>) {
        let Some(held) = self.by_key.get(key) else {
            return;
        };
        let mut seen = CpuSet::new();
        let mut kept: Vec<CpuSet> = Vec::new();
        for step in steps {
            let step = step.intersection(&held.cpus).difference(&seen);
            if !step.is_empty() {
                seen.extend_from(&step);
                kept.push(step);
            }
        }
        if seen == held.cpus && !kept.is_empty() {
            kept.remove(0);
        }
        if kept.is_empty() {
            self.grown.remove(key);
        } else {
            self.grown.insert(key.clone(), kept);
        }
    }

    /// Why kubelet would reject pod `pod_uid`, if it would.
    pub fn rejection(&self, pod_uid: &str) -> Option<&PodRejection> {
        self.rejected.get(pod_uid)
    }

    /// The pods kubelet would reject, by UID.
    pub fn rejected(&self) -> impl Iterator<Item = (&String, &PodRejection)> {
        self.rejected.iter()
    }

    /// Records that kubelet would reject pod `pod_uid`.
    pub fn reject(&mut self, pod_uid: &str, rejection: PodRejection) {
        self.rejected.insert(pod_uid.to_string(), rejection);
    }

    /// Keeps only the rejections for which `keep` returns true.
    pub fn retain_rejections(&mut self, mut keep: impl FnMut(&str, &PodRejection) -> bool) {
        self.rejected.retain(|uid, r| keep(uid, r));
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
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        grown: Vec<CpuSet>,
        /// The pod's `namespace/name`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
    }

    pub fn serialize<S: Serializer>(assignments: &Assignments, s: S) -> Result<S::Ok, S::Error> {
        let list: Vec<Entry> = assignments
            .by_key
            .iter()
            .map(|(k, a)| Entry {
                key: k.clone(),
                cpus: a.cpus.clone(),
                container_id: a.container_id.clone(),
                adopted: a.adopted,
                wanted: a.wanted,
                grown: assignments.grown(k).to_vec(),
                pod: assignments.pod_names.get(k.pod_uid()).cloned(),
            })
            .collect();
        list.serialize(s)
    }

    /// Goes through [`Assignments::insert`], so a file naming one CPU twice is refused.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Assignments, D::Error> {
        let mut assignments = Assignments::new();
        for e in Vec::<Entry>::deserialize(d)? {
            let assignment = ExclusiveAssignment {
                cpus: e.cpus,
                container_id: e.container_id,
                adopted: e.adopted,
                wanted: e.wanted,
            };
            assignments
                .insert(e.key.clone(), assignment)
                .map_err(serde::de::Error::custom)?;
            assignments.set_grown(&e.key, e.grown);
            if let Some(pod) = e.pod {
                assignments.set_pod_name(e.key.pod_uid(), pod);
            }
        }
        Ok(assignments)
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
