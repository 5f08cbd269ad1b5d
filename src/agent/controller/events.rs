//! What a pass did, told: the log's lines for assignment events, and the event → pin latency.

use super::model::for_each_entry;
use super::*;
use crate::logging::excerpt;

/// What the log said, to say each thing once (see [`SaidOnce`]), and what it needs to name
/// pods. What is said of one cgroup and lasts as long as it does is in its record.
#[derive(Debug, Default)]
pub(super) struct Said {
    /// Cgroups said to be unreadable (here, not in their records: one that cannot be read
    /// may have none).
    pub(super) unreadable: SaidOnce<CgroupPath>,
    /// The watcher's rescans (once a minute).
    pub(super) rescan: SaidEvery,
    /// `namespace/pod` of pods holding exclusive CPUs, so the log can name a pod that is gone
    /// when its CPUs are released.
    pub(super) pod_names: HashMap<String, String>,
    /// The exclusive cpus refused, by container, as the log said it (for the checkpoint).
    pub(super) refused: crate::state::Refusals,
    /// `refused` changed since the last pass's outcome said so.
    pub(super) refusals_changed: bool,
}

impl Controller {
    /// How the log names a container: `namespace/pod/container (pod<uid>/…)` once the runtime
    /// has named its pod, else the key alone.
    pub(super) fn label(&self, key: &AssignmentKey) -> String {
        let uid = key.pod_uid();
        let Some(pod) = self.said.pod_names.get(uid) else {
            return key.to_string();
        };
        let text = match key {
            AssignmentKey::Named { container, .. } => format!("{pod}/{container} ({key})"),
            AssignmentKey::Id { .. } => format!("{pod} ({key})"),
        };
        crate::logging::printable(&text).into_owned()
    }

    /// ` devices=…` with the devices of the container holding `key` and their NUMA nodes (the
    /// hint its cpus were allocated with), or nothing when it has none.
    pub(super) fn devices_of(key: &AssignmentKey, classes: &[Class]) -> String {
        let devices = classes
            .iter()
            .find(|c| !c.devices.is_empty() && c.assignment_key().as_ref() == Some(key))
            .map(|c| crate::devices::describe_all(&c.devices));
        match devices {
            Some(text) => format!(" devices=[{text}]"),
            None => String::new(),
        }
    }

    /// `namespace/pod` of the pods of `keys`, from `classes`, for the log (kept until their
    /// CPUs are released, when the pod may be gone).
    pub(super) fn learn_pod_names<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k AssignmentKey>,
        classes: &[Class],
    ) {
        for key in keys {
            let uid = key.pod_uid();
            if self.said.pod_names.contains_key(uid) {
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
                self.said
                    .pod_names
                    .insert(uid.to_string(), format!("{namespace}/{name}"));
            }
        }
    }

    /// Counts each assignment event in the metrics and says it in the log (a failure once
    /// until it is met or its container goes).
    pub(super) fn log_events(&mut self, events: &[AssignEvent], classes: &[Class]) {
        self.learn_pod_names(events.iter().map(AssignEvent::key), classes);
        // A rejected pod's reason is said once, for the pod, not again for its container.
        let rejected: HashSet<String> = events
            .iter()
            .filter(|e| matches!(e, AssignEvent::PodRejected { .. }))
            .map(|e| e.key().pod_uid().to_string())
            .collect();
        for event in events {
            let said_for_the_pod = matches!(event, AssignEvent::Failed { key, .. }
                if rejected.contains(key.pod_uid()));
            // A rejected pod's record is its rejection, not a refusal of its container.
            if !said_for_the_pod {
                self.note_refusal(event);
            }
            if !self.count_event(event) || said_for_the_pod {
                continue;
            }
            let key = event.key();
            let devices = match event {
                AssignEvent::Allocated { key, .. } => Self::devices_of(key, classes),
                _ => String::new(),
            };
            let (level, text) = describe(event);
            log::log!(level, "{}: {text}{devices}", self.label(key));
            if let AssignEvent::Released {
                why: ReleaseReason::PodGone,
                ..
            } = event
            {
                self.said.pod_names.remove(key.pod_uid());
            }
        }
    }

    /// The refusals the checkpoint keeps: the first of a container's (the one the log says)
    /// until it gets its cpus or goes.
    fn note_refusal(&mut self, event: &AssignEvent) {
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
                self.said.refusals_changed |= self.said.refused.remove(key).is_some();
                return;
            }
            _ => return,
        };
        if let Entry::Vacant(entry) = self.said.refused.entry(key.clone()) {
            entry.insert(crate::state::Refusal {
                reason: error.to_string(),
                requested,
                available: error.available(),
            });
            self.said.refusals_changed = true;
        }
    }

    /// The exclusive cpus refused, by container, with kubelet's reason as the log said it.
    pub fn refusals(&self) -> &crate::state::Refusals {
        &self.said.refused
    }

    /// Counts `event` in the metrics; whether the log says it: a failure is said once per
    /// container (key) until it is met or goes, not once per pass (every pass asks again).
    fn count_event(&mut self, event: &AssignEvent) -> bool {
        match event {
            AssignEvent::Allocated { key, cpus } => {
                self.metrics.pinning_requests += 1;
                self.count_alignment(Some(cpus));
                self.metrics.pin_succeeded(key);
                true
            }
            AssignEvent::Released { key, .. } | AssignEvent::Replaced { key, .. } => {
                self.metrics.pin_succeeded(key);
                true
            }
            AssignEvent::Adopted { .. }
            | AssignEvent::Grown { .. }
            | AssignEvent::Shrunk { .. }
            | AssignEvent::Reused { .. } => true,
            AssignEvent::Short { key, .. } => self.metrics.first_pin_failure(key),
            AssignEvent::PodRejected { key, .. } => self.metrics.first_pod_rejection(key.pod_uid()),
            AssignEvent::Failed { key, .. } => {
                let first = self.metrics.first_pin_failure(key);
                if first {
                    self.metrics.pinning_requests += 1;
                    self.metrics.pinning_errors += 1;
                    self.count_alignment(None);
                }
                first
            }
        }
    }

    /// kubelet's `container_aligned_compute_resources_count` and `_failure_count` for an
    /// allocation (`Some(cpus)`) or a refusal: physical_cpu under `full-pcpus-only`,
    /// uncore_cache for an allocation within one uncore cache.
    fn count_alignment(&mut self, allocated: Option<&CpuSet>) {
        let full_cores = self
            .parts
            .policy
            .as_ref()
            .is_some_and(|p| p.options().full_pcpus_only);
        let Some(cpus) = allocated else {
            self.metrics.aligned_physical_cpu_failures += u64::from(full_cores);
            return;
        };
        self.metrics.aligned_physical_cpu += u64::from(full_cores);
        let topology = &self.parts.topology;
        let mut caches = cpus.iter().map(|c| topology.cpu(c).map(|i| i.uncore));
        let first = caches.next().flatten();
        if first.is_some() && caches.all(|c| c == first) {
            self.metrics.aligned_uncore_cache += 1;
        }
    }

    /// Event → pin latency: a new container counts once, when its cpuset reads back as desired
    /// and its CPU settings were known (before, it waits in the shared pool for them).
    /// `pinned_at(i)`: when scanned cgroup `i`'s writes were made.
    pub(super) fn track_pins(
        &mut self,
        scan: &Scan,
        classes: &[Class],
        pinned_at: impl Fn(usize) -> Instant,
    ) {
        use crate::classify::{Exclusivity, SharedReason};
        if self.model.pins_pending == 0 {
            return;
        }
        let now = Instant::now();
        let mut index = 0;
        let (mut timed, metrics) = (0, &mut self.metrics);
        for_each_entry(&mut self.model, scan, |_, entry| {
            let (i, class) = (index, &classes[index]);
            index += 1;
            let Some((entry, seen)) = entry.and_then(|e| e.pin_seen.map(|seen| (e, seen))) else {
                return;
            };
            let waiting = matches!(
                class.exclusivity,
                Exclusivity::Shared {
                    reason: SharedReason::CpuSettingsUnavailable
                }
            );
            let current = entry.cgroup.cpus.configured();
            let pinned = class.kind == CgroupKind::Container
                && !waiting
                && current.is_some()
                && current == entry.desired.as_ref();
            if pinned {
                let latency = pinned_at(i).saturating_duration_since(seen);
                metrics.event_to_pin.record(latency);
            }
            let done = class.kind != CgroupKind::Container || pinned;
            if done || now.saturating_duration_since(seen) >= PIN_TRACKING_LIMIT {
                entry.pin_seen = None;
                timed += 1;
            }
        });
        self.model.pins_pending -= timed;
    }
}

/// How the log says an assignment event (after the container's label).
fn describe(event: &AssignEvent) -> (log::Level, String) {
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
