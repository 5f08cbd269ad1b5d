//! A plan and its writes: what is urgent, what may wait, what the writes showed of the model,
//! and what the pass tells (its events said and counted, the event → pin latency).

use super::*;
use crate::planner::Known;
use crate::writer::{execute, Done, Executed, Outcome, Tally};

impl Controller {
    /// What the planner is given besides the tree.
    pub(super) fn plan_config<'a>(&'a self, limits: &'a NodeLimits) -> PlanConfig<'a> {
        PlanConfig {
            topology: &self.parts.topology,
            policy: self.parts.policy.as_ref(),
            align_memory: self.parts.align_memory,
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
        // Urgent steps first where the writes may be held back (see `write`), or where a
        // chain makes the shared pool's rewrites after its pins.
        let urgent = if self.arrivals.is_some() && mode.plans_pool() {
            planned.urgent_first(&scan, &drifted)
        } else {
            Vec::new()
        };
        let mut executed = self.write(now, &scan, &mut planned, &mode);
        // Narrowings held up below the scan's depth limit: planned again (stale), after the
        // planner's steps for what is there.
        crate::writer::narrow_unseen(&self.parts.hierarchy, &mut executed);
        let written_at = Instant::now();
        // A chain's ancestors' narrowings wait for the full pass (see `Model::take_desired`).
        self.model.take_desired(&scan, &planned.desired, &mode);
        let follow_up = self.take_outcomes(&executed.done, &drifted, written_at);
        let urgent_done = executed.urgent_done.unwrap_or(written_at);
        // Event → pin latency of the new containers' pins that landed.
        let pinned_at = |i| match urgent.get(i) {
            Some(true) => urgent_done,
            _ => written_at,
        };
        let metrics = &mut self.metrics;
        let record = |latency| metrics.event_to_pin.record(latency);
        self.model.time_pins(&scan, &classes, pinned_at, record);
        if mode.is_full() {
            // Containers whose CPU settings are not readable yet: a few bounded re-reads.
            let waiting = classes
                .iter()
                .map(|c| c.kind == CgroupKind::Container && model::waits_for_settings(c));
            self.deadlines.settings = self.model.track_settings(&scan, waiting, now);
        }
        self.count_containers(&scan, &classes, &planned.assignments, &mode);
        self.track_pool_members((&scan, &classes), &planned, &mode);
        let mut outcome = self.record_pass(planned, &executed, &classes, &mode);
        let cpu_shared = self.model.cpu_shared(&self.parts.assignments);
        self.metrics.cpu_shared_containers = cpu_shared as u64;
        // The checkpoint keeps the refusals `status` shows.
        outcome.assignments_changed |= std::mem::take(&mut self.said.refusals_changed);
        (outcome, follow_up)
    }

    /// The plan of `scan`. An incremental pass writes in its pods, and widens their ancestors
    /// (top-down, before the pods: a pool that grew reaches a new pod through them); the
    /// ancestors' narrowings (the shared pool's) wait for the full pass, with the rest of the
    /// pool's members, whose sets hold them up, unless the pass plans those members itself
    /// ([`Mode::plans_pool`]: few, on cgroup v2 with inheritance).
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
        if !mode.is_full() {
            let all = planned.writes.len();
            planned.writes.retain(|w| mode.makes(w));
            self.metrics.writes_held_back += (all - planned.writes.len()) as u64;
            #[cfg(debug_assertions)]
            {
                let whole = self.model_scan();
                let classes = self.classify_model(&whole);
                let (assignments, config) = (&self.parts.assignments, self.plan_config(limits));
                let full = plan(&whole, &classes, assignments, &config);
                let check = crate::planner::chain::assert_chain_is_full_plan;
                check((scan, &planned), (&whole, &full), mode);
            }
        }
        planned
    }

    /// Counts each assignment event in the metrics and says it in the log (see
    /// [`Said::events`]).
    fn log_events(&mut self, events: &[AssignEvent], classes: &[Class]) {
        let policy = self.parts.policy.as_ref();
        let full_cores = policy.is_some_and(|p| p.options().full_pcpus_only);
        let how = (full_cores, &self.parts.topology);
        self.said.events(events, classes, &mut self.metrics, how);
    }

    /// Forgets the pin failures of containers no longer asking: neither entitled to exclusive
    /// cpus nor short of them (which may not know their entitlement but remember it).
    fn forget_met_pin_failures(&mut self, classes: &[Class], planned: &Plan) {
        let asking = planned.asking(classes);
        self.metrics.retain_pin_failures(|k| asking.contains(k));
        self.said.forget_refusals(|k| asking.contains(k));
        self.metrics
            .retain_pod_rejections(|uid| planned.assignments.rejection(uid).is_some());
    }

    /// Makes a prefix of the plan's steps: every one, or, in a full pass of an agent that
    /// watches arrivals, the urgent ones and the rest held back while cgroups arrive or until a
    /// new arrival (see [`Deadlines::budget`]). The plan's steps move into what it returns.
    fn write(&mut self, now: Instant, scan: &Scan, planned: &mut Plan, mode: &Mode) -> Executed {
        // Whoever drains the event channel forgets the arrivals first (the agent's loop): a token
        // still here means an event waits in the channel, even one that came while this pass
        // was planned, or before a pass no event started (a deadline's, a reconcile's).
        let arrivals = self.arrivals.clone();
        let arrived = move || arrivals.as_ref().is_some_and(Arrivals::arrived);
        let watching = self.arrivals.is_some() && mode.is_full();
        let arrived = watching.then_some(&arrived as &dyn Fn() -> bool);
        let budget = self.deadlines.budget(now, arrived);
        let initialised = self.model.initialised(scan, now);
        let (new_children, initialised) = match self.parts.hierarchy.version {
            CgroupVersion::V1 => (NewChildren::LetThemSettle, &initialised[..]),
            CgroupVersion::V2 => (NewChildren::NarrowNow, &[][..]),
        };
        let alone = mode.alone();
        // The children the model knows of the pool's members narrowed alone.
        let narrowed = |p: &&CgroupPath| {
            let mut steps = planned.writes.iter();
            steps.any(|s| s.path == **p && s.step == WriteStep::Narrow)
        };
        let alone = alone.iter().filter(narrowed);
        let children = alone.map(|p| (p.clone(), self.model.child_names(p)));
        let children = children.collect();
        let known = Known::new(scan, &planned.parents, initialised).with_children(&children);
        let plan = std::mem::take(&mut planned.writes);
        let executed = execute(&self.parts.hierarchy, plan, &known, new_children, budget);
        let held_back = executed.tally().held_back;
        self.deadlines
            .held_back_writes(now, held_back, mode.is_full());
        self.metrics.writes_held_back += held_back as u64;
        executed
    }

    /// What each step's outcome shows, in one table: a write is taken into the model (see
    /// [`Model::written`]) and repairs drift where its cgroup drifted; a cgroup gone leaves the model (what it held is
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
                    self.model.written(step, written_at);
                }
                Outcome::Gone => follow_up.vanished |= self.remove_subtree(path),
                Outcome::ChildInTheWay { child, refused } => {
                    self.metrics
                        .count_stale(step, child.as_ref(), refused.as_ref());
                    follow_up.stale.push(path.clone());
                }
                Outcome::UnseenInTheWay { .. } => follow_up.stale.push(path.clone()),
                Outcome::Settling => follow_up.settling.push(path.clone()),
                Outcome::Refused { error, blocks } => {
                    self.metrics.narrowings_blocked += u64::from(blocks.is_some());
                    self.metrics
                        .count_refused(step, error, blocks.as_ref(), false);
                }
                Outcome::RefusedEmpty { error, parent } => {
                    if parent.is_some() {
                        past_empty.insert(path);
                    }
                    self.metrics
                        .count_refused(step, error, parent.as_ref(), true);
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

    /// The containers the metrics count, and the isolation annotations of those that ask
    /// for some or hold exclusive cpus in `assignments`, for the host effects (a full pass
    /// counts them all again; a chain adds its new ones).
    fn count_containers(
        &mut self,
        scan: &Scan,
        classes: &[Class],
        assignments: &Assignments,
        mode: &Mode,
    ) {
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
        } else {
            self.metrics.containers += containers;
        }
        self.model
            .index_isolated(scan, classes, assignments, mode.is_full());
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
        let changed = planned.assignments != self.parts.assignments;
        let report: Tally = executed.tally();
        let reserved = self.parts.policy.as_ref().map(|p| p.reserved());
        self.metrics
            .record_pass(&planned, &report, &self.parts.topology, reserved, classes);
        let unmet = planned.unmet();
        let settled = report.all_written() && !unmet;
        // Only a full pass says the whole tree is settled; an incremental one can only say it
        // is not (a write a full pass could not make is retried by the next reconcile).
        self.last_pass.settled = settled && (mode.is_full() || self.last_pass.settled);
        if unmet {
            // Someone waits for CPUs: only a full pass plans for them.
            self.last_pass.steady = false;
        }
        if mode.is_full() {
            self.last_pass.shared_members = planned.shared_members();
            let decided = !classes.iter().any(|c| undecided(c));
            self.last_pass.steady = self.model.complete && !unmet && decided;
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
}
