//! A fight with another writer over a cgroup's `cpuset.cpus`: more than [`FIGHT_DRIFTS`]
//! foreign changes within [`FIGHT_WINDOW`] (a second CPU manager, a tuning daemon). From then
//! on each repair waits a backoff that doubles (from [`FIGHT_BACKOFF_MIN`] to
//! [`FIGHT_BACKOFF_MAX`]) while the writer goes on; [`FIGHT_QUIET`] without a foreign change
//! ends the fight. Kept in the cgroup's record; plain instants, nothing read or written.

use std::time::{Duration, Instant};

use crate::cgroupfs::CgroupPath;

/// More foreign changes of one cgroup's cpuset than this within [`FIGHT_WINDOW`] is a fight.
pub(crate) const FIGHT_DRIFTS: u32 = 10;
pub(crate) const FIGHT_WINDOW: Duration = Duration::from_secs(1);
/// The first wait before repairing a fought-over cgroup, doubling while the fight goes on.
pub(crate) const FIGHT_BACKOFF_MIN: Duration = Duration::from_millis(100);
pub(crate) const FIGHT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// This long without a foreign change ends a fight.
pub(crate) const FIGHT_QUIET: Duration = Duration::from_secs(30);

/// A cgroup whose `cpuset.cpus` someone else keeps changing.
#[derive(Debug, Clone)]
pub(crate) struct Fight {
    window_start: Instant,
    drifts: u32,
    last_drift: Instant,
    /// The current wait between repairs, once it is a fight.
    backoff: Option<Duration>,
    /// No repair before this.
    until: Option<Instant>,
    /// A foreign value waits for its repair.
    pending: bool,
}

/// What to do with a foreign change (see [`Fight::drift`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drift {
    /// Repair it now.
    Repair,
    /// Repair it now: it makes a fight (said once, here), and the repairs back off from now on.
    FightStarts,
    /// Keep the foreign value until then (its repair waits for the backoff).
    Wait(Instant),
}

/// What a fight wants when its timer looks (see [`Fight::resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Long quiet: forget it.
    Forget,
    /// Its backoff ended with a foreign value waiting: read the cgroup again (and repair it).
    Now,
    /// A foreign value waits until then.
    At(Instant),
    /// Nothing waits.
    Nothing,
}

impl Fight {
    /// No fight yet: a first foreign change at `now`.
    pub(crate) fn new(now: Instant) -> Fight {
        Fight {
            window_start: now,
            drifts: 0,
            last_drift: now,
            backoff: None,
            until: None,
            pending: false,
        }
    }

    /// A foreign change of `path`'s `cpuset.cpus` at `now`: repaired now, or after the backoff.
    pub(crate) fn drift(&mut self, path: &CgroupPath, now: Instant) -> Drift {
        if now.saturating_duration_since(self.last_drift) > FIGHT_QUIET {
            *self = Fight::new(now);
        }
        self.last_drift = now;
        if let Some(until) = self.until.filter(|&until| now < until) {
            self.pending = true;
            return Drift::Wait(until);
        }
        self.until = None;
        self.pending = false;
        if let Some(backoff) = self.backoff {
            // Still fighting: repair now, and wait longer before the next repair.
            let next = (backoff * 2).min(FIGHT_BACKOFF_MAX);
            self.backoff = Some(next);
            self.until = Some(now + next);
            return Drift::Repair;
        }
        if !self.count_drift(now) {
            return Drift::Repair;
        }
        log::warn!(
            "cg={path}: its cpuset.cpus was changed by someone else more than {FIGHT_DRIFTS} \
             times within {FIGHT_WINDOW:?} (another cpu manager or tuning daemon?): repaired at \
             most every {FIGHT_BACKOFF_MIN:?} to {FIGHT_BACKOFF_MAX:?} while this goes on; find \
             the other writer and stop it"
        );
        Drift::FightStarts
    }

    /// Counts a foreign change to be repaired now, in the current [`FIGHT_WINDOW`]; whether it
    /// makes a fight (the repairs back off from now on).
    fn count_drift(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.window_start) > FIGHT_WINDOW {
            self.window_start = now;
            self.drifts = 0;
        }
        self.drifts += 1;
        if self.drifts <= FIGHT_DRIFTS {
            return false;
        }
        self.backoff = Some(FIGHT_BACKOFF_MIN);
        self.until = Some(now + FIGHT_BACKOFF_MIN);
        true
    }

    /// What the fight wants at `now` (a waiting repair due now is taken: no longer pending).
    pub(crate) fn resume(&mut self, now: Instant) -> Resume {
        if !self.pending && now.saturating_duration_since(self.last_drift) > FIGHT_QUIET {
            Resume::Forget
        } else if self.pending && self.until.is_some_and(|u| u <= now) {
            self.pending = false;
            Resume::Now
        } else if let Some(until) = self.until.filter(|_| self.pending) {
            Resume::At(until)
        } else {
            Resume::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fight_backs_off_doubling_and_ends_after_a_quiet_while() {
        let path = CgroupPath::new("kubepods/pod1").unwrap();
        let t0 = Instant::now();
        let mut fight = Fight::new(t0);
        let ms = Duration::from_millis;
        for i in 0..FIGHT_DRIFTS {
            assert_eq!(fight.drift(&path, t0 + ms(i.into())), Drift::Repair);
        }
        let start = t0 + ms(20);
        assert_eq!(fight.drift(&path, start), Drift::FightStarts);
        let until = start + FIGHT_BACKOFF_MIN;
        assert_eq!(fight.drift(&path, start + ms(1)), Drift::Wait(until));
        assert_eq!(fight.resume(start + ms(2)), Resume::At(until));
        assert_eq!(fight.resume(until), Resume::Now);
        assert_eq!(fight.resume(until), Resume::Nothing, "taken once");
        // Still fighting: repaired, and the next wait is twice as long.
        assert_eq!(fight.drift(&path, until), Drift::Repair);
        let next = until + FIGHT_BACKOFF_MIN * 2;
        assert_eq!(fight.drift(&path, until + ms(1)), Drift::Wait(next));
        assert_eq!(fight.resume(next), Resume::Now);
        let quiet = next + FIGHT_QUIET + ms(1);
        assert_eq!(fight.resume(quiet), Resume::Forget);
        // A foreign change after a quiet while starts counting again.
        assert_eq!(fight.drift(&path, quiet), Drift::Repair);
    }

    #[test]
    fn changes_spread_wider_than_the_window_are_no_fight() {
        let path = CgroupPath::new("kubepods/pod1").unwrap();
        let t0 = Instant::now();
        let mut fight = Fight::new(t0);
        for i in 0..3 * FIGHT_DRIFTS {
            let at = t0 + (FIGHT_WINDOW / 4) * i;
            assert_eq!(fight.drift(&path, at), Drift::Repair, "change {i}");
        }
    }
}
