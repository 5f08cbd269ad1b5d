//! A plan and its writes: what is urgent, what may wait, what the writes showed of the model.

use super::model::for_each_entry;
use super::*;
use crate::cgroupfs::{CgroupError, CpuSettings, FileValue, Quota, ScannedCgroup};
use crate::planner::{Known, Step};
use crate::writer::{execute, Budget, Done, Executed, Outcome, Tally};

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
        let mut executed = self.write(now, &scan, &mut planned, &mode);
        // Narrowings held up below the scan's depth limit: planned again (stale), after the
        // planner's steps for what is there.
        crate::writer::narrow_unseen(&self.parts.hierarchy, &mut executed);
        let written_at = Instant::now();
        self.take_desired(&scan, &planned, &mode);
        let follow_up = self.take_outcomes(&executed.done, &drifted, written_at);
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
            if let (false, Some((file, None))) = (lifted[i], quota(&cgroup.cpu)) {
                let (path, value) = (cgroup.path.clone(), original.clone());
                let step = Step::new(path, file, value, WriteStep::RestoreQuota);
                planned.writes.push(step);
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
        // Whoever drains the event channel forgets the arrivals first (the agent's loop): a token
        // still here means an event waits in the channel, even one that came while this pass
        // was planned, or before a pass no event started (a deadline's, a reconcile's).
        let arrivals = self.arrivals.clone();
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

    /// What each step's outcome shows, in one table: a write is taken into the model (see
    /// [`Controller::take_desired`]) and repairs drift where its cgroup drifted, a quota put
    /// back has nothing left to restore; a cgroup gone leaves the model (what it held is
    /// released by the next plan); a child in the way (known or below the scan's depth limit)
    /// has the cgroup re-read and planned again now, a new child a moment later; a refusal is
    /// counted and said once. Each write comes back from the watcher as an `IN_MODIFY` whose
    /// re-read shows the written value (no further pass) or someone else's: drift, repaired by
    /// the next pass. A cgroup written is as new as the write (`written_at`): a full scan that
    /// started before it may have read the old value, and does not replace it.
    fn take_outcomes(
        &mut self,
        done: &[Done],
        drifted: &HashSet<CgroupPath>,
        written_at: Instant,
    ) -> FollowUp {
        let mut follow_up = FollowUp::default();
        let (mut repaired, mut past_empty) = (HashSet::new(), HashSet::new());
        if done.iter().any(|d| matches!(d.outcome, Outcome::Written)) {
            self.bump();
        }
        for Done { step, outcome } in done {
            let path = &step.path;
            match outcome {
                Outcome::Written => {
                    if drifted.contains(path)
                        && matches!(step.step, WriteStep::Widen | WriteStep::Narrow)
                    {
                        repaired.insert(path);
                    }
                    if step.step == WriteStep::RestoreQuota {
                        self.parts.quota_lifted.remove(path);
                    }
                    if let Some(entry) = self.model.get_mut(path) {
                        entry.cgroup.assume_written(step.file, &step.value);
                        entry.updated = written_at;
                    }
                }
                Outcome::Gone => follow_up.vanished |= self.remove_subtree(path),
                Outcome::ChildInTheWay { child, refused } => {
                    self.say_stale(step, child.as_ref(), refused.as_ref());
                    follow_up.stale.push(path.clone());
                }
                Outcome::UnseenInTheWay { .. } => follow_up.stale.push(path.clone()),
                Outcome::Settling => follow_up.settling.push(path.clone()),
                Outcome::Refused { error, blocks } => {
                    self.metrics.narrowings_blocked += u64::from(blocks.is_some());
                    self.say_refused(step, error, blocks.as_ref(), false);
                }
                Outcome::RefusedEmpty { error, parent } => {
                    if parent.is_some() {
                        past_empty.insert(path);
                    }
                    self.say_refused(step, error, parent.as_ref(), true);
                }
                Outcome::UnderGone
                | Outcome::Skipped
                | Outcome::LeftToRuntime
                | Outcome::HeldBack => {}
            }
        }
        self.metrics.drift_repairs += repaired.len() as u64;
        self.metrics.narrowings_blocked += past_empty.len() as u64;
        follow_up
    }

    /// A narrowing a child holds up: one the kernel refused (EBUSY) is a race with a runtime,
    /// re-planned at once: counted as a retry and said once, not an error.
    fn say_stale(
        &mut self,
        step: &Step,
        child: Option<&CgroupPath>,
        refused: Option<&CgroupError>,
    ) {
        if let Some(error) = refused {
            let errno = error.errno().unwrap_or(0);
            *self.metrics.write_retries.entry(errno).or_default() += 1;
            if self.metrics.first_failure(&step.path, step.file, errno) {
                log::info!("{} (a child holds more: re-planning)", error_chain(error));
            }
        } else if let Some(child) = child {
            log::debug!(
                "cg={} not narrowed yet: {child}, which this pass did not plan, holds more",
                step.path
            );
        }
    }

    /// A write the kernel refused, counted and said once. `parent`: the parent whose narrowing
    /// waits for it, or (`empty`: a v1 cgroup never set up, whose cpus and mems fail alike and
    /// are said once) that is narrowed past it.
    fn say_refused(
        &mut self,
        step: &Step,
        error: &CgroupError,
        parent: Option<&CgroupPath>,
        empty: bool,
    ) {
        let errno = error.errno().unwrap_or(0);
        *self.metrics.write_errors.entry(errno).or_default() += 1;
        let (path, past) = (&step.path, parent.filter(|_| empty));
        let file = past.map_or(step.file, |_| InterfaceFile::CpusetCpus);
        if !self.metrics.first_failure(path, file, errno) {
            return;
        }
        let fix = "writable by root without capabilities (chown it to root)";
        match (parent, past) {
            (_, Some(parent)) => log::warn!(
                "{}: cg={path} is empty, so no task runs in it and its parent {parent} is \
                 narrowed past it; make it {fix} or remove it; retried at each reconcile",
                error_chain(error),
            ),
            (Some(parent), None) => {
                log::warn!("{}", error_chain(error));
                log::warn!(
                    "cg={parent} cannot be narrowed while its child {path} holds more and \
                     cannot be written: make {path} {fix} or remove it if it is empty; retried \
                     at each reconcile"
                );
            }
            (None, None) => log::warn!("{}", error_chain(error)),
        }
    }

    /// Each cgroup keeps the cpus the plan wants there (for drift detection and pin latency);
    /// a chain's ancestors' narrowings wait for the full pass: until then what they hold is
    /// what is wanted there, not drift.
    fn take_desired(&mut self, scan: &Scan, planned: &Plan, mode: &Mode) {
        let mut desired = planned.desired.iter();
        for_each_entry(&mut self.model, scan, |_, entry| {
            let wanted = &desired.next().expect("one desired set per cgroup").cpus;
            if let Some(entry) = entry.filter(|e| e.desired != *wanted) {
                entry.desired.clone_from(wanted);
            }
        });
        for cgroup in scan.cgroups.iter().filter(|c| !mode.owns(&c.path)) {
            if let Some(entry) = self.model.get_mut(&cgroup.path) {
                entry.desired = entry.cgroup.cpus.configured().cloned();
            }
        }
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
        let settled = report.all_written() && !unmet;
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

    /// Records the value each quota lift overwrites, so `reset` can put it back.
    /// A quota someone set again after the lift (an in-place resize) is theirs: the value from
    /// before the lift is forgotten, and a new lift records the new one.
    pub(super) fn remember_quotas(&mut self, scan: &Scan, planned: &Plan) {
        let model = &self.model;
        self.parts.quota_lifted.retain(|path, _| {
            let cpu = model.get(path).map(|e| &e.cgroup.cpu);
            !matches!(cpu.and_then(quota), Some((_, Some(_))))
        });
        let lifts = planned
            .writes
            .iter()
            .filter(|w| w.step == WriteStep::LiftQuota);
        let mut scanned: Option<HashMap<&CgroupPath, &ScannedCgroup>> = None;
        for w in lifts {
            let scanned =
                scanned.get_or_insert_with(|| scan.cgroups.iter().map(|c| (&c.path, c)).collect());
            let original = scanned.get(&w.path).and_then(|c| quota(&c.cpu));
            if let Some((_, Some(original))) = original {
                self.parts.quota_lifted.insert(w.path.clone(), original);
            }
        }
    }
}

/// A cgroup's CFS quota file, and the quota it holds (`None`: unlimited); `None` when unread.
fn quota(cpu: &CpuSettings) -> Option<(InterfaceFile, Option<String>)> {
    match cpu {
        CpuSettings::V1 {
            cfs_quota: FileValue::Value(quota),
            ..
        } => Some((
            InterfaceFile::CpuCfsQuotaUs,
            match quota {
                Quota::Micros(us) => Some(us.to_string()),
                Quota::Unlimited => None,
            },
        )),
        CpuSettings::V2 {
            max: FileValue::Value(max),
            ..
        } => Some((
            InterfaceFile::CpuMax,
            (max.quota != Quota::Unlimited).then(|| max.to_string()),
        )),
        _ => None,
    }
}
