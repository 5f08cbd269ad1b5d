//! The persist thread as a handle (the shape of Firecracker's vCPU handles): the controller
//! sends it typed requests ([`PersistRequest`]) and takes its typed replies ([`PersistReply`])
//! over two bounded channels; nothing else is shared. Each request carries a snapshot of the
//! state taken on the controller thread (so each is consistent); the file writes and `fsync`s
//! happen on `cpusetd-persist`, off the event path: cgroup writes never wait for the disk.
//!
//! One write is in flight at a time. A snapshot taken while one is written waits on the
//! controller's side, and a newer one replaces it (each is the whole state); a pending
//! checkpoint is never dropped for a metrics-only snapshot. The first write (before
//! `READY=1`) and the last (at shutdown, after the thread is joined) run on the caller.
//!
//! The controller asks for a write once per burst ([`Persister::owe`], then
//! [`Persister::save_owed`] when no event waits), not once per pass: a burst of events and the
//! passes that follow it make one snapshot. The live tree stays the truth after a crash (it is
//! adopted at start), and the host changes' originals are written ahead by the controller
//! itself (`checkpoint::host`), so a later checkpoint loses nothing a kill could need.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver, Sender};

use super::{http, metrics, Controller};
use crate::allocator::PolicyOptions;
use crate::checkpoint::{self, Checkpoint, Policy, QuotaLift, StateLock};
use crate::logging::error_chain;

/// A burst that goes on this long (events keep coming) is saved anyway, then again after the
/// same time: the checkpoint and the metrics lag the controller by at most this much.
pub(super) const BURST_SAVE_LIMIT: Duration = Duration::from_millis(200);

/// What the controller asks of the persist thread.
#[derive(Debug)]
pub(super) enum PersistRequest {
    /// Write this snapshot, then reply [`PersistReply::Written`].
    Write(Box<Snapshot>),
    /// Stop after the writes asked before, and give back the writer (for the last write).
    Stop,
}

/// What the persist thread answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PersistReply {
    /// A snapshot was written (or its failure said): the thread takes the next.
    Written,
}

/// The state to write, taken on the controller thread.
#[derive(Debug)]
pub(super) struct Snapshot {
    /// `None`: unchanged since the last checkpoint asked for.
    checkpoint: Option<Checkpoint>,
    metrics: Arc<str>,
    /// The last reconcile (Unix ms), for [`checkpoint::LAST_RECONCILE_FILE`].
    last_reconcile: Option<u64>,
}

impl Snapshot {
    /// This snapshot replaced by `newer`, keeping a checkpoint `newer` does not carry.
    fn then(self, newer: Snapshot) -> Snapshot {
        Snapshot {
            checkpoint: newer.checkpoint.or(self.checkpoint),
            ..newer
        }
    }
}

/// The controller's handle on the persist thread.
#[derive(Debug)]
pub(super) struct Persister {
    requests: Sender<PersistRequest>,
    replies: Receiver<PersistReply>,
    thread: Option<thread::JoinHandle<PersistWriter>>,
    /// Taken while a write was in flight; sent when it is written (newest wins).
    queued: Option<Snapshot>,
    in_flight: bool,
    /// A save owed by the current burst: whether the checkpoint changed, and since when.
    owed: Option<(bool, Instant)>,
    options: PolicyOptions,
    /// What `--metrics-bind-address` serves: published here, on the controller thread, as
    /// soon as a snapshot is rendered (not after the persist thread's `fsync`s).
    served: Arc<http::MetricsSnapshot>,
    /// Where the PodResources server reads the controller's view (when it serves).
    published: Option<Arc<crate::podresources::Published>>,
    /// Kept for the last write when the thread is gone.
    state_dir: PathBuf,
    metrics_file: Option<PathBuf>,
}

/// Where the snapshots go, and what a caller needs to publish them.
#[derive(Debug)]
pub(super) struct PersistTargets {
    pub state_dir: PathBuf,
    pub options: PolicyOptions,
    pub metrics_file: Option<PathBuf>,
    pub served: Arc<http::MetricsSnapshot>,
    pub published: Option<Arc<crate::podresources::Published>>,
}

impl Persister {
    /// Writes the first snapshot of `controller` on the calling thread (before `READY=1`),
    /// then starts the thread with the writer.
    pub(super) fn start(targets: PersistTargets, controller: &Controller) -> Persister {
        let (requests, requests_rx) = bounded::<PersistRequest>(1);
        let (replies_tx, replies) = bounded::<PersistReply>(1);
        let mut persister = Persister {
            requests,
            replies,
            thread: None,
            queued: None,
            in_flight: false,
            owed: None,
            options: targets.options,
            served: targets.served,
            published: targets.published,
            state_dir: targets.state_dir.clone(),
            metrics_file: targets.metrics_file.clone(),
        };
        let mut writer = PersistWriter::new(targets.state_dir, targets.metrics_file);
        writer.write(&persister.snapshot(controller, true));
        let thread = thread::Builder::new()
            .name("cpusetd-persist".into())
            .spawn(move || persist_loop(writer, &requests_rx, &replies_tx))
            .expect("spawn the persist thread");
        persister.thread = Some(thread);
        persister
    }

    /// The thread's replies, for the controller's `select!`.
    pub(super) fn replies(&self) -> &Receiver<PersistReply> {
        &self.replies
    }

    /// A reply came: the thread is free, the snapshot waiting (if any) goes.
    pub(super) fn on_reply(&mut self, reply: PersistReply) {
        match reply {
            PersistReply::Written => self.in_flight = false,
        }
        self.send_queued();
    }

    /// The current burst owes a save (with the checkpoint when `checkpoint_changed`).
    pub(super) fn owe(&mut self, checkpoint_changed: bool) {
        let since = self.owed.map_or_else(Instant::now, |(_, since)| since);
        let changed = self.owed.is_some_and(|(c, _)| c) | checkpoint_changed;
        self.owed = Some((changed, since));
    }

    /// Makes the save the burst owes, once it is over (`burst_over`: no event waits) or has
    /// lasted [`BURST_SAVE_LIMIT`]. Whether a snapshot was taken.
    pub(super) fn save_owed(&mut self, controller: &Controller, burst_over: bool) -> bool {
        let Some((checkpoint_changed, since)) = self.owed else {
            return false;
        };
        if !burst_over && since.elapsed() < BURST_SAVE_LIMIT {
            return false;
        }
        self.owed = None;
        let snapshot = self.snapshot(controller, checkpoint_changed);
        self.queued = Some(match self.queued.take() {
            Some(older) => older.then(snapshot),
            None => snapshot,
        });
        self.send_queued();
        true
    }

    fn send_queued(&mut self) {
        if self.in_flight {
            return;
        }
        let Some(snapshot) = self.queued.take() else {
            return;
        };
        // Nothing is in flight, so the channel (one place) is empty: this never waits.
        match self
            .requests
            .try_send(PersistRequest::Write(Box::new(snapshot)))
        {
            Ok(()) => self.in_flight = true,
            Err(e) => {
                // The thread is gone (the controller loop stops on its replies' channel);
                // the last write at shutdown runs on the caller.
                let PersistRequest::Write(snapshot) = e.into_inner() else {
                    unreachable!("a write was sent")
                };
                self.queued = Some(*snapshot);
            }
        }
    }

    /// Stops the thread (after the writes it was asked for) and writes the last snapshot of
    /// `controller`, with its checkpoint, on the calling thread.
    pub(super) fn finish(mut self, controller: &Controller) {
        let writer = self.thread.take().and_then(|thread| {
            let _ = self.requests.send(PersistRequest::Stop);
            thread.join().ok()
        });
        let mut writer = writer.unwrap_or_else(|| {
            PersistWriter::new(self.state_dir.clone(), self.metrics_file.clone())
        });
        writer.write(&self.snapshot(controller, true));
    }

    /// Takes a snapshot of `controller` and publishes its metrics and PodResources view.
    fn snapshot(&self, controller: &Controller, checkpoint_changed: bool) -> Snapshot {
        let last_reconcile = controller
            .metrics
            .last_reconcile
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64);
        let checkpoint =
            checkpoint_changed.then(|| checkpoint_of(controller, self.options, last_reconcile));
        let metrics: Arc<str> = controller.metrics.render().into();
        self.served.publish(Arc::clone(&metrics));
        if let Some(published) = &self.published {
            published.publish(controller.pod_resources());
        }
        Snapshot {
            checkpoint,
            metrics,
            last_reconcile,
        }
    }
}

/// The checkpoint of `controller` now.
fn checkpoint_of(
    controller: &Controller,
    options: PolicyOptions,
    last_reconcile: Option<u64>,
) -> Checkpoint {
    Checkpoint {
        policy: if controller.policy().is_some() {
            Policy::Static
        } else {
            Policy::None
        },
        options,
        reserved: controller
            .policy()
            .map(|p| p.reserved().clone())
            .unwrap_or_default(),
        online: controller.topology().all_cpus().clone(),
        shared_pool: controller.shared_pool().cloned().unwrap_or_default(),
        assignments: controller.assignments().clone(),
        quota_lifted: controller
            .quota_lifted()
            .iter()
            .map(|(cgroup, original)| QuotaLift {
                cgroup: cgroup.to_string(),
                original: original.clone(),
            })
            .collect(),
        effects: controller.effects_saved(),
        refused: controller.refusals().clone(),
        last_reconcile_unix_ms: last_reconcile,
    }
}

/// The persist thread: writes each snapshot it is sent and says so, until told to stop (or the
/// controller is gone); gives its writer back.
fn persist_loop(
    mut writer: PersistWriter,
    requests: &Receiver<PersistRequest>,
    replies: &Sender<PersistReply>,
) -> PersistWriter {
    for request in requests {
        match request {
            PersistRequest::Write(snapshot) => {
                writer.write(&snapshot);
                if replies.send(PersistReply::Written).is_err() {
                    break;
                }
            }
            PersistRequest::Stop => break,
        }
    }
    writer
}

/// Writes snapshots, and remembers between writes what it said and did: failures said once,
/// the last reconcile written, a lock taken again.
#[derive(Debug)]
struct PersistWriter {
    state_dir: PathBuf,
    metrics_file: Option<PathBuf>,
    failing: bool,
    metrics_failing: bool,
    reconcile_written: Option<u64>,
    /// The lock taken again after the state directory was removed (see [`relock`]).
    relocked: Option<StateLock>,
}

impl PersistWriter {
    fn new(state_dir: PathBuf, metrics_file: Option<PathBuf>) -> PersistWriter {
        PersistWriter {
            state_dir,
            metrics_file,
            failing: false,
            metrics_failing: false,
            reconcile_written: None,
            relocked: None,
        }
    }

    fn write(&mut self, snapshot: &Snapshot) {
        if let Some(cp) = &snapshot.checkpoint {
            self.write_checkpoint(cp);
        }
        // Before the metrics file, so what that says `status` already reads.
        if let Some(ms) = snapshot
            .last_reconcile
            .filter(|ms| self.reconcile_written != Some(*ms))
        {
            match checkpoint::write_last_reconcile(&self.state_dir, ms) {
                Ok(()) => self.reconcile_written = Some(ms),
                // The checkpoint's failures are said; this file only keeps `status` current.
                Err(e) => log::debug!(
                    "cannot write {}/{}: {e}",
                    self.state_dir.display(),
                    checkpoint::LAST_RECONCILE_FILE
                ),
            }
        }
        if let Some(path) = &self.metrics_file {
            // Said when it starts failing and when it works again, not on every save.
            match metrics::write_text(path, &snapshot.metrics) {
                Ok(()) if self.metrics_failing => {
                    self.metrics_failing = false;
                    log::info!("metrics are written to {} again", path.display());
                }
                Ok(()) => {}
                Err(e) if !self.metrics_failing => {
                    self.metrics_failing = true;
                    log::warn!("cannot write metrics to {}: {e}", path.display());
                }
                Err(e) => log::debug!("cannot write metrics to {}: {e}", path.display()),
            }
        }
    }

    fn write_checkpoint(&mut self, cp: &Checkpoint) {
        match checkpoint::save(&self.state_dir, cp) {
            Ok(()) => {
                if self.failing {
                    log::info!("checkpoint written again to {}", self.state_dir.display());
                }
                self.failing = false;
                relock(&self.state_dir, &mut self.relocked);
            }
            Err(e) => {
                if !self.failing {
                    log::error!(
                        "{} (pins stay in force; retried after the next change)",
                        error_chain(&e)
                    );
                }
                self.failing = true;
            }
        }
    }
}

/// After the state directory was removed while the agent ran (and made again by the checkpoint
/// write), its lock file is gone with it: taken again, so a second agent is still refused and
/// `status` and `health` still see this one. (Also when the directory could take no lock file
/// at start and takes files now: the pid is then recorded.)
fn relock(state_dir: &Path, relocked: &mut Option<StateLock>) {
    if state_dir.join(checkpoint::LOCK_FILE).exists() {
        return;
    }
    match StateLock::acquire(state_dir) {
        Ok(lock) => {
            log::warn!(
                "{} has no lock file (the state directory was removed, or could not take one \
                 when the agent started): the lock is taken on a new one",
                state_dir.display()
            );
            *relocked = Some(lock);
        }
        Err(e) => log::warn!("cannot lock the state directory again: {}", error_chain(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_checkpoint(last_reconcile_unix_ms: Option<u64>) -> Checkpoint {
        Checkpoint {
            policy: Policy::None,
            options: PolicyOptions::default(),
            reserved: Default::default(),
            online: Default::default(),
            shared_pool: Default::default(),
            assignments: Default::default(),
            quota_lifted: Vec::new(),
            effects: Default::default(),
            refused: Default::default(),
            last_reconcile_unix_ms,
        }
    }

    fn snapshot(checkpoint: Option<Checkpoint>, metrics: &str) -> Snapshot {
        Snapshot {
            checkpoint,
            metrics: metrics.into(),
            last_reconcile: None,
        }
    }

    /// A newer snapshot wins, but a metrics-only one never drops a checkpoint still waiting.
    #[test]
    fn a_newer_snapshot_keeps_a_checkpoint_still_waiting() {
        let older = snapshot(Some(empty_checkpoint(None)), "a");
        let merged = older.then(snapshot(None, "b"));
        assert_eq!(&*merged.metrics, "b");
        assert!(merged.checkpoint.is_some());
        let merged = merged.then(snapshot(Some(empty_checkpoint(Some(7))), "c"));
        assert_eq!(merged.checkpoint.unwrap().last_reconcile_unix_ms, Some(7));
    }

    /// The thread writes what it is sent, replies once per write, and gives its writer back
    /// when told to stop.
    #[test]
    fn the_thread_replies_per_write_and_gives_its_writer_back() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("m.prom");
        let writer = PersistWriter::new(dir.path().to_path_buf(), Some(metrics.clone()));
        let (requests, requests_rx) = bounded(1);
        let (replies_tx, replies) = bounded(1);
        let thread = thread::spawn(move || persist_loop(writer, &requests_rx, &replies_tx));
        let write =
            PersistRequest::Write(Box::new(snapshot(Some(empty_checkpoint(None)), "x 1\n")));
        requests.send(write).unwrap();
        assert_eq!(replies.recv().unwrap(), PersistReply::Written);
        assert!(matches!(
            checkpoint::load(dir.path()),
            checkpoint::LoadOutcome::Loaded(_)
        ));
        assert_eq!(std::fs::read_to_string(&metrics).unwrap(), "x 1\n");
        requests.send(PersistRequest::Stop).unwrap();
        let writer = thread.join().unwrap();
        assert_eq!(writer.metrics_file.as_deref(), Some(metrics.as_path()));
        assert!(!writer.failing);
    }

    fn node_and_controller() -> (tempfile::TempDir, crate::kubesim::FakeNode, Controller) {
        use crate::cgroupfs::CgroupVersion;
        use crate::cpuset::CpuSet;
        let dir = tempfile::tempdir().unwrap();
        let node = crate::kubesim::FakeNode::create(
            &dir.path().join("cg"),
            CgroupVersion::V1,
            CpuSet::parse("0-7").unwrap(),
            CpuSet::parse("0").unwrap(),
            &dir.path().join("runtime"),
        )
        .unwrap();
        let sysfs = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/sysfs/1s-4c-ht");
        let flags = [
            "--cgroup-root",
            &node.cgroup_root().display().to_string(),
            "--runtime-config-path",
            &node.runtime_template(),
            "--sysfs-root",
            &sysfs.display().to_string(),
            "--proc-root",
            &sysfs.join("proc").display().to_string(),
            "--reserved-cpus",
            "0",
            "--state-dir",
            &dir.path().join("controller-state").display().to_string(),
        ]
        .map(String::from);
        let mut controller = crate::cli::controller(&flags).unwrap();
        controller.full_scan().unwrap();
        controller.pass(Instant::now());
        (dir, node, controller)
    }

    fn pins_saved(state_dir: &Path) -> usize {
        match checkpoint::load(state_dir) {
            checkpoint::LoadOutcome::Loaded(cp) => cp.assignments.len(),
            other => panic!("no checkpoint: {other:?}"),
        }
    }

    /// The first write is made by `start` and the last by `finish`, both on the caller (no
    /// wait for the thread); in between, a burst of passes makes one write, after the burst.
    #[test]
    fn a_burst_is_saved_once_after_it_and_the_first_and_last_saves_run_on_the_caller() {
        use crate::kubesim::{ContainerSpec, PodSpec, Qos};
        let (dir, node, mut controller) = node_and_controller();
        let state_dir = dir.path().join("state");
        let targets = PersistTargets {
            state_dir: state_dir.clone(),
            options: PolicyOptions::default(),
            metrics_file: None,
            served: Arc::default(),
            published: None,
        };
        let mut persister = Persister::start(targets, &controller);
        assert_eq!(pins_saved(&state_dir), 0, "written by start");
        // A burst: three pods, a pass each; the save is owed until no event waits.
        let mut changed = Vec::new();
        for name in ["a", "b", "c"] {
            let pod = PodSpec::one(name, Qos::Guaranteed, ContainerSpec::guaranteed(name, 1000));
            node.start_pod(&pod).unwrap();
            controller.full_scan().unwrap();
            changed.push(controller.pass(Instant::now()).assignments_changed);
        }
        for checkpoint_changed in changed {
            persister.owe(checkpoint_changed);
            persister.owe(false);
            assert!(!persister.save_owed(&controller, false), "saved mid-burst");
        }
        assert!(persister.save_owed(&controller, true));
        let reply = persister.replies().recv_timeout(Duration::from_secs(10));
        persister.on_reply(reply.unwrap());
        assert_eq!(pins_saved(&state_dir), 3);
        assert!(!persister.save_owed(&controller, true), "nothing owed");
        let more = persister.replies().recv_timeout(Duration::from_millis(300));
        assert!(more.is_err(), "one write for the burst");
        // A burst that goes on is saved at the limit.
        persister.owe(false);
        thread::sleep(BURST_SAVE_LIMIT);
        assert!(persister.save_owed(&controller, false));
        // The last: a fourth pin, written by `finish` itself.
        let pod = PodSpec::one("d", Qos::Guaranteed, ContainerSpec::guaranteed("d", 1000));
        node.start_pod(&pod).unwrap();
        controller.full_scan().unwrap();
        controller.pass(Instant::now());
        persister.finish(&controller);
        assert_eq!(pins_saved(&state_dir), 4);
    }
}
