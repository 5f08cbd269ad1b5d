//! What a pass did, told: the log's lines for assignment events (worded by
//! [`crate::agent::said`]), the metrics they count, and the event → pin latency.

use super::*;
use crate::agent::said::{describe, devices_of};

impl Controller {
    /// Counts each assignment event in the metrics and says it in the log (a failure once
    /// until it is met or its container goes).
    pub(super) fn log_events(&mut self, events: &[AssignEvent], classes: &[Class]) {
        self.said
            .learn_pod_names(events.iter().map(AssignEvent::key), classes);
        // A rejected pod's reason is said once, for the pod, not again for its container.
        let rejected: HashSet<String> = events
            .iter()
            .filter(|e| matches!(e, AssignEvent::PodRejected { .. }))
            .map(|e| e.key().pod_uid().to_string())
            .collect();
        let policy = self.parts.policy.as_ref();
        let full_cores = policy.is_some_and(|p| p.options().full_pcpus_only);
        let topology = &self.parts.topology;
        for event in events {
            let said_for_the_pod = matches!(event, AssignEvent::Failed { key, .. }
                if rejected.contains(key.pod_uid()));
            // A rejected pod's record is its rejection, not a refusal of its container.
            if !said_for_the_pod {
                self.said.note_refusal(event);
            }
            if !self.metrics.count_assign_event(event, full_cores, topology) || said_for_the_pod {
                continue;
            }
            let key = event.key();
            let devices = match event {
                AssignEvent::Allocated { key, .. } => devices_of(key, classes),
                _ => String::new(),
            };
            let (level, text) = describe(event);
            log::log!(level, "{}: {text}{devices}", self.said.label(key));
            if let AssignEvent::Released {
                why: ReleaseReason::PodGone,
                ..
            } = event
            {
                self.said.pod_names.remove(key.pod_uid());
            }
        }
    }

    /// The exclusive cpus refused, by container, with kubelet's reason as the log said it.
    pub fn refusals(&self) -> &crate::state::Refusals {
        &self.said.refused
    }

    /// Event → pin latency: new containers' pins that landed are timed (see
    /// [`Model::time_pins`]). `pinned_at(i)`: when scanned cgroup `i`'s writes were made.
    pub(super) fn track_pins(
        &mut self,
        scan: &Scan,
        classes: &[Class],
        pinned_at: impl Fn(usize) -> Instant,
    ) {
        let metrics = &mut self.metrics;
        let record = |latency| metrics.event_to_pin.record(latency);
        self.model.time_pins(scan, classes, pinned_at, record);
    }
}
