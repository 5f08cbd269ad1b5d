//! Every timer of the controller, in one place: the agent's loop sleeps until [`Deadlines::next`]
//! (or an event), then the controller's `on_deadlines` does what is due. How the controller
//! paces itself through a burst of arrivals is [`Burst`]'s. Plain values and instants: nothing
//! here reads the tree or knows the controller.

use std::time::{Duration, Instant};

use crate::cgroupfs::CgroupPath;
use crate::writer::Budget;

/// A burst of new cgroups (pods starting one after the other), and the constants that pace
/// the controller through one: while new cgroups keep arriving less than [`Burst::QUIET`]
/// apart, a pass makes only its urgent writes (exclusive pins, drift repairs) and holds back
/// the rest (the shared pool's rewrites, an incremental pass's full pass: [`Owed`]), so a burst
/// of pods does not rewrite every shared cgroup once per pod; held back for at most
/// [`Burst::LIMIT`], then [`Burst::MIN_PROGRESS`] writes a pass before a new arrival may go
/// first. A narrowing that waits for new children to be set up is planned again after each of
/// [`Burst::SETTLE_DELAYS`] ([`Settling`]).
#[derive(Debug, Default)]
pub(crate) struct Burst {
    /// When the last cgroup new to the model (after the first pass) was seen.
    last_arrival: Option<Instant>,
}

impl Burst {
    /// Arrivals less than this apart are one burst.
    pub(crate) const QUIET: Duration = Duration::from_millis(20);
    /// Writes are held back for at most this long. (kubelet leaves other containers' cpusets
    /// to its reconcile loop, 10 s by default.)
    pub(crate) const LIMIT: Duration = Duration::from_millis(200);
    /// Held-back writes a pass makes before it may be preempted, once they are overdue.
    pub(crate) const MIN_PROGRESS: usize = 32;
    /// The shared pool's members (cgroups that hold some of it in a set of their own) are few
    /// when at most this many: an incremental pass then plans and rewrites them itself, after
    /// its pins, instead of leaving them to a coalesced full pass. On cgroup v2 with
    /// inheritance they are the QoS cgroups and the non-exclusive members of Guaranteed pods;
    /// where every shared container holds a set of its own (v1) they are many, and a burst's
    /// rewrites stay coalesced.
    pub(crate) const FEW_POOL_MEMBERS: usize = 16;
    /// How long a cgroup's narrowing waits, again and again, for runtimes to set up its new
    /// children (to copy its cpuset into them: a read and a write, microseconds apart unless
    /// the runtime is descheduled). After the last, the next event or reconcile tick tries
    /// again.
    pub(crate) const SETTLE_DELAYS: [Duration; 6] = [
        Duration::from_millis(5),
        Duration::from_millis(20),
        Duration::from_millis(50),
        Duration::from_millis(200),
        Duration::from_millis(500),
        Duration::from_millis(1000),
    ];

    /// A cgroup new to the model arrived at `now`.
    pub(crate) fn arrived(&mut self, now: Instant) {
        self.last_arrival = Some(now);
    }

    /// New cgroups are arriving: the last less than [`Burst::QUIET`] before `now`.
    pub(crate) fn bursting(&self, now: Instant) -> bool {
        self.last_arrival
            .is_some_and(|t| now.saturating_duration_since(t) < Burst::QUIET)
    }

    /// When the burst is over if nothing else arrives (`now` when none came).
    pub(crate) fn quiet_at(&self, now: Instant) -> Instant {
        self.last_arrival.map_or(now, |t| t + Burst::QUIET)
    }
}

/// Work owed for later and coalesced: due when things have been quiet a while
/// ([`Burst::QUIET`]), and at most [`Burst::LIMIT`] after it was first owed.
#[derive(Debug, Default)]
pub(crate) struct Owed {
    since: Option<Instant>,
    due: Option<Instant>,
}

impl Owed {
    /// Owes the work (again) at `now`: due at `quiet` (the end of the current quiet wait), or
    /// at the limit if that comes first.
    pub(crate) fn owe(&mut self, now: Instant, quiet: Instant) {
        let since = *self.since.get_or_insert(now);
        self.due = Some(quiet.min(since + Burst::LIMIT));
    }

    /// The work was done: nothing is owed.
    pub(crate) fn paid(&mut self) {
        *self = Owed::default();
    }

    /// Something is owed (its due time may have been taken already).
    pub(crate) fn is_owed(&self) -> bool {
        self.since.is_some()
    }

    /// It has waited for [`Burst::LIMIT`]: it must make progress now.
    pub(crate) fn overdue(&self, now: Instant) -> bool {
        self.since
            .is_some_and(|t| now.saturating_duration_since(t) >= Burst::LIMIT)
    }

    pub(crate) fn due(&self) -> Option<Instant> {
        self.due
    }

    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.due.is_some_and(|t| t <= now)
    }
}

/// Cgroups whose narrowing waits for runtimes to set up their new children: planned again after
/// each of [`Burst::SETTLE_DELAYS`] in turn while the tree stays unsettled.
#[derive(Debug, Default)]
pub(crate) struct Settling {
    roots: Vec<CgroupPath>,
    at: Option<Instant>,
    tries: usize,
}

impl Settling {
    /// After a pass: `roots` wait for their children, and the pass is planned again `later`
    /// (not: the tree settled, and the next wait starts again from the shortest delay).
    pub(crate) fn wait_for(&mut self, roots: Vec<CgroupPath>, later: bool, now: Instant) {
        self.at = None;
        if !later {
            self.tries = 0;
        } else if let Some(delay) = Burst::SETTLE_DELAYS.get(self.tries) {
            self.at = Some(now + *delay);
        }
        self.roots = roots;
    }

    /// The roots to re-read and plan again, once due; the next wait is longer (only retries
    /// that find the tree still unsettled wait longer next time).
    pub(crate) fn take_due(&mut self, now: Instant) -> Option<Vec<CgroupPath>> {
        if self.at.is_none_or(|t| t > now) {
            return None;
        }
        self.at = None;
        self.tries += 1;
        Some(std::mem::take(&mut self.roots))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}

/// The controller's timers.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    /// Re-read the containers that wait for their CPU settings (see the controller's `SETTINGS_RETRY`).
    pub(crate) settings: Option<Instant>,
    /// Plan again the cgroups whose narrowing waits for new children.
    pub(crate) settling: Settling,
    /// The writes a full pass held back while new cgroups arrived (the shared pool's rewrites).
    pub(crate) held_back: Owed,
    /// The full pass owed after incremental passes changed the shared pool.
    pub(crate) full_pass: Owed,
    /// Repair the first fought-over cgroup whose backoff ends (see the controller's `drift`).
    pub(crate) fight: Option<Instant>,
    /// The current burst of arrivals (no deadline of its own: it paces the two above).
    pub(crate) burst: Burst,
    /// The projection files (see the controller's `projections_due`; not among [`Deadlines::next`]:
    /// the agent's loop asks for them on their own).
    pub(crate) projection: Projection,
}

/// When the projection files are to be brought up to date.
#[derive(Debug, Default)]
pub(crate) struct Projection {
    /// A pass or reconcile ran since they were last brought up to date.
    pub(crate) due: bool,
    /// When they were last brought up to date.
    pub(crate) at: Option<Instant>,
}

impl Projection {
    /// The shortest time between two updates of the projection files while passes keep coming.
    pub(crate) const INTERVAL: Duration = Duration::from_millis(20);

    /// When they are owed (a pass ran since, or the last update stopped early): at most every
    /// [`Projection::INTERVAL`], so a stream of passes walks the model for them that often at
    /// most.
    pub(crate) fn due_at(&self, now: Instant) -> Option<Instant> {
        self.due
            .then(|| self.at.map_or(now, |at| at + Projection::INTERVAL))
    }

    /// An update starts at `now` if they are due by then (no longer owed: an update that stops
    /// early owes them again); whether it does.
    pub(crate) fn start(&mut self, now: Instant) -> bool {
        if self.due_at(now).is_none_or(|at| at > now) {
            return false;
        }
        self.due = false;
        self.at = Some(now);
        true
    }
}

impl Deadlines {
    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        [
            self.settings,
            self.settling.at,
            self.held_back.due(),
            self.full_pass.due(),
            self.fight,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// A pass held back `n` writes at `now`: they are owed, made once cgroups stop arriving,
    /// or at the limit. A full pass (`full`) that held nothing back paid them (an incremental
    /// pass holds nothing back, and leaves what a full one held back to that one's flush).
    pub(crate) fn held_back_writes(&mut self, now: Instant, n: usize, full: bool) {
        if n > 0 {
            let quiet = self.burst.quiet_at(now);
            self.held_back.owe(now, quiet);
        } else if full {
            self.held_back.paid();
        }
    }

    /// How much of a full pass's plan to make at `now`, for an agent that watches arrivals
    /// (`arrived`: whether something new arrived; `None`: every step, in plan order): during a
    /// burst the urgent steps only, the rest held back; after it the rest too, until something
    /// new arrives (once the held-back writes are overdue, [`Burst::MIN_PROGRESS`] of them
    /// first).
    pub(crate) fn budget<'a>(
        &self,
        now: Instant,
        arrived: Option<&'a dyn Fn() -> bool>,
    ) -> Budget<'a> {
        let overdue = self.held_back.overdue(now);
        match arrived {
            None => Budget::All,
            Some(_) if self.burst.bursting(now) && !overdue => Budget::UrgentOnly,
            Some(arrived) => Budget::Yield {
                after: if overdue { Burst::MIN_PROGRESS } else { 0 },
                arrived,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_makes_the_urgent_writes_only_until_the_held_back_ones_are_overdue() {
        let t0 = Instant::now();
        let mut deadlines = Deadlines::default();
        let arrived: &dyn Fn() -> bool = &|| false;
        assert!(matches!(deadlines.budget(t0, None), Budget::All));
        let yields = |b: Budget<'_>| match b {
            Budget::Yield { after, .. } => Some(after),
            _ => None,
        };
        assert_eq!(yields(deadlines.budget(t0, Some(arrived))), Some(0));
        deadlines.burst.arrived(t0);
        let during = deadlines.budget(t0, Some(arrived));
        assert!(matches!(during, Budget::UrgentOnly));
        deadlines.held_back_writes(t0, 3, false);
        assert_eq!(deadlines.held_back.due(), Some(t0 + Burst::QUIET));
        let overdue = deadlines.budget(t0 + Burst::LIMIT, Some(arrived));
        assert_eq!(yields(overdue), Some(Burst::MIN_PROGRESS));
        // An incremental pass that held nothing back pays nothing; a full one pays them.
        deadlines.held_back_writes(t0, 0, false);
        assert!(deadlines.held_back.is_owed());
        deadlines.held_back_writes(t0, 0, true);
        assert!(!deadlines.held_back.is_owed());
    }

    #[test]
    fn a_burst_lasts_while_arrivals_are_less_than_quiet_apart() {
        let t0 = Instant::now();
        let mut burst = Burst::default();
        assert!(!burst.bursting(t0));
        assert_eq!(burst.quiet_at(t0), t0);
        burst.arrived(t0);
        assert!(burst.bursting(t0 + Burst::QUIET / 2));
        assert!(!burst.bursting(t0 + Burst::QUIET));
        assert_eq!(burst.quiet_at(t0 + Burst::QUIET / 2), t0 + Burst::QUIET);
    }

    #[test]
    fn owed_work_falls_due_when_quiet_and_at_most_the_limit_after_it_was_first_owed() {
        let t0 = Instant::now();
        let mut owed = Owed::default();
        assert!(!owed.is_owed() && owed.due().is_none());
        owed.owe(t0, t0 + Burst::QUIET);
        assert_eq!(owed.due(), Some(t0 + Burst::QUIET));
        assert!(!owed.is_due(t0) && owed.is_due(t0 + Burst::QUIET));
        // Owed again and again: the first time caps it.
        let later = t0 + Burst::LIMIT - Burst::QUIET / 2;
        owed.owe(later, later + Burst::QUIET);
        assert_eq!(owed.due(), Some(t0 + Burst::LIMIT));
        assert!(!owed.overdue(later) && owed.overdue(t0 + Burst::LIMIT));
        owed.paid();
        assert!(!owed.is_owed() && !owed.is_due(t0 + Burst::LIMIT));
    }

    #[test]
    fn settling_waits_longer_each_time_the_tree_is_still_unsettled_and_starts_again_after() {
        let t0 = Instant::now();
        let root = CgroupPath::new("kubepods/pod1").unwrap();
        let mut settling = Settling::default();
        settling.wait_for(vec![root.clone()], true, t0);
        assert!(!settling.is_empty());
        assert_eq!(settling.take_due(t0), None);
        let first = t0 + Burst::SETTLE_DELAYS[0];
        assert_eq!(settling.take_due(first), Some(vec![root.clone()]));
        assert_eq!(settling.take_due(first), None, "taken once");
        settling.wait_for(vec![root.clone()], true, first);
        let deadlines = Deadlines {
            settling,
            ..Deadlines::default()
        };
        assert_eq!(deadlines.next(), Some(first + Burst::SETTLE_DELAYS[1]));
        let mut settling = deadlines.settling;
        settling.wait_for(Vec::new(), false, first);
        assert!(settling.is_empty() && settling.at.is_none() && settling.tries == 0);
        // Out of delays: nothing is due until the next event or tick.
        for _ in 0..Burst::SETTLE_DELAYS.len() {
            settling.wait_for(vec![root.clone()], true, t0);
            assert!(settling.take_due(t0 + Duration::from_secs(10)).is_some());
        }
        settling.wait_for(vec![root], true, t0);
        assert_eq!(settling.take_due(t0 + Duration::from_secs(10)), None);
    }

    #[test]
    fn projections_are_brought_up_to_date_at_most_every_interval() {
        let t0 = Instant::now();
        let mut projection = Projection::default();
        assert_eq!(projection.due_at(t0), None);
        assert!(!projection.start(t0));
        projection.due = true;
        assert_eq!(projection.due_at(t0), Some(t0));
        assert!(projection.start(t0));
        assert!(!projection.start(t0), "not owed any more");
        projection.due = true;
        let next = t0 + Projection::INTERVAL;
        assert_eq!(projection.due_at(t0), Some(next));
        assert!(!projection.start(next - Duration::from_millis(1)));
        assert!(projection.start(next));
        assert_eq!(projection.at, Some(next));
    }

    #[test]
    fn the_next_deadline_is_the_earliest_of_all_timers() {
        let t0 = Instant::now();
        let mut deadlines = Deadlines::default();
        assert_eq!(deadlines.next(), None);
        deadlines.fight = Some(t0 + Duration::from_secs(1));
        deadlines.settings = Some(t0 + Duration::from_millis(5));
        deadlines.full_pass.owe(t0, t0 + Burst::QUIET);
        assert_eq!(deadlines.next(), Some(t0 + Duration::from_millis(5)));
        deadlines.settings = None;
        assert_eq!(deadlines.next(), Some(t0 + Burst::QUIET));
    }
}
