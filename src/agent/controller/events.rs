//! What a pass did, told: the log's lines for assignment events (worded by
//! [`crate::agent::said`]), the metrics they count, and the event → pin latency.

use super::*;

impl Controller {
    /// Counts each assignment event in the metrics and says it in the log (see
    /// [`Said::events`]).
    pub(super) fn log_events(&mut self, events: &[AssignEvent], classes: &[Class]) {
        let policy = self.parts.policy.as_ref();
        let full_cores = policy.is_some_and(|p| p.options().full_pcpus_only);
        let how = (full_cores, &self.parts.topology);
        self.said.events(events, classes, &mut self.metrics, how);
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
