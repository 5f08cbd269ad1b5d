//! Classification of the model's cgroups, cached per cgroup, and the containers that wait for
//! their CPU settings.

use super::model::{for_each_entry, Phase};
use super::*;

/// What classification noticed about a cgroup (an ignored annotation value, a pod uid in the
/// runtime config that differs from the path, a limit that differs from the request …), said
/// once: when its classification is cached, which is again only when its CPU settings change.
/// Logs what classification noticed about a cgroup, each notice once while it lasts.
pub(super) fn say_notices(path: &CgroupPath, class: &Classification, said: &mut SaidOnce<Notice>) {
    for notice in said.only(class.notices.iter().cloned()) {
        log::warn!("cg={path}: {notice}");
    }
}

impl Controller {
    /// Classifies the model, reusing each cgroup's cached classification (kept while its path
    /// and CPU settings stay the same, see [`Model::store`]).
    ///
    /// The runtime's config gives a container's CPU request while its cgroup still holds the
    /// kernel's defaults; once the cgroup has held the config's request (or was there when the
    /// agent started), a cgroup that differs from the config was resized in place, and its own
    /// settings are the truth (the config still names the container).
    pub(super) fn classify_model(&mut self, scan: &Scan) -> Vec<Class> {
        let mut cached = Vec::with_capacity(scan.cgroups.len());
        for_each_entry(&mut self.model, scan, |_, entry| {
            cached.push(entry.and_then(|e| e.class.clone()));
        });
        let classes = scan
            .cgroups
            .iter()
            .zip(cached)
            .map(|(cgroup, class)| class.unwrap_or_else(|| self.class_of(cgroup)))
            .collect();
        self.pod_level(scan, classes)
    }

    /// The containers of pods whose CPU is set at pod level (found from the whole pod,
    /// [`crate::classify::pod_level_pods`]; `scan` holds whole pods) are shared, as kubelet
    /// leaves them; each such pod is said once, of its pod cgroup.
    pub(super) fn pod_level(&mut self, scan: &Scan, mut classes: Vec<Class>) -> Vec<Class> {
        use crate::classify::{in_pod_level_pod, pod_level_pods, Notice};
        let pods = pod_level_pods(scan.cgroups.iter().zip(classes.iter().map(|c| &**c)));
        for class in &mut classes {
            if let Some(changed) = in_pod_level_pod(class, &pods) {
                *class = Arc::new(changed);
            }
        }
        for pod in pods.values() {
            let notice = Notice::PodLevelPod { limit: pod.limit };
            let entry = self.model.get_mut(&pod.pod);
            if entry.is_some_and(|e| e.said.first(notice.clone())) {
                log::info!("cg={}: {notice}", pod.pod);
            }
        }
        classes
    }

    /// The classification of `cgroup`: the cached one of its model entry, or a new one
    /// (cached unless it waits for its runtime config).
    pub(super) fn class_of(&mut self, cgroup: &ScannedCgroup) -> Class {
        match self.model.get(&cgroup.path).map(|e| e.class.clone()) {
            Some(Some(class)) => class,
            Some(None) => self.classify_entry(cgroup),
            None => {
                let runtime = &mut self.parts.runtime;
                Arc::new(classify_scan_one(&self.parts.naming, cgroup, |id| {
                    runtime.lookup(id)
                }))
            }
        }
    }

    /// A new classification of a model entry's cgroup, cached unless it is a container that
    /// waits for its CPU settings without a runtime config (looked up again next pass; one
    /// classified from its cgroup is not).
    fn classify_entry(&mut self, cgroup: &ScannedCgroup) -> Class {
        let mut found: Option<RuntimeInfo> = None;
        let runtime = &mut self.parts.runtime;
        let mut class = classify_scan_one(&self.parts.naming, cgroup, |id| {
            found = runtime.lookup(id);
            found.clone()
        });
        let waiting = model::waits_for_settings(&class);
        let cache = match (found, class.container_id.clone()) {
            (Some(info), Some(_)) => {
                if let Some(resized) = self.resized_class(cgroup, info) {
                    class = resized;
                }
                true
            }
            _ => class.kind != CgroupKind::Container || !waiting,
        };
        let class = Arc::new(class);
        if let Some(entry) = self.model.get_mut(&cgroup.path).filter(|_| cache) {
            entry.class = Some(class.clone());
            say_notices(&cgroup.path, &class, &mut entry.said);
        }
        class
    }

    /// A container whose runtime config was found: once its cgroup has held the config's CPU
    /// request (or was there when the agent started), a cgroup that differs from the config
    /// was resized in place and is classified from its own settings, which this returns. Its
    /// record moves to [`Phase::Settled`] or [`Phase::Resized`].
    fn resized_class(
        &mut self,
        cgroup: &ScannedCgroup,
        mut info: RuntimeInfo,
    ) -> Option<Classification> {
        let starting = !self.last_pass.planned;
        let phase = self.model.get(&cgroup.path).map(|r| r.phase());
        match config_matches_cgroup(&cgroup.cpu, &info.cpu) {
            Some(true) => {
                self.model.set_phase(&cgroup.path, Phase::Settled);
                None
            }
            Some(false) if starting || phase.is_some_and(Phase::settled) => {
                info.cpu = OciCpu::default();
                let naming = &self.parts.naming;
                let class = classify(naming, &cgroup.relative, &cgroup.cpu, Some(&info));
                if phase != Some(Phase::Resized) {
                    log::info!(
                        "cg={} cpu settings differ from the runtime config (resized in place): \
                         request {} from the cgroup",
                        cgroup.path,
                        class
                            .resources
                            .map_or_else(|| "unknown".to_string(), |r| r.request.to_string())
                    );
                }
                self.model.set_phase(&cgroup.path, Phase::Resized);
                Some(class)
            }
            _ => None,
        }
    }

    /// Containers whose CPU settings are not readable yet get a few bounded re-reads (a full
    /// pass's `scan` is the whole model): see [`Model::track_settings`].
    pub(super) fn track_settings_wait(&mut self, scan: &Scan, classes: &[Class], now: Instant) {
        let waiting = classes
            .iter()
            .map(|class| class.kind == CgroupKind::Container && model::waits_for_settings(class));
        self.deadlines.settings = self.model.track_settings(scan, waiting, now);
    }
}
