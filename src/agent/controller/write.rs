//! A plan and its writes: what is urgent, what may wait, what the writes showed of the model.

use super::model::for_each_entry;
use super::*;
use crate::cgroupfs::{CgroupError, ScannedCgroup};
use crate::planner::{Known, Step};
use crate::writer::{execute, Budget, Executed, Outcome, Tally};

impl Controller {
    /// What the planner is given besides the tree.
    pub(super) fn plan_config<'a>(&'a self, limits: &'a NodeLimits) -> PlanConfig<'a> {
        PlanConfig {
            topology: &self.parts.topology,
            policy: self.parts.policy.as_ref(),
            align_memory: self.parts.align_memory,
            keep_cfs_quota: self.parts.keep_cfs_quota,
            limits: Some(limits),
            respect_isolcpus: self.parts.respect_isolcpus,
        }
    }

    /// Plans `scan` (the whole model, or an incremental pass's chain), makes its writes and
    /// takes what they showed into the model.
    pub(super) fn plan_and_write(
        &mut self,
        now: Instant,
        scan: Scan,
        classes: Vec<Class>,
        limits: NodeLimits,
        mode: Mode,
    ) -> (PassOutcome, FollowUp) {
        let mut planned = self.plan_pass(&scan, &classes, &limits, &mode);
        self.log_events(&planned.events, &classes);
        if mode.is_full() {
            self.forget_met_pin_failures(&classes, &planned);
        }
        let drifted = std::mem::take(&mut self.since_pass.drifted);
        // Urgent steps first where the writes may be held back (see `write`).
        let urgent = if self.arrivals.is_some() && mode.is_full() {
            planned.urgent_first(&scan, &drifted)
        } else {
            Vec::new()
        };
        let executed = self.write(now, &scan, &mut planned, &mode);
        let written_at = Instant::now();
        self.count_repairs(&drifted, &executed);
        self.say_write_failures(&executed);
        let vanished = self.take_written(written_at, &scan, &planned, &executed, &mode);
        let urgent_done = executed.urgent_done.unwrap_or(written_at);
        self.track_pins(&scan, &classes, |i| {
            if urgent.get(i) == Some(&true) {
                urgent_done
            } else {
                written_at
            }
        });
        if mode.is_full() {
            self.track_settings_wait(&scan, &classes, now);
        }
        self.count_containers(&scan, &classes, &mode);
        let mut outcome = self.record_pass(planned, &executed, &classes, &mode);
        self.count_cpu_shared();
        // The checkpoint keeps the refusals `status` shows.
        outcome.assignments_changed |= std::mem::take(&mut self.said.refusals_changed);
        let paths = |pick: fn(&Outcome) -> bool| -> Vec<CgroupPath> {
            executed.with(pick).map(|s| s.path.clone()).collect()
        };
        let follow_up = FollowUp {
            stale: paths(|o| matches!(o, Outcome::ChildInTheWay { .. })),
            settling: paths(|o| matches!(o, Outcome::Settling)),
            vanished,
        };
        (outcome, follow_up)
    }

    /// The plan of `scan`. An incremental pass writes in its pods, and widens their ancestors
    /// (top-down, before the pods: a pool that grew reaches a new pod through them); the
    /// ancestors' narrowings (the shared pool's) wait for the full pass, with the rest of the
    /// pool's members, whose sets hold them up.
    fn plan_pass(
        &mut self,
        scan: &Scan,
        classes: &[Class],
        limits: &NodeLimits,
        mode: &Mode,
    ) -> Plan {
        let mut planned = plan(
            scan,
            classes,
            &self.parts.assignments,
            &self.plan_config(limits),
        );
        if mode.is_full() {
            self.plan_quota_restores(scan, classes, &mut planned);
        } else {
            let all = planned.writes.len();
            planned
                .writes
                .retain(|w| w.step == WriteStep::Widen || mode.owns(&w.path));
            self.metrics.writes_held_back += (all - planned.writes.len()) as u64;
            #[cfg(debug_assertions)]
            {
                let before = self.parts.assignments.clone();
                self.assert_chain_is_full_plan(&before, scan, &planned, limits, mode);
            }
        }
        planned
    }

    /// Quotas the agent lifted earlier (its record, from the checkpoint) that are not to be
    /// lifted now (`--keep-cfs-quota` given since, the pin gone) and are still unlimited get
    /// their originals back: containers before their pods, so a pod's is never below a child's.
    fn plan_quota_restores(&self, scan: &Scan, classes: &[Class], planned: &mut Plan) {
        use crate::cgroupfs::{CpuSettings, FileValue, Quota};
        if self.parts.quota_lifted.is_empty() {
            return;
        }
        let lifted = crate::planner::quota_lifted_cgroups(
            scan,
            classes,
            &planned.parents,
            &planned.assignments,
            self.parts.keep_cfs_quota,
        );
        for (i, cgroup) in scan.cgroups.iter().enumerate().rev() {
            let Some(original) = self.parts.quota_lifted.get(&cgroup.path) else {
                continue;
            };
            let file = match &cgroup.cpu {
                CpuSettings::V1 {
                    cfs_quota: FileValue::Value(Quota::Unlimited),
                    ..
                } => InterfaceFile::CpuCfsQuotaUs,
                CpuSettings::V2 {
                    max: FileValue::Value(max),
                    ..
                } if max.quota == Quota::Unlimited => InterfaceFile::CpuMax,
                _ => continue,
            };
            if !lifted[i] {
                planned.writes.push(Step::new(
                    cgroup.path.clone(),
                    file,
                    original.clone(),
                    WriteStep::RestoreQuota,
                ));
            }
        }
    }

    /// Forgets the pin failures of containers no longer asking: neither entitled to exclusive
    /// cpus nor short of them (which may not know their entitlement but remember it).
    fn forget_met_pin_failures(&mut self, classes: &[Class], planned: &Plan) {
        let asking: HashSet<AssignmentKey> = classes
            .iter()
            .filter(|c| c.exclusive_cpus() > 0)
            .filter_map(|c| c.assignment_key())
            .chain(
                planned
                    .assignments
                    .iter()
                    .filter(|(_, a)| a.wanted.is_some())
                    .map(|(k, _)| k.clone()),
            )
            .collect();
        self.metrics.retain_pin_failures(|k| asking.contains(k));
        let before = self.said.refused.len();
        self.said.refused.retain(|k, _| asking.contains(k));
        self.said.refusals_changed |= self.said.refused.len() != before;
        self.metrics
            .retain_pod_rejections(|uid| planned.assignments.rejection(uid).is_some());
    }

    /// Makes a prefix of the plan's steps: every one, or, in a full pass of an agent that
    /// watches arrivals, the urgent ones and the rest held back while cgroups arrive or until a
    /// new arrival (see [`Budget`]). The plan's steps move into what it returns.
    fn write(&mut self, now: Instant, scan: &Scan, planned: &mut Plan, mode: &Mode) -> Executed {
        let bursting = self.deadlines.burst.bursting(now);
        let overdue = self.deadlines.held_back.overdue(now);
        // What arrived before now is planned from already, or waits for the next pass.
        let arrivals = self.arrivals.clone();
        arrivals.iter().for_each(Arrivals::forget);
        let arrived = move || arrivals.as_ref().is_some_and(Arrivals::arrived);
        let budget = match (
            self.arrivals.is_some() && mode.is_full(),
            bursting && !overdue,
        ) {
            (false, _) => Budget::All,
            (true, true) => Budget::UrgentOnly,
            (true, false) => Budget::Yield {
                after: if overdue { Burst::MIN_PROGRESS } else { 0 },
                arrived: &arrived,
            },
        };
        self.remember_quotas(scan, planned);
        let initialised = self.model.initialised(scan, now);
        let (new_children, initialised) = match self.parts.hierarchy.version {
            CgroupVersion::V1 => (NewChildren::LetThemSettle, &initialised[..]),
            CgroupVersion::V2 => (NewChildren::NarrowNow, &[][..]),
        };
        let known = Known::new(scan, &planned.parents, initialised);
        let plan = std::mem::take(&mut planned.writes);
        let executed = execute(&self.parts.hierarchy, plan, &known, new_children, budget);
        self.owe_held_back(now, executed.tally().held_back, mode);
        executed
    }

    /// Writes held back are owed: made once cgroups stop arriving, or at the limit. A full
    /// pass that held nothing back paid them (an incremental pass holds nothing back, and
    /// leaves what a full one held back to that one's flush).
    fn owe_held_back(&mut self, now: Instant, held_back: usize, mode: &Mode) {
        if held_back > 0 {
            let quiet = self.deadlines.burst.quiet_at(now);
            self.deadlines.held_back.owe(now, quiet);
            self.metrics.writes_held_back += held_back as u64;
        } else if mode.is_full() {
            self.deadlines.held_back.paid();
        }
    }

    /// Drift repaired: a cgroup whose value changed behind the agent's back and that a write
    /// made by this pass rewrote (a refused write repairs nothing).
    fn count_repairs(&mut self, drifted: &HashSet<CgroupPath>, executed: &Executed) {
        let repaired: HashSet<&CgroupPath> = executed
            .written()
            .filter(|w| matches!(w.step, WriteStep::Widen | WriteStep::Narrow))
            .filter(|w| drifted.contains(&w.path))
            .map(|w| &w.path)
            .collect();
        self.metrics.drift_repairs += repaired.len() as u64;
    }

    /// Counts the writes that failed and says each failure once; a narrowing the kernel
    /// refused because a child holds more is a race with a runtime, re-planned at once:
    /// counted as a retry and said once, not an error.
    fn say_write_failures(&mut self, executed: &Executed) {
        let mut refused_empty: HashSet<&CgroupPath> = HashSet::new();
        for done in &executed.done {
            let write = &done.step;
            match &done.outcome {
                Outcome::RefusedEmpty {
                    error,
                    parent: Some(parent),
                } => {
                    self.say_refused_empty(write, error, parent);
                    refused_empty.insert(&write.path);
                }
                Outcome::RefusedEmpty { error, .. } => self.say_refused(write, error, None),
                Outcome::Refused { error, blocks } => {
                    self.metrics.narrowings_blocked += u64::from(blocks.is_some());
                    self.say_refused(write, error, blocks.as_ref());
                }
                Outcome::ChildInTheWay {
                    refused: Some(error),
                    ..
                } => {
                    let errno = error.errno().unwrap_or(0);
                    *self.metrics.write_retries.entry(errno).or_default() += 1;
                    if self.metrics.first_failure(&write.path, write.file, errno) {
                        log::info!("{} (a child holds more: re-planning)", error_chain(error));
                    }
                }
                Outcome::ChildInTheWay {
                    child: Some(child), ..
                } => log::debug!(
                    "cg={} not narrowed yet: {child}, which this pass did not plan, holds more",
                    write.path
                ),
                _ => {}
            }
        }
        self.metrics.narrowings_blocked += refused_empty.len() as u64;
    }

    /// A write the kernel refused, counted and said once; `blocks`: the parent whose narrowing
    /// waits for it.
    fn say_refused(&mut self, write: &Step, error: &CgroupError, blocks: Option<&CgroupPath>) {
        let errno = error.errno().unwrap_or(0);
        *self.metrics.write_errors.entry(errno).or_default() += 1;
        if !self.metrics.first_failure(&write.path, write.file, errno) {
            return;
        }
        log::warn!("{}", error_chain(error));
        if let Some(parent) = blocks {
            log::warn!(
                "cg={parent} cannot be narrowed while its child {} holds more and cannot be \
                 written: make {} writable by root without capabilities (chown it to \
                 root) or remove it if it is empty; retried at each reconcile",
                write.path,
                write.path
            );
        }
    }

    /// A write refused to an empty cgroup (v1) that its `parent` is narrowed past: counted,
    /// and said once per cgroup (its cpus and mems fail alike).
    fn say_refused_empty(&mut self, write: &Step, error: &CgroupError, parent: &CgroupPath) {
        let errno = error.errno().unwrap_or(0);
        *self.metrics.write_errors.entry(errno).or_default() += 1;
        if self
            .metrics
            .first_failure(&write.path, InterfaceFile::CpusetCpus, errno)
        {
            log::warn!(
                "{}: cg={} is empty, so no task runs in it and its parent {parent} is \
                 narrowed past it; make it writable by root without capabilities \
                 (chown it to root) or remove it; retried at each reconcile",
                error_chain(error),
                write.path,
            );
        }
    }

    /// The model takes what the writes showed: each cgroup keeps the cpus the plan wants there
    /// (for drift detection and pin latency) and holds what was written, and cgroups a write
    /// found gone leave it (what they held, an exclusive set perhaps, is released by the next
    /// plan; their own removal event finds nothing to do). Each write comes back from the
    /// watcher as an `IN_MODIFY` whose re-read shows the written value (no further pass) or,
    /// when someone wrote after the agent, theirs: drift, repaired by the next pass. A cgroup
    /// written is as new as the write (`written_at`): a full scan that started before it may
    /// have read the old value, and does not replace it. Returns whether a cgroup vanished.
    fn take_written(
        &mut self,
        written_at: Instant,
        scan: &Scan,
        planned: &Plan,
        executed: &Executed,
        mode: &Mode,
    ) -> bool {
        let mut desired = planned.desired.iter();
        for_each_entry(&mut self.model, scan, |_, entry| {
            let wanted = &desired.next().expect("one desired set per cgroup").cpus;
            if let Some(entry) = entry.filter(|e| e.desired != *wanted) {
                entry.desired.clone_from(wanted);
            }
        });
        if executed.written().next().is_some() {
            self.bump();
        }
        for write in executed.written() {
            if let Some(entry) = self.model.get_mut(&write.path) {
                entry.cgroup.assume_written(write.file, &write.value);
                entry.updated = written_at;
            }
        }
        // A chain's ancestors' narrowings wait for the full pass: until then what they hold
        // is what is wanted there, not drift.
        for cgroup in scan.cgroups.iter().filter(|c| !mode.owns(&c.path)) {
            if let Some(entry) = self.model.get_mut(&cgroup.path) {
                entry.desired = entry.cgroup.cpus.configured().cloned();
            }
        }
        let mut vanished = false;
        for gone in executed.with(|o| matches!(o, Outcome::Gone)) {
            vanished |= self.remove_subtree(&gone.path);
        }
        vanished
    }

    /// The containers the metrics count, and the isolation annotations of those that ask
    /// for some (a full pass counts them all again; a chain adds its new ones).
    fn count_containers(&mut self, scan: &Scan, classes: &[Class], mode: &Mode) {
        let containers = classes
            .iter()
            .zip(&scan.cgroups)
            .filter(|(c, g)| {
                c.kind == CgroupKind::Container
                    && (mode.is_full() || self.since_pass.new.contains(&g.path))
            })
            .count() as u64;
        if mode.is_full() {
            self.metrics.containers = containers;
            self.model.isolated.clear();
        } else {
            self.metrics.containers += containers;
        }
        for (class, cgroup) in classes.iter().zip(&scan.cgroups) {
            if class.kind != CgroupKind::Container || !class.isolation.any() {
                continue;
            }
            if let Some(key) = class.assignment_key() {
                self.model
                    .isolated
                    .insert(key, (class.isolation, cgroup.path.clone()));
            }
        }
    }

    /// The pass's assignments and pools become the controller's; what the next pass may
    /// assume is recorded: whether the tree settled, whether an incremental pass may plan new
    /// pods alone, how many cgroups are on the shared pool.
    fn record_pass(
        &mut self,
        planned: Plan,
        executed: &Executed,
        classes: &[Class],
        mode: &Mode,
    ) -> PassOutcome {
        self.forget_restored_quotas(executed);
        let changed = planned.assignments != self.parts.assignments
            || executed
                .done
                .iter()
                .any(|d| matches!(d.step.step, WriteStep::LiftQuota | WriteStep::RestoreQuota));
        let report: Tally = executed.tally();
        let reserved = self.parts.policy.as_ref().map(|p| p.reserved());
        self.metrics
            .record_pass(&planned, &report, &self.parts.topology, reserved, classes);
        let unmet = planned.events.iter().any(|e| {
            matches!(
                e,
                AssignEvent::Failed { .. }
                    | AssignEvent::Short { .. }
                    | AssignEvent::PodRejected { .. }
            )
        });
        let settled = report.is_clean()
            && report.held_back == 0
            && report.skipped == 0
            && report.gone == 0
            && !unmet;
        // Only a full pass says the whole tree is settled; an incremental one can only say it
        // is not (a write a full pass could not make is retried by the next reconcile).
        self.last_pass.settled = settled && (mode.is_full() || self.last_pass.settled);
        if unmet {
            // Someone waits for CPUs: only a full pass plans for them.
            self.last_pass.steady = false;
        }
        if mode.is_full() {
            let shared = planned.pools.as_ref().map(|p| &p.shared);
            self.last_pass.shared_members = planned
                .desired
                .iter()
                .filter(|d| d.cpus_to_write().is_some() && d.cpus.as_ref() == shared)
                .count();
            self.last_pass.steady = self.model.complete
                && !unmet
                && classes.iter().all(|c| {
                    c.kind != CgroupKind::Container
                        || !matches!(entitlement(c), Entitlement::Unknown { .. })
                });
        }
        self.parts.assignments = planned.assignments;
        // The pods' names go into the checkpoint with their pins (for the log after a restart).
        self.parts
            .assignments
            .name_pods(&self.said.pod_names, changed);
        self.last_pass.pools = planned.pools;
        self.last_pass.planned = true;
        PassOutcome {
            assignments_changed: changed,
            writes: report.written,
            failed_writes: report.failed,
        }
    }

    /// A quota put back has nothing left to restore.
    fn forget_restored_quotas(&mut self, executed: &Executed) {
        for write in executed.written() {
            if write.step == WriteStep::RestoreQuota {
                self.parts.quota_lifted.remove(&write.path);
            }
        }
    }

    /// Records the value each quota lift overwrites, so `reset` can put it back.
    /// A quota someone set again after the lift (an in-place resize) is theirs: the value from
    /// before the lift is forgotten, and a new lift records the new one.
    pub(super) fn remember_quotas(&mut self, scan: &Scan, planned: &Plan) {
        use crate::cgroupfs::{CpuSettings, FileValue, Quota};
        let model = &self.model;
        self.parts.quota_lifted.retain(|path, _| {
            let quota_set = match model.get(path).map(|e| &e.cgroup.cpu) {
                Some(CpuSettings::V1 { cfs_quota, .. }) => {
                    matches!(cfs_quota, FileValue::Value(Quota::Micros(_)))
                }
                Some(CpuSettings::V2 { max, .. }) => {
                    matches!(max, FileValue::Value(m) if m.quota != Quota::Unlimited)
                }
                None => false,
            };
            !quota_set
        });
        let lifts = planned
            .writes
            .iter()
            .filter(|w| w.step == WriteStep::LiftQuota);
        let mut scanned: Option<HashMap<&CgroupPath, &ScannedCgroup>> = None;
        for w in lifts {
            let scanned =
                scanned.get_or_insert_with(|| scan.cgroups.iter().map(|c| (&c.path, c)).collect());
            let Some(cgroup) = scanned.get(&w.path) else {
                continue;
            };
            let original = match &cgroup.cpu {
                CpuSettings::V1 {
                    cfs_quota: FileValue::Value(Quota::Micros(us)),
                    ..
                } => us.to_string(),
                CpuSettings::V2 {
                    max: FileValue::Value(max),
                    ..
                } if max.quota != Quota::Unlimited => max.to_string(),
                _ => continue,
            };
            self.parts.quota_lifted.insert(w.path.clone(), original);
        }
    }
}
