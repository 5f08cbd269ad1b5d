//! The reconcile thread as a handle (the shape of Firecracker's vCPU handles): the controller
//! sends it typed requests ([`ReconcileRequest`]) and takes its ticks ([`ReconcileTick`]) over
//! two bounded channels; nothing else is shared.
//!
//! Every period the thread either reads each cgroup's `cpuset.cpus` once and compares it with
//! its last full scan (a *quiet tick*), or scans the whole tree: when the controller said the
//! model changed since that scan ([`ReconcileRequest::ModelChanged`]), on a difference, every
//! [`FULL_SCAN_EVERY`]th tick, and every tick without inotify.

use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::ReconcileScan;
use crate::cgroupfs::{CpusetSnapshot, Scanner};
use crate::logging::error_chain;

/// Every how many ticks the reconcile thread scans the whole tree even when the model has
/// not moved (new directories or CPU settings that inotify failed to report).
pub(super) const FULL_SCAN_EVERY: u64 = 6;

/// What the controller tells the reconcile thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReconcileRequest {
    /// The model changed (read or written values, cgroups coming and going): the next tick
    /// scans the whole tree.
    ModelChanged,
    /// Stop (after the scan under way, if any).
    Stop,
}

/// What the reconcile thread sends each tick.
#[derive(Debug)]
pub(super) enum ReconcileTick {
    /// A full scan, to merge.
    Full(ReconcileScan),
    /// Every cgroup's `cpuset.cpus` read as at the last full scan, and the model has not
    /// changed since: nothing to merge.
    Unchanged { started: Instant },
}

/// The controller's handle on the reconcile thread.
#[derive(Debug)]
pub(super) struct Reconciler {
    requests: Sender<ReconcileRequest>,
    ticks: Receiver<ReconcileTick>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Reconciler {
    /// Starts the thread; `every_tick_full` (no inotify) makes every tick a full scan.
    pub(super) fn spawn(scanner: Scanner, period: Duration, every_tick_full: bool) -> Reconciler {
        // One request waiting is enough: a second `ModelChanged` says nothing more.
        let (requests, requests_rx) = bounded::<ReconcileRequest>(1);
        // A full channel means the controller has not taken the last tick yet: this one
        // collapses into it.
        let (ticks_tx, ticks) = bounded::<ReconcileTick>(1);
        let state = ReconcileLoop {
            scanner,
            period,
            every_tick_full,
            failing: false,
            last: None,
            tick: 0,
            model_changed: true,
        };
        let thread = thread::Builder::new()
            .name("cpusetd-reconcile".into())
            .spawn(move || state.run(&requests_rx, &ticks_tx))
            .expect("spawn the reconcile thread");
        Reconciler {
            requests,
            ticks,
            thread: Some(thread),
        }
    }

    /// The thread's ticks, for the controller's `select!`.
    pub(super) fn ticks(&self) -> &Receiver<ReconcileTick> {
        &self.ticks
    }

    /// The model changed: the next tick scans the whole tree. Never waits.
    pub(super) fn model_changed(&self) {
        let _ = self.requests.try_send(ReconcileRequest::ModelChanged);
    }

    /// Stops the thread and waits for it (a scan under way ends first).
    pub(super) fn stop(mut self) {
        let _ = self.requests.send(ReconcileRequest::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The reconcile thread's own state.
struct ReconcileLoop {
    scanner: Scanner,
    period: Duration,
    every_tick_full: bool,
    /// A scan that keeps failing (the kubepods cgroup removed) is reported once, and again
    /// only after a scan worked.
    failing: bool,
    /// The cpusets of the last full scan.
    last: Option<CpusetSnapshot>,
    tick: u64,
    /// The controller said the model changed since the last full scan started.
    model_changed: bool,
}

impl ReconcileLoop {
    fn run(mut self, requests: &Receiver<ReconcileRequest>, ticks: &Sender<ReconcileTick>) {
        let mut next = Instant::now() + self.period;
        loop {
            match requests.recv_deadline(next) {
                Ok(ReconcileRequest::ModelChanged) => {
                    self.model_changed = true;
                    continue;
                }
                Ok(ReconcileRequest::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Some(tick) = self.tick() {
                let _ = ticks.try_send(tick);
            }
            next = Instant::now() + self.period;
        }
    }

    /// One tick: a quiet one when nothing moved, else a full scan (`None` when it failed).
    fn tick(&mut self) -> Option<ReconcileTick> {
        self.tick += 1;
        let started = Instant::now();
        if let Some(snapshot) = &self.last {
            // Without inotify nothing else sees new cgroups: every tick scans.
            if !self.every_tick_full
                && !self.model_changed
                && self.tick % FULL_SCAN_EVERY != 0
                && self.scanner.cpusets_unchanged(snapshot)
            {
                return Some(ReconcileTick::Unchanged { started });
            }
        }
        // Changes said from now on are newer than this scan.
        self.model_changed = false;
        match self.scanner.scan() {
            Ok(scan) => {
                if std::mem::take(&mut self.failing) {
                    log::info!("reconcile scans work again");
                }
                self.last = Some(CpusetSnapshot::of(&scan));
                Some(ReconcileTick::Full(ReconcileScan { started, scan }))
            }
            Err(e) => {
                self.last = None;
                if !self.failing {
                    log::error!(
                        "reconcile scan: {} (not repeated while it keeps failing)",
                        error_chain(&e)
                    );
                }
                self.failing = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::cgroupfs::{CgroupDriver, CgroupLayout, CgroupPath, CgroupVersion, Hierarchy};

    fn next_tick(reconciler: &Reconciler) -> ReconcileTick {
        reconciler
            .ticks()
            .recv_timeout(Duration::from_secs(10))
            .expect("a tick")
    }

    fn is_full(tick: &ReconcileTick) -> bool {
        matches!(tick, ReconcileTick::Full(_))
    }

    /// A tick scans the whole tree at first, when told the model changed, and when a cpuset
    /// differs from its last scan; otherwise it is quiet. `stop` ends the thread.
    #[test]
    fn a_tick_scans_in_full_when_told_the_model_changed_or_a_cpuset_moved() {
        let dir = tempfile::tempdir().unwrap();
        let cpuset = dir.path().join("cpuset");
        for rel in ["", "kubepods", "kubepods/pod"] {
            fs::create_dir_all(cpuset.join(rel)).unwrap();
            fs::write(cpuset.join(rel).join("cpuset.cpus"), "0-3\n").unwrap();
            fs::write(cpuset.join(rel).join("cpuset.mems"), "0\n").unwrap();
        }
        fs::create_dir_all(dir.path().join("cpu")).unwrap();
        let layout = CgroupLayout {
            version: CgroupVersion::V1,
            driver: CgroupDriver::Cgroupfs,
            cpuset_root: cpuset.clone(),
            cpu_root: dir.path().join("cpu"),
            kubepods: CgroupPath::new("kubepods").unwrap(),
        };
        let scanner = Scanner::new(Hierarchy::open(&layout).unwrap(), layout.kubepods.clone());
        let reconciler = Reconciler::spawn(scanner, Duration::from_millis(100), false);
        assert!(is_full(&next_tick(&reconciler)), "the first tick scans");
        let mut quiet = 0;
        // A quiet tick comes before the sixth (which scans in full anyway).
        for _ in 0..4 {
            if !is_full(&next_tick(&reconciler)) {
                quiet += 1;
                break;
            }
        }
        assert_eq!(quiet, 1, "no quiet tick while nothing moved");
        reconciler.model_changed();
        assert!(is_full(&next_tick(&reconciler)), "told the model changed");
        fs::write(cpuset.join("kubepods/pod/cpuset.cpus"), "1\n").unwrap();
        assert!(is_full(&next_tick(&reconciler)), "a cpuset moved");
        reconciler.stop();
    }
}
