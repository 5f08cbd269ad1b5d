//! What the log said, to say each thing once, and how it says things: a container's label
//! (its pod's name, learnt from the runtime config and kept until its cpus are released), the
//! assignment events, the refusals the checkpoint keeps. Nothing here reads the tree or knows
//! the controller.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cgroupfs::CgroupPath;
use crate::classify::Classification;
use crate::cpuset::CpuSet;
use crate::logging::{excerpt, SaidEvery, SaidOnce};
use crate::planner::{AssignEvent, NodeLimits, ReleaseReason};
use crate::state::AssignmentKey;

/// What the log said, to say each thing once (see [`SaidOnce`]), and what it needs to name
/// pods. What is said of one cgroup and lasts as long as it does is in its record.
#[derive(Debug, Default)]
pub(crate) struct Said {
    /// Cgroups said to be unreadable (here, not in their records: one that cannot be read
    /// may have none).
    pub(crate) unreadable: SaidOnce<CgroupPath>,
    /// The watcher's rescans (once a minute).
    pub(crate) rescan: SaidEvery,
    /// `namespace/pod` of pods holding exclusive CPUs, so the log can name a pod that is gone
    /// when its CPUs are released.
    pub(crate) pod_names: HashMap<String, String>,
    /// The exclusive cpus refused, by container, as the log said it (for the checkpoint).
    pub(crate) refused: crate::state::Refusals,
    /// `refused` changed since the last pass's outcome said so.
    pub(crate) refusals_changed: bool,
}

impl Said {
    /// How the log names a container: `namespace/pod/container (pod<uid>/…)` once the runtime
    /// has named its pod, else the key alone.
    pub(crate) fn label(&self, key: &AssignmentKey) -> String {
        let uid = key.pod_uid();
        let Some(pod) = self.pod_names.get(uid) else {
            return key.to_string();
        };
        let text = match key {
            AssignmentKey::Named { container, .. } => format!("{pod}/{container} ({key})"),
            AssignmentKey::Id { .. } => format!("{pod} ({key})"),
        };
        crate::logging::printable(&text).into_owned()
    }

    /// `namespace/pod` of the pods of `keys`, from `classes`, for the log (kept until their
    /// CPUs are released, when the pod may be gone).
    pub(crate) fn learn_pod_names<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k AssignmentKey>,
        classes: &[Arc<Classification>],
    ) {
        for key in keys {
            let uid = key.pod_uid();
            if self.pod_names.contains_key(uid) {
                continue;
            }
            let named = classes
                .iter()
                .find(|c| c.pod_uid.as_deref() == Some(uid) && c.pod_name.is_some());
            if let Some(class) = named {
                let namespace = class.pod_namespace.as_deref().unwrap_or("-");
                let name = class.pod_name.as_deref().unwrap_or("-");
                // Names from the runtime config: cut if a hostile one is long.
                let (namespace, name) = (excerpt(namespace), excerpt(name));
                self.pod_names
                    .insert(uid.to_string(), format!("{namespace}/{name}"));
            }
        }
    }

    /// The refusals the checkpoint keeps: the first of a container's (the one the log says)
    /// until it gets its cpus or goes.
    pub(crate) fn note_refusal(&mut self, event: &AssignEvent) {
        use std::collections::btree_map::Entry;
        let (key, requested, error) = match event {
            AssignEvent::Failed {
                key,
                requested,
                error,
            } => (key, *requested, error),
            AssignEvent::Short {
                key, wanted, error, ..
            } => (key, *wanted, error),
            AssignEvent::Allocated { key, .. }
            | AssignEvent::Released { key, .. }
            | AssignEvent::Replaced { key, .. } => {
                self.refusals_changed |= self.refused.remove(key).is_some();
                return;
            }
            _ => return,
        };
        if let Entry::Vacant(entry) = self.refused.entry(key.clone()) {
            entry.insert(crate::state::Refusal {
                reason: error.to_string(),
                requested,
                available: error.available(),
            });
            self.refusals_changed = true;
        }
    }

    /// Says the watcher lost track (`reason`) and the tree is scanned again: at most once a
    /// minute, with how many were not said since.
    pub(crate) fn rescan(&mut self, reason: impl std::fmt::Display, now: Instant) {
        match self.rescan.due(now, Duration::from_secs(60)) {
            Some(more) => {
                let since = if more > 0 {
                    format!(" ({more} more rescans since the last time this was said)")
                } else {
                    String::new()
                };
                log::warn!("watcher lost track ({reason}): rescanning the whole tree{since}");
            }
            None => log::debug!("watcher lost track ({reason}): rescanning the whole tree"),
        }
    }
}

/// ` devices=…` with the devices of the container holding `key` and their NUMA nodes (the
/// hint its cpus were allocated with), or nothing when it has none.
pub(crate) fn devices_of(key: &AssignmentKey, classes: &[Arc<Classification>]) -> String {
    let devices = classes
        .iter()
        .find(|c| !c.devices.is_empty() && c.assignment_key().as_ref() == Some(key))
        .map(|c| crate::devices::describe_all(&c.devices));
    match devices {
        Some(text) => format!(" devices=[{text}]"),
        None => String::new(),
    }
}

/// Says what kubepods' parent gives pods when it changed from `last`: cpus of `all` (today's
/// topology) held back, or every cpu again. (Against today's topology: cpus the parent lost by
/// going offline were not given back when the topology lost them too.)
pub(crate) fn say_limits(last: Option<&NodeLimits>, limits: &NodeLimits, all: &CpuSet) {
    let Some(cpus) = &limits.cpus else {
        return;
    };
    let missing = all.difference(cpus);
    let missed = last
        .and_then(|l| l.cpus.as_ref())
        .is_some_and(|last| !all.is_subset(last));
    if !missing.is_empty() {
        log::warn!(
            "the parent of the kubepods cgroup gives pods only cpus {cpus} now: cpus {missing} \
             (offline, or held back by the parent) are not planned"
        );
    } else if missed {
        log::info!("the parent of the kubepods cgroup gives pods every cpu again");
    }
}

/// How the log says an assignment event (after the container's label).
pub(crate) fn describe(event: &AssignEvent) -> (log::Level, String) {
    use log::Level::{Info, Warn};
    let lost_cpus = |lost: &CpuSet, then: &str| {
        if lost.is_empty() {
            String::new()
        } else {
            format!("lost cpus {lost} (offline or out of reach){then}")
        }
    };
    match event {
        AssignEvent::Allocated { cpus, .. } => (Info, format!("allocated cpus={cpus}")),
        AssignEvent::Adopted { cpus, .. } => (Info, format!("adopted cpus={cpus}")),
        AssignEvent::Reused { from, cpus, .. } => {
            (Info, format!("took over cpus={cpus} from {from}"))
        }
        AssignEvent::Released { cpus, why, .. } => (
            Info,
            format!("released cpus={cpus} ({})", release_reason(why)),
        ),
        AssignEvent::Replaced {
            lost, added, cpus, ..
        } => (
            Info,
            format!(
                "{}replacement cpus {added}: cpus={cpus}",
                lost_cpus(lost, ", ")
            ),
        ),
        AssignEvent::Short {
            lost,
            cpus,
            wanted,
            error,
            ..
        } => (
            Warn,
            format!(
                "{}: keeps cpus={cpus} ({} of {wanted}) and asks again every pass: {error}",
                if lost.is_empty() {
                    // An in-place resize's growth, or a shortage said before.
                    format!(
                        "{} more cpus cannot be given",
                        wanted.saturating_sub(cpus.len())
                    )
                } else {
                    format!("{}no replacement can be given", lost_cpus(lost, " and "))
                },
                cpus.len()
            ),
        ),
        AssignEvent::Grown { .. }
        | AssignEvent::Shrunk { .. }
        | AssignEvent::PodRejected { .. } => describe_pod_change(event),
        AssignEvent::Failed {
            requested, error, ..
        } => (
            Warn,
            format!("{requested} exclusive cpus cannot be given, stays shared: {error}"),
        ),
    }
}

/// How the log says a resize or a pod's rejection.
fn describe_pod_change(event: &AssignEvent) -> (log::Level, String) {
    use log::Level::{Info, Warn};
    match event {
        AssignEvent::Grown {
            from, added, cpus, ..
        } => (
            Info,
            format!("resized in place from cpus={from} to cpus={cpus} (added {added})"),
        ),
        AssignEvent::Shrunk { from, cpus, .. } => (
            Info,
            format!("resized in place from cpus={from} to cpus={cpus}"),
        ),
        AssignEvent::PodRejected { rejection, .. } => (
            Warn,
            format!(
                "pod rejected {} ({}, container {}): {}: no container of the pod gets \
                 exclusive cpus",
                rejection.reason.rejected_as(),
                rejection.reason,
                rejection.container,
                rejection.message
            ),
        ),
        other => describe(other),
    }
}

/// Why the log says exclusive cpus were released.
fn release_reason(why: &ReleaseReason) -> &'static str {
    match why {
        ReleaseReason::PodGone => "pod gone",
        ReleaseReason::NowShared => "now shared",
        ReleaseReason::Resized => "resized",
        ReleaseReason::Reused => "reused by its pod",
        ReleaseReason::OutOfReach => "offline or out of reach: allocated afresh",
        ReleaseReason::PodRejected => "kubelet would reject its pod",
        ReleaseReason::SharedPoolEmpty => {
            "the shared pool would be empty: its reserved cpus are offline"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::AllocationError;
    use crate::cgroupfs::{CgroupDriver, CpuSettings, FileValue};
    use crate::classify::{classify, CgroupNaming};

    const UID: &str = "0f9e1a6c-0000-4000-8000-00000000000a";

    fn key(container: &str) -> AssignmentKey {
        AssignmentKey::Named {
            pod_uid: UID.to_string(),
            container: container.to_string(),
        }
    }

    fn named_container(namespace: &str, pod: &str) -> Arc<Classification> {
        let kubepods = CgroupPath::new("kubepods").unwrap();
        let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, &kubepods);
        let relative = CgroupPath::new(&format!("pod{UID}/{:064x}", 1)).unwrap();
        let settings = CpuSettings::V2 {
            max: FileValue::Missing,
            weight: FileValue::Missing,
        };
        let mut class = classify(&naming, &relative, &settings, None);
        class.pod_namespace = Some(namespace.to_string());
        class.pod_name = Some(pod.to_string());
        Arc::new(class)
    }

    #[test]
    fn a_container_is_labelled_by_its_pod_name_once_learnt_until_its_pod_is_released() {
        let mut said = Said::default();
        assert_eq!(said.label(&key("app")), key("app").to_string());
        let classes = [named_container("ns", "web\u{1b}[31m")];
        said.learn_pod_names([key("app")].iter(), &classes);
        let label = said.label(&key("app"));
        assert!(label.starts_with("ns/web") && label.ends_with(&format!("/app ({})", key("app"))));
        assert!(!label.contains('\u{1b}'), "printable only: {label:?}");
        // Learnt once: a later name does not replace it.
        said.learn_pod_names([key("db")].iter(), &[named_container("ns", "other")]);
        assert!(said.label(&key("db")).starts_with("ns/web"));
    }

    #[test]
    fn a_refusal_is_kept_as_first_said_until_the_container_gets_its_cpus() {
        let mut said = Said::default();
        let failed = |requested| AssignEvent::Failed {
            key: key("app"),
            requested,
            error: AllocationError::SmtNotMultipleOfCore {
                requested,
                cpus_per_core: 2,
            },
        };
        said.note_refusal(&failed(3));
        assert!(std::mem::take(&mut said.refusals_changed));
        said.note_refusal(&failed(5));
        assert!(!said.refusals_changed, "said once");
        assert_eq!(said.refused[&key("app")].requested, 3);
        let allocated = AssignEvent::Allocated {
            key: key("app"),
            cpus: "2-3".parse().unwrap(),
        };
        assert_eq!(describe(&allocated).1, "allocated cpus=2-3");
        said.note_refusal(&allocated);
        assert!(said.refusals_changed && said.refused.is_empty());
    }

    #[test]
    fn events_are_worded_with_their_reason() {
        let released = AssignEvent::Released {
            key: key("app"),
            cpus: "4".parse().unwrap(),
            why: ReleaseReason::PodGone,
        };
        assert_eq!(
            describe(&released),
            (log::Level::Info, "released cpus=4 (pod gone)".into())
        );
        let shrunk = AssignEvent::Shrunk {
            key: key("app"),
            from: "4-5".parse().unwrap(),
            cpus: "4".parse().unwrap(),
        };
        assert_eq!(
            describe(&shrunk).1,
            "resized in place from cpus=4-5 to cpus=4"
        );
        assert_eq!(devices_of(&key("app"), &[named_container("ns", "p")]), "");
    }
}
