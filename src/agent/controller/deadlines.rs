//! Every timer of the controller, in one place: the agent's loop sleeps until [`Deadlines::next`]
//! (or an event), then [`Controller::on_deadlines`] does what is due. How the controller paces
//! itself through a burst of arrivals is [`Burst`]'s.

use std::time::{Duration, Instant};

use super::Controller;
use crate::cgroupfs::CgroupPath;

/// A burst of new cgroups (pods starting one after the other), and the constants that pace
/// the controller through one: while new cgroups keep arriving less than [`Burst::QUIET`]
/// apart, a pass makes only its urgent writes (exclusive pins, drift repairs) and holds back
/// the rest (the shared pool's rewrites, an incremental pass's full pass: [`Owed`]), so a burst
/// of pods does not rewrite every shared cgroup once per pod; held back for at most
/// [`Burst::LIMIT`], then [`Burst::MIN_PROGRESS`] writes a pass before a new arrival may go
/// first. A narrowing that waits for new children to be set up is planned again after each of
/// [`Burst::SETTLE_DELAYS`] ([`Settling`]).
#[derive(Debug, Default)]
pub(super) struct Burst {
    /// When the last cgroup new to the model (after the first pass) was seen.
    last_arrival: Option<Instant>,
}

impl Burst {
    /// Arrivals less than this apart are one burst.
    pub(super) const QUIET: Duration = Duration::from_millis(20);
    /// Writes are held back for at most this long. (kubelet leaves other containers' cpusets
    /// to its reconcile loop, 10 s by default.)
    pub(super) const LIMIT: Duration = Duration::from_millis(200);
    /// Held-back writes a pass makes before it may be preempted, once they are overdue.
    pub(super) const MIN_PROGRESS: usize = 32;
    /// How long a cgroup's narrowing waits, again and again, for runtimes to set up its new
    /// children (to copy its cpuset into them: a read and a write, microseconds apart unless
    /// the runtime is descheduled). After the last, the next event or reconcile tick tries
    /// again.
    pub(super) const SETTLE_DELAYS: [Duration; 6] = [
        Duration::from_millis(5),
        Duration::from_millis(20),
        Duration::from_millis(50),
        Duration::from_millis(200),
        Duration::from_millis(500),
        Duration::from_millis(1000),
    ];

    /// A cgroup new to the model arrived at `now`.
    pub(super) fn arrived(&mut self, now: Instant) {
        self.last_arrival = Some(now);
    }

    /// New cgroups are arriving: the last less than [`Burst::QUIET`] before `now`.
    pub(super) fn bursting(&self, now: Instant) -> bool {
        self.last_arrival
            .is_some_and(|t| now.saturating_duration_since(t) < Burst::QUIET)
    }

    /// When the burst is over if nothing else arrives (`now` when none came).
    pub(super) fn quiet_at(&self, now: Instant) -> Instant {
        self.last_arrival.map_or(now, |t| t + Burst::QUIET)
    }
}

/// Work owed for later and coalesced: due when things have been quiet a while
/// ([`Burst::QUIET`]), and at most [`Burst::LIMIT`] after it was first owed.
#[derive(Debug, Default)]
pub(super) struct Owed {
    since: Option<Instant>,
    due: Option<Instant>,
}

impl Owed {
    /// Owes the work (again) at `now`: due at `quiet` (the end of the current quiet wait), or
    /// at the limit if that comes first.
    pub(super) fn owe(&mut self, now: Instant, quiet: Instant) {
        let since = *self.since.get_or_insert(now);
        self.due = Some(quiet.min(since + Burst::LIMIT));
    }

    /// The work was done: nothing is owed.
    pub(super) fn paid(&mut self) {
        *self = Owed::default();
    }

    /// Something is owed (its due time may have been taken already).
    pub(super) fn is_owed(&self) -> bool {
        self.since.is_some()
    }

    /// It has waited for [`Burst::LIMIT`]: it must make progress now.
    pub(super) fn overdue(&self, now: Instant) -> bool {
        self.since
            .is_some_and(|t| now.saturating_duration_since(t) >= Burst::LIMIT)
    }

    pub(super) fn due(&self) -> Option<Instant> {
        self.due
    }

    pub(super) fn is_due(&self, now: Instant) -> bool {
        self.due.is_some_and(|t| t <= now)
    }
}

/// Cgroups whose narrowing waits for runtimes to set up their new children: planned again after
/// each of [`Burst::SETTLE_DELAYS`] in turn while the tree stays unsettled.
#[derive(Debug, Default)]
pub(super) struct Settling {
    roots: Vec<CgroupPath>,
    at: Option<Instant>,
    tries: usize,
}

impl Settling {
    /// After a pass: `roots` wait for their children, and the pass is planned again `later`
    /// (not: the tree settled, and the next wait starts again from the shortest delay).
    pub(super) fn wait_for(&mut self, roots: Vec<CgroupPath>, later: bool, now: Instant) {
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
    pub(super) fn take_due(&mut self, now: Instant) -> Option<Vec<CgroupPath>> {
        if self.at.is_none_or(|t| t > now) {
            return None;
        }
        self.at = None;
        self.tries += 1;
        Some(std::mem::take(&mut self.roots))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}

/// The controller's timers.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    /// Re-read the containers that wait for their CPU settings (see [`super::SETTINGS_RETRY`]).
    pub(super) settings: Option<Instant>,
    /// Plan again the cgroups whose narrowing waits for new children.
    pub(super) settling: Settling,
    /// The writes a full pass held back while new cgroups arrived (the shared pool's rewrites).
    pub(super) held_back: Owed,
    /// The full pass owed after incremental passes changed the shared pool.
    pub(super) full_pass: Owed,
    /// Repair the first fought-over cgroup whose backoff ends (see [`super::drift`]).
    pub(super) fight: Option<Instant>,
    /// The current burst of arrivals (no deadline of its own: it paces the two above).
    pub(super) burst: Burst,
    /// The projection files (see [`Controller::projections_due`]; not among [`Deadlines::next`]:
    /// the agent's loop asks for them on their own).
    pub(super) projection: Projection,
}

/// When the projection files are to be brought up to date.
#[derive(Debug, Default)]
pub(super) struct Projection {
    /// A pass or reconcile ran since they were last brought up to date.
    pub(super) due: bool,
    /// When they were last brought up to date.
    pub(super) at: Option<Instant>,
}

impl Deadlines {
    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
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
}

impl Controller {
    /// When the controller wants to run again without an event (see [`Deadlines`]).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.next()
    }

    /// Does what is due: re-reads the containers still waiting for their CPU settings, the
    /// cgroups whose narrowing waited for new children and the fought-over cgroups whose
    /// backoff ended; owes a pass for the held-back writes or the owed full pass. Returns
    /// whether a pass is needed.
    pub fn on_deadlines(&mut self, now: Instant) -> bool {
        self.deadlines.settings = None;
        let mut changed = false;
        if self.deadlines.held_back.is_due(now) || self.deadlines.full_pass.is_due(now) {
            // Held-back writes, or the shared pool's members after incremental passes: a
            // full pass (after the pins of pods that arrived meanwhile, see `pass`), which
            // pays them or owes them again.
            changed = true;
        }
        if let Some(roots) = self.deadlines.settling.take_due(now) {
            for root in roots {
                self.rescan_subtree(&root, now);
            }
            changed = true;
        }
        changed |= self.resume_fights(now);
        for path in self.model.waiting() {
            match self.parts.scanner.read_cgroup(&path) {
                Some(c) => changed |= self.upsert(c, now),
                None => changed |= self.remove_if_gone(&path),
            }
        }
        changed
    }
}
